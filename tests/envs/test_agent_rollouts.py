"""Agent programs rolled out by the real collector on a tiny Qwen2 (built from a config, a
Qwen2.5 family tokenizer with its real chat template): every turn of every trajectory is
checked against the call its program sent.

For each turn: the ids before it in its segment decode to the chat template's render of that
call's messages and tools (``apply_chat_template``, as vLLM and ``serve-policy`` render a
request), and a segment's first turn's prompt is exactly the tokenization of that render; the
policy was given exactly those ids and the turn's ids are the ids it sampled, verbatim, with
their logprobs. Harnesses that append keep one segment; one that compacts, and sub-agents with
their own contexts, start new ones.
"""

import openai
import pytest

from tests.envs.agent_programs import (SENT, AgentsSDK, Compacting, ParallelSubAgents, SubAgent, ToolLoop, check_turns,
                                       match_runs)
from turnrl.chat.families import family_tokenizer
from turnrl.chat.renderer import ChatRenderer
from turnrl.envs.agent import AgentEnv
from turnrl.models.tiny_checkpoints import build_model
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.sampling import SamplingParams
from turnrl.rollout import RolloutCollector, Task

pytestmark = pytest.mark.slow


class Recorded:
    """A policy whose every prompt and generation is kept (to compare with the trajectories)."""

    def __init__(self, policy) -> None:
        self.policy, self.turns = policy, []

    def generate(self, prompts, params):
        generations = self.policy.generate(prompts, params)
        self.turns += [(list(p), g) for p, g in zip(prompts, generations)]
        return generations

    def clear_cache(self) -> None:
        self.policy.clear_cache()


@pytest.fixture(scope="module")
def tok():
    return family_tokenizer("qwen2_5", ["What is 1 + 2? Use the add tool. Try again. Summary checker"], vocab_size=600)


@pytest.fixture(scope="module")
def policy(tok):
    return TransformersPolicy(build_model("qwen2", tok, hidden=64, layers=2, seed=0), tok, seed=0)


def roll(env_cls, tok, policy, seeds=range(4)):
    """Episodes of ``env_cls`` (4 tasks x 2) from the real collector, with every call the
    programs sent and every prompt and generation of the policy."""
    SENT.clear()
    recorded = Recorded(policy)
    collector = RolloutCollector(lambda: env_cls(tool_parser="hermes"), recorded, ChatRenderer(tok),
                                 max_context_tokens=4096, env_workers=4)
    try:
        trajectories = collector.collect([Task(s) for s in seeds], 2, SamplingParams(max_new_tokens=24))
    finally:
        collector.close()
    assert all(t.termination == "terminated" for t in trajectories), [(t.termination, t.error) for t in trajectories]
    return trajectories, list(SENT.values()), recorded


def segments(tok, trajectories, runs, recorded) -> list[int]:
    """Each trajectory checked against the program run whose calls its turns are (see the
    module docstring); their segment counts."""
    def check(trajectory, calls) -> int:
        assert len(calls) == trajectory.num_turns
        prompts = check_turns(tok, trajectory.token_ids, trajectory.turn_spans, trajectory.segment_starts, calls)
        for prompt, (start, end) in zip(prompts, trajectory.turn_spans):
            sampled, logprobs = trajectory.token_ids[start:end], trajectory.logprobs[start:end]
            assert any(p == prompt and list(g.token_ids) == sampled and list(g.logprobs) == logprobs
                       for p, g in recorded.turns), "a turn is not what the policy sampled from its prompt"
            assert all(trajectory.loss_mask[start:end])
        assert sum(trajectory.loss_mask) == sum(e - s for s, e in trajectory.turn_spans)
        return trajectory.num_segments

    return match_runs(trajectories, runs, check)


def test_a_plain_openai_tool_loop_keeps_one_segment(tok, policy):
    trajectories, runs, recorded = roll(ToolLoop, tok, policy)
    assert segments(tok, trajectories, runs, recorded) == [1] * 8
    assert all(t.num_turns >= 1 for t in trajectories) and any(t.num_turns > 1 for t in trajectories)


def test_an_openai_agents_sdk_agent_with_two_tools(tok, policy):
    trajectories, runs, recorded = roll(AgentsSDK, tok, policy)
    assert segments(tok, trajectories, runs, recorded) == [1] * 8
    first_calls = [calls[0] for calls in runs]
    assert all({t["function"]["name"] for t in tools} == {"add", "multiply"} for _, tools in first_calls)


def test_a_compacting_harness_starts_a_new_segment_at_its_compaction(tok, policy):
    trajectories, runs, recorded = roll(Compacting, tok, policy)
    for trajectory, count in zip(trajectories, segments(tok, trajectories, runs, recorded)):
        assert count == (2 if trajectory.num_turns > 2 else 1)
    assert any(t.num_turns > 2 for t in trajectories)


def test_a_sub_agents_fresh_context_is_a_segment_of_the_same_episode(tok, policy):
    trajectories, runs, recorded = roll(SubAgent, tok, policy)
    assert segments(tok, trajectories, runs, recorded) == [3] * 8  # main, sub-agent, main again
    assert all(t.num_turns == 4 for t in trajectories)


def test_parallel_sub_agents_calls_each_become_turns_of_one_episode(tok, policy):
    trajectories, runs, recorded = roll(ParallelSubAgents, tok, policy)
    counts = segments(tok, trajectories, runs, recorded)
    assert all(t.num_turns == 4 for t in trajectories) and all(2 <= s <= 4 for s in counts)


def test_64_agents_in_flight_get_their_own_replies(tok, policy):
    """64 programs at once (every one's call waiting together: ``env_workers=64``), 3 calls each:
    no call is lost (every episode ends with 3 turns) or crossed (each program's replies are the
    texts sampled for its own episode, found by the nonce in its first message)."""
    received: dict[str, list[str]] = {}

    class Nonce(AgentEnv):
        tasks = {"train": [{"id": i} for i in range(64)]}

        async def run(self, base_url, api_key, task):
            nonce = f"agent-{api_key[:12]}"
            async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
                messages = [{"role": "user", "content": nonce}]
                for k in range(3):
                    reply = await client.chat.completions.create(model="policy", messages=messages)
                    received.setdefault(nonce, []).append(reply.choices[0].message.content or "")
                    messages += [{"role": "assistant", "content": received[nonce][-1]},
                                 {"role": "user", "content": f"more {k}"}]
            return 0.0

    collector = RolloutCollector(lambda: Nonce(tool_parser="hermes"), policy, ChatRenderer(tok), max_context_tokens=4096,
                                 env_workers=64)
    try:
        trajectories = collector.collect([Task(s) for s in range(64)], 1, SamplingParams(max_new_tokens=12))
    finally:
        collector.close()
    assert len(received) == 64 and all(len(r) == 3 for r in received.values())
    renderer = ChatRenderer(tok)
    for trajectory in trajectories:
        assert trajectory.termination == "terminated" and trajectory.num_turns == 3
        nonce = trajectory.messages[0]["content"]
        texts = []
        for start, end in trajectory.turn_spans:
            ids = trajectory.token_ids[start:end]
            body = ids[:-1] if ids and ids[-1] in renderer.end_ids else ids
            texts.append(tok.decode(body, skip_special_tokens=False))
        assert received[nonce] == texts

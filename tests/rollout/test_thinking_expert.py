"""A thinking template's generation prompt opens a thought (Qwen3.5: ``<think>\\n``); the env reads
only what follows the close tag. The scripted expert (warm-start targets, check-env) must close
that thought the way the template renders an empty one, or the env never gets an action and a
model warm-started on it learns to act inside its thought."""

from __future__ import annotations

import pytest

from turnrl.chat.families import family_tokenizer
from turnrl.chat.renderer import ChatRenderer
from turnrl.envs import CalcMathEnv, GuessNumberEnv
from turnrl.rollout.metrics import rollout_metrics
from turnrl.rollout.scripted import scripted_episode


@pytest.fixture(scope="module")
def qwen3_5():
    return family_tokenizer("qwen3_5")


@pytest.mark.parametrize("make_env", [lambda: GuessNumberEnv(n=16, max_turns=6),
                                      lambda: CalcMathEnv(tool_parser="qwen3_coder")], ids=["guess", "calc_tools"])
def test_the_expert_closes_the_opened_thought_and_its_actions_reach_the_env(qwen3_5, make_env):
    renderer = ChatRenderer(qwen3_5, "qwen3_5")
    env = make_env()
    for seed in range(3):
        traj = scripted_episode(env, seed, renderer)
        assert traj.success, traj.messages  # every answer reached the env
        answers = [m["content"] for m in traj.messages if m["role"] == "assistant"]
        assert answers and all(a.startswith("<think>\n\n</think>\n\n") for a in answers), answers


def test_a_family_whose_prompt_opens_no_thought_gets_the_answer_as_is():
    renderer = ChatRenderer(family_tokenizer("qwen2_5"), "qwen2_5")
    conv = renderer.start([{"role": "user", "content": "hi"}])
    assert renderer.scripted_turn(conv, "42") == "42"


def test_a_turn_that_never_closes_its_thought_counts_as_an_empty_action(qwen3_5):
    renderer = ChatRenderer(qwen3_5, "qwen3_5")
    conv = renderer.start([{"role": "user", "content": "Guess a number."}])
    ids = renderer.encode("I think it is 8") + [qwen3_5.eos_token_id]
    assert renderer.add_sampled(conv, ids, [0.0] * len(ids)) == ""  # the env would get nothing


def test_the_collector_counts_the_turns_of_a_model_that_never_closes_its_thought(qwen3_5):
    """A random tiny model on the Qwen3.5 template writes inside the opened ``<think>`` and never
    closes it within 6 tokens (it may, by chance, sample ``</think>``): each turn whose thought stays
    open gives the env an empty action, and the collector counts exactly those."""
    from turnrl.models.causal_lm import TinyModelConfig, build_tiny_model
    from turnrl.policies.hf.policy import TransformersPolicy
    from turnrl.policies.sampling import SamplingParams
    from turnrl.rollout import RolloutCollector, Task

    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                             intermediate_size=64), qwen3_5, seed=0)
    collector = RolloutCollector(lambda: GuessNumberEnv(n=16, max_turns=2), TransformersPolicy(model, qwen3_5),
                                 ChatRenderer(qwen3_5, "qwen3_5"), max_context_tokens=4096)
    trajectories = collector.collect([Task(0)], 2, SamplingParams(max_new_tokens=6, temperature=1.0))
    def open_thoughts(t):
        """Turns whose text after the thought is empty (all of them while it stays open)."""
        return sum(not m["content"].rsplit("</think>", 1)[1].strip() if "</think>" in m["content"] else True
                   for m in t.messages if m["role"] == "assistant")

    turns = sum(t.num_turns for t in trajectories)
    assert [t.empty_actions for t in trajectories] == [open_thoughts(t) for t in trajectories]
    assert sum(map(open_thoughts, trajectories)) > 0
    assert rollout_metrics(trajectories)["empty_action_rate"] == sum(map(open_thoughts, trajectories)) / turns

"""What an env may tell the collector beyond new messages: ``info["context"]`` (the conversation
rewritten: a new segment rendered from it, with ``info["tools"]``), ``info["turn_rewards"]`` on
the last step (every turn's reward), and the ``sampled_turn`` hook (the turn's usage before its
step). ``turnrl.envs.agent.AgentEnv`` uses all three."""

import math

import gymnasium
import pytest

from tests.conftest import RecordingPolicy
from turnrl.envs.messages import action_space, observation_space
from turnrl.policies.sampling import SamplingParams
from turnrl.rollout import RolloutCollector, Task

TOOL = {"type": "function", "function": {"name": "look", "description": "Look.", "parameters": {"type": "object"}}}


class Rewriting(gymnasium.Env):
    """Three turns: the second observation rewrites the conversation (a summary, a tool); the
    last step gives every turn's reward."""

    def __init__(self, turn_rewards=(0.25, 0.5, 1.0)):
        self.observation_space, self.action_space = observation_space(), action_space()
        self.turn_rewards, self.usage = list(turn_rewards), []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return [{"role": "user", "content": "Say something."}], {"task_id": "t", "state_key": 0}

    def sampled_turn(self, prompt_tokens, completion_tokens, finish_reason):
        self.usage.append((prompt_tokens, completion_tokens, finish_reason))

    def step(self, action):
        self.turn += 1
        if self.turn == 3:
            return [], 0.0, True, False, {"success": True, "turn_rewards": self.turn_rewards}
        if self.turn == 2:
            summary = [{"role": "system", "content": "Summary: one turn so far."}, {"role": "user", "content": "Again."}]
            return summary, 0.0, False, False, {"state_key": 2, "context": summary, "tools": [TOOL]}
        return [{"role": "user", "content": "More."}], 0.0, False, False, {"state_key": 1}


def test_context_starts_a_segment_rendered_from_it_and_turn_rewards_replace_the_rewards(policy_model, tokenizer,
                                                                                       renderer):
    envs = []

    def make():
        envs.append(Rewriting())
        return envs[-1]

    policy = RecordingPolicy(policy_model, tokenizer, seed=3)
    collector = RolloutCollector(make, policy, renderer, max_context_tokens=1024)
    [traj] = collector.collect([Task(0)], 1, SamplingParams(max_new_tokens=8))
    collector.close()
    assert traj.termination == "terminated" and traj.turn_rewards == [0.25, 0.5, 1.0] and traj.success
    assert traj.num_segments == 2 and traj.tools == [TOOL]
    start = traj.segment_starts[1]
    summary = [{"role": "system", "content": "Summary: one turn so far."}, {"role": "user", "content": "Again."}]
    assert traj.token_ids[start:traj.turn_spans[2][0]] == renderer.encode(
        renderer.render(summary, add_generation_prompt=True, tools=[TOOL]))
    prompts = [p for call in policy.calls for p in call[0]]
    gens = [g for call in policy.calls for g in call[1]]
    assert envs[0].usage == [(len(p), len(g.token_ids), g.finish_reason) for p, g in zip(prompts, gens)][:3]


@pytest.mark.parametrize("rewards", [(1.0, 2.0), (0.0, math.nan, 1.0)])
def test_bad_turn_rewards_end_the_episode_as_an_env_error(policy_model, tokenizer, renderer, rewards):
    collector = RolloutCollector(lambda: Rewriting(rewards), RecordingPolicy(policy_model, tokenizer, seed=3), renderer)
    [traj] = collector.collect([Task(0)], 1, SamplingParams(max_new_tokens=8))
    collector.close()
    assert traj.termination == "env_error" and "turn_rewards" in traj.error

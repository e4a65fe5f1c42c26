"""``RewardModelReward``: any env, rewarded by a learned reward model instead of its own
verifier (the RLHF path), with the verifier's reward kept in ``info`` to watch the gap."""

from __future__ import annotations

from typing import Any

import gymnasium

from turnrl.chat.renderer import ChatRenderer
from turnrl.algorithms.pre_rl.reward_model import RewardModel
from turnrl.rollout.trajectory import Trajectory


class RewardModelReward(gymnasium.Wrapper):
    """Replace the env's rewards by ``reward_model``'s score of the whole conversation.

    Every turn's reward becomes 0 except the last, which is the reward model's score of the
    episode (the conversation rendered with ``renderer``, the assistant turns tokenized as
    text plus the end-of-turn id, the way preference pairs are rendered). The env's own
    return is never used for learning; it is reported as ``info["verifier_reward"]`` on the
    last step, next to ``info["proxy_reward"]``, so a run can log the proxy-vs-verifier gap
    (reward over-optimisation shows as a proxy that rises while the verifier does not).
    ``info["success"]`` stays the env's verdict.

    Args:
        env: any turnrl env.
        reward_model: a trained ``RewardModel`` (its tokenizer is ``renderer``'s).
        renderer: the chat renderer of that tokenizer.
    """

    def __init__(self, env: gymnasium.Env, reward_model: RewardModel, renderer: ChatRenderer):
        super().__init__(env)
        self.reward_model, self.renderer = reward_model, renderer
        self._conv = None
        self._verifier = 0.0

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self._conv = self.renderer.start(list(obs), tools=info.get("tools"))
        self._verifier = 0.0
        return obs, info

    def step(self, action: str):
        if self._conv is None:
            raise RuntimeError("step() called before reset(); call reset() first")
        ids = self.renderer.encode(action) + [self.renderer.tokenizer.eos_token_id]
        self.renderer.add_sampled(self._conv, ids, [0.0] * len(ids))
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._verifier += float(reward)
        if not (terminated or truncated):
            self.renderer.add_observation(self._conv, list(obs), add_generation_prompt=True)
            return obs, 0.0, terminated, truncated, info
        self.renderer.add_observation(self._conv, [], add_generation_prompt=False)
        c = self._conv
        episode = Trajectory.from_conversation(c, [0.0] * len(c.turn_spans), False, 0, str(info.get("task_id", "")),
                                               "terminated")
        proxy = float(self.reward_model.score([episode])[0])
        self._conv = None
        return obs, proxy, terminated, truncated, {**info, "verifier_reward": self._verifier, "proxy_reward": proxy}

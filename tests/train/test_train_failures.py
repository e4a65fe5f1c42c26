"""End to end: a run whose env fails (raises, hangs) completes, and the failures never reach
the weights. The real trainer, tiny model, env, collector and learner; the env is GuessNumber
broken on purpose."""

import math
import random
import threading

import pytest
import torch
from omegaconf import OmegaConf

from turnrl.conf.schema import Config
from turnrl.envs import GuessNumberEnv
from turnrl.train.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


class FlakyGuessNumber(GuessNumberEnv):
    """GuessNumber whose step raises with probability ``p_raise`` and hangs (until the
    process ends) with probability ``p_hang``, drawn from an RNG of its own."""

    _made = 0

    def __init__(self, p_raise: float = 0.3, p_hang: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        FlakyGuessNumber._made += 1
        self.p_raise, self.p_hang = p_raise, p_hang
        self.failures = random.Random(FlakyGuessNumber._made)

    def step(self, action):
        draw = self.failures.random()
        if draw < self.p_raise:
            raise RuntimeError("flaky env: step failed")
        if draw < self.p_raise + self.p_hang:
            threading.Event().wait()  # forever: only the step deadline ends it
        return super().step(action)


def _config(steps=3, **overrides) -> Config:
    cfg = OmegaConf.structured(Config)
    cfg.env.id = None
    cfg.env._target_ = f"{__name__}.FlakyGuessNumber"
    cfg.env.kwargs = {"n": 16, "max_turns": 3}
    cfg.agent.max_new_tokens = 6
    cfg.agent.warmstart.steps = 10
    cfg.agent.tokenizer.corpus_episodes = 20
    cfg.trainer.update(dict(steps=steps, tasks_per_step=2, group_size=4, eval_episodes=4, eval_every=100,
                            progress=False, tensorboard=False, save_checkpoint=False))
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_object(cfg)


@pytest.mark.parametrize("overrides", [
    {},
    {"trainer.infra_failures": "refill"},
    {"trainer.async_rollouts": True, "trainer.max_staleness": 1, "algorithm.tis": "token"},
    {"env.kwargs.p_hang": 0.1, "trainer.step_timeout_s": 1.0},
], ids=["sync-drop", "sync-refill", "async", "hanging-steps"])
def test_a_run_whose_env_fails_completes(tmp_path, overrides):
    result = train(_config(**overrides), tmp_path)
    assert len(result.train) == 3
    failed = sum(m["infra_failure_rate"] for m in result.train)
    assert failed > 0  # the failures happened (p = 0.3 per step, 3 steps x 8 episodes)
    assert all(math.isfinite(m["pg_loss"]) for m in result.train)
    if "p_hang" in str(overrides):
        assert any(m["step_timeout_rate"] > 0 for m in result.train)


def test_failures_never_reach_the_weights(tmp_path):
    """Every episode fails: each update is empty and the weights stay as they were."""
    start = {}

    def snapshot(model):
        start.update({n: p.detach().clone() for n, p in model.named_parameters()})

    result = train(_config(steps=2, **{"env.kwargs.p_raise": 1.0}), tmp_path, on_rl_start=snapshot)
    assert [m["infra_failure_rate"] for m in result.train] == [1.0, 1.0]
    moved = [n for n, p in result.model.named_parameters() if not torch.equal(p, start[n])]
    assert not moved, f"parameters moved by failed episodes: {moved}"

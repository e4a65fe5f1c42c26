"""End-to-end training on the tiny model: the real env, renderer, collector, GRPO and learner."""

import json

import pytest
import torch
from omegaconf import OmegaConf

from turnrl.conf.schema import Config
from turnrl.trainer import train


def _config(env_id: str, env_kwargs: dict, **trainer) -> Config:
    cfg = OmegaConf.structured(Config)
    cfg.env.id, cfg.env.kwargs = env_id, env_kwargs
    cfg.agent.warmstart.steps = 60
    cfg.agent.tokenizer.corpus_episodes = 50
    cfg.trainer.update(dict(eval_episodes=32, eval_every=10, progress=False, tensorboard=True, **trainer))
    return OmegaConf.to_object(cfg)


def _mean(values):
    return sum(values) / len(values)


@pytest.mark.parametrize(
    "env_id, env_kwargs, steps, lr",
    [
        ("turnrl/GuessNumber-v0", {"n": 32}, 40, 1e-3),
        # the tool-using env: one calculator call, then the answer
        ("turnrl/CalcMath-v0", {"num_ops": 1, "max_operand": 4}, 40, 1e-3),
    ],
)
def test_grpo_run_moves_every_parameter_and_raises_reward(tmp_path, env_id, env_kwargs, steps, lr):
    start = {}

    def snapshot(model):
        start.update({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})

    result = train(_config(env_id, env_kwargs, steps=steps, lr=lr), tmp_path, on_rl_start=snapshot)

    unchanged = [n for n, p in result.model.named_parameters() if p.requires_grad and torch.equal(p, start[n])]
    assert not unchanged, f"parameters not updated by RL: {unchanged}"
    rewards = [m["reward"] for m in result.train]
    first, last = _mean(rewards[:10]), _mean(rewards[-10:])
    assert last > first, f"mean train reward did not rise: first 10 steps {first:.3f}, last 10 {last:.3f}"

    # what a run leaves behind
    for name in ("metrics.jsonl", "curves.png", "summary.txt", "checkpoint/config.json",
                 "checkpoint/trainer_state.pt", "checkpoint/tokenizer.json"):
        assert (tmp_path / name).exists(), name
    assert list((tmp_path / "tb").iterdir()), "no TensorBoard events written"
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row for row in lines if row["kind"] == "train"]
    assert len(train_rows) == steps
    for key in ("reward", "success", "turns", "gen_tokens", "tool_parse_error_rate", "tool_exec_error_rate",
                "truncation_rate", "entropy", "kl", "clip_frac", "unique_ngram_rate", "step_time"):
        assert key in train_rows[0], key
    assert (tmp_path / "summary.txt").read_text().strip().splitlines()[-1].startswith("held-out success: before ")

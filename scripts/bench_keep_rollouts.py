"""What keeping every step's rollouts costs: seconds per RL step with ``trainer.rollouts.every=1``
(the default: every episode of every step written token by token to ``RUN/rollouts/``) against
``trainer.rollouts.every=0`` (nothing kept), on the ``make train`` defaults.

    .venv/bin/python scripts/bench_keep_rollouts.py [--steps 30] [--repeats 2] [--json out.json] [-- OVERRIDES]

Runs the two sides one after the other, alternating (keep, none, keep, none, ...: a drift of the
machine's speed then falls on both), each ``python -m turnrl.train`` as users run it, with
``trainer.threads=1``, evaluating only before and after (``trainer.rollouts.eval=false``: the
evaluations are not in the steps' time). From each run's ``metrics.jsonl``: ``step_time`` over
steps 2..N, the whole step as the trainer times it (keeping included). Prints each side's median
over all its runs, the ratio and the kept files' size per step; ``--json`` writes the record
(``turnrl.bench.record``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from turnrl.bench.record import emit  # noqa: E402

SIDES = {"keep": ["trainer.rollouts.every=1"], "none": ["trainer.rollouts.every=0"]}


def run_once(name: str, overrides: list[str], out: Path) -> dict:
    """Train one run; its step times over steps 2..N and its kept bytes per step."""
    cmd = [sys.executable, "-m", "turnrl.train", *overrides, f"hydra.run.dir={out}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name} run failed (exit {done.returncode}): {done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = [float(r["step_time"]) for r in rows if r.get("step", 0) >= 2 and "step_time" in r]
    if not times:
        raise RuntimeError(f"{name} run logged no step after the first: {out / 'metrics.jsonl'}")
    files = list((out / "rollouts" / "train").glob("step-*.jsonl.gz"))
    return {"step_times": times, "bytes_per_step": sum(f.stat().st_size for f in files) / len(files) if files else 0}


def run(args) -> dict:
    shared = [f"seed={args.seed}", f"trainer.steps={args.steps}", f"trainer.eval_every={args.steps}",
              "trainer.threads=1", "trainer.progress=false", "trainer.rollouts.eval=false", *args.overrides]
    runs: dict[str, list[dict]] = {name: [] for name in SIDES}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, extra in SIDES.items():
                print(f"  {name} {repeat + 1}/{args.repeats} ...", flush=True)
                runs[name].append(run_once(name, [*shared, *extra], Path(tmp) / f"{name}{repeat}"))
    sides = {name: {"step_time": statistics.median(t for r in rs for t in r["step_times"]),
                    "run_medians": [statistics.median(r["step_times"]) for r in rs],
                    "bytes_per_step": statistics.mean(r["bytes_per_step"] for r in rs)}
             for name, rs in runs.items()}
    return {"setup": {"steps": args.steps, "repeats": args.repeats, "seed": args.seed, "shared": shared},
            "sides": sides, "ratio": sides["keep"]["step_time"] / sides["none"]["step_time"]}


def print_table(result: dict) -> None:
    s = result["setup"]
    print(f"keeping rollouts: make train defaults, {s['steps']} steps x {s['repeats']} runs a side, "
          f"trainer.threads=1; median step_time over steps 2..{s['steps']}")
    print(f"{'side':<6} {'s/step':>8} {'runs':>16} {'kept KiB/step':>14}")
    for name, side in result["sides"].items():
        runs = " ".join(f"{m:.3f}" for m in side["run_medians"])
        print(f"{name:<6} {side['step_time']:>8.3f} {runs:>16} {side['bytes_per_step'] / 1024:>14.1f}")
    print(f"step time with rollouts kept / without: {result['ratio']:.3f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="RL steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per side, alternating")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the record to this file")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of every run, after --")
    args = parser.parse_args(argv)
    if args.steps < 3 or args.repeats < 1:
        parser.error("--steps must be >= 3 and --repeats >= 1")
    emit(run(args), print_table, args.json)


if __name__ == "__main__":
    main()

"""Seconds per RL step, synchronous against asynchronous rollouts, on the ``make train`` defaults.

    .venv/bin/python scripts/bench_async.py [--steps 25] [--staleness 1] [--json out.json] [-- OVERRIDES]

Trains the same config twice, one run after the other: synchronously, then with
``trainer.async_rollouts=true trainer.max_staleness=K algorithm.tis=token`` (the rollouts of
step s collected in a background thread while the learner runs the updates before it). Both
with ``trainer.threads=1`` and the Hydra overrides after ``--`` (the rollout thread and the learner then have a core each on a
2-core machine), evaluating only before and after. From each run's ``metrics.jsonl``: the
median over steps 2..N of ``step_time`` (the whole step), ``rollout_time`` (collecting the
step's episodes) and ``rollout_wait`` (how long the learner waited for them; 0 when sampling
hid entirely behind the update). Prints both and the speed-up, and with ``--json`` writes the
record (``turnrl.bench.record``).
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

SIDES = {"sync": [], "async": ["trainer.async_rollouts=true", "algorithm.tis=token"]}
KEYS = ("step_time", "rollout_time", "rollout_wait")


def run_side(name: str, overrides: list[str], out: Path) -> dict:
    """Train one side; the medians of ``KEYS`` over steps 2..N of its metrics."""
    cmd = [sys.executable, "-m", "turnrl.train", *overrides, f"hydra.run.dir={out}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name} run failed (exit {done.returncode}): {done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r.get("step", 0) >= 2 and "step_time" in r]
    if not steps:
        raise RuntimeError(f"{name} run logged no step after the first: {out / 'metrics.jsonl'}")
    return {"overrides": overrides, "steps": len(steps),
            **{key: statistics.median(float(r[key]) for r in steps) for key in KEYS}}


def run(args) -> dict:
    shared = [f"seed={args.seed}", f"trainer.steps={args.steps}", f"trainer.eval_every={args.steps}",
              "trainer.threads=1", "trainer.progress=false", *args.overrides]
    sides = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in SIDES.items():
            extra = [*extra, f"trainer.max_staleness={args.staleness}"] if name == "async" else extra
            print(f"  {name} ...", flush=True)
            sides[name] = run_side(name, [*shared, *extra], Path(tmp) / name)
    return {"setup": {"steps": args.steps, "staleness": args.staleness, "seed": args.seed, "shared": shared},
            "sides": sides, "speedup": sides["sync"]["step_time"] / sides["async"]["step_time"]}


def print_table(result: dict) -> None:
    s = result["setup"]
    print(f"sync vs async rollouts: make train defaults, {s['steps']} steps, max_staleness {s['staleness']}, "
          f"trainer.threads=1; medians over steps 2..{s['steps']}")
    print(f"{'side':<8} {'s/step':>8} {'rollout s':>10} {'waited s':>9}")
    for name, side in result["sides"].items():
        print(f"{name:<8} {side['step_time']:>8.3f} {side['rollout_time']:>10.3f} {side['rollout_wait']:>9.3f}")
    print(f"speed-up of the asynchronous step: {result['speedup']:.2f}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25, help="RL steps per run")
    parser.add_argument("--staleness", type=int, default=1, help="trainer.max_staleness of the async run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the record to this file")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of both runs, after --")
    args = parser.parse_args(argv)
    if args.steps < 3 or args.staleness < 1:
        parser.error("--steps must be >= 3 and --staleness >= 1")
    emit(run(args), print_table, args.json)


if __name__ == "__main__":
    main()

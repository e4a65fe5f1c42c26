"""Learner time and peak memory against the episodes in a step, at a fixed micro-batch.

    .venv/bin/python scripts/bench_learner_scaling.py [--rows 16,32,64] [--micro-batch-size 8]

Each row count runs in a fresh process (so its peak resident memory is its own): the tiny Qwen2
and a batch of that many scripted GuessNumber episodes (``scripts/bench_learner.py``), one
warm-up update, then ``--repeats`` timed ``Learner.update`` calls. Printed per row count: the
median seconds per update, the rise of the peak resident set over the memory held before the
first update (model, batch, optimizer state aside), and the growth exponents in rows (slope of
log time / log memory on log rows): time should grow as the rows (1.0) and the peak not at all
(0.0), since activations live one micro-batch at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from turnrl.bench import record  # noqa: E402
from turnrl.bench.stats import growth_exponent  # noqa: E402


def _kib(field: str) -> int:
    """A ``/proc/self/status`` figure in KiB (``VmRSS`` now, ``VmHWM`` the peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status (Linux only)")


def child(rows: int, micro: int, repeats: int, threads: int) -> dict:
    """One row count, measured in this (fresh) process."""
    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_learner import setup

    from turnrl.algorithms import Learner, LossConfig, OptimConfig

    torch.set_num_threads(threads)
    model, batch, advantages = setup(rows)
    learner = Learner(model, LossConfig(), OptimConfig(lr=1e-5, micro_batch_size=micro))
    # the optimizer's state exists after the first step: take the baseline after a step on 1 row
    learner.update(batch.rows(torch.arange(1)), advantages[:1])
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _kib("VmRSS")
    times = []
    for repeat in range(repeats + 1):
        start = time.perf_counter()
        learner.update(batch, advantages)
        times.append(time.perf_counter() - start)
    return {"rows": rows, "tokens": int(batch.attention_mask.sum()), "seconds": statistics.median(times[1:]),
            "peak_rise_mib": (_kib("VmHWM") - before) / 1024}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="16,32,64", help="comma-separated episodes per update")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--json", default=None, help="also write the result to this file")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.micro_batch_size, args.repeats, args.threads)))
        return
    counts = sorted({int(r) for r in args.rows.split(",") if r.strip()})
    if len(counts) < 2 or counts[0] < 1:
        parser.error(f"--rows needs at least two positive counts, got {counts}")
    results = []
    for rows in counts:
        out = subprocess.run([sys.executable, __file__, "--child", str(rows), "--micro-batch-size",
                              str(args.micro_batch_size), "--repeats", str(args.repeats), "--threads", str(args.threads)],
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    xs = [r["rows"] for r in results]
    growth = {"time": growth_exponent(xs, [r["seconds"] for r in results]),
              "tokens": growth_exponent(xs, [r["tokens"] for r in results])}
    print(f"learner scaling: micro-batch {args.micro_batch_size}, {args.threads} threads, median of {args.repeats}")
    print(f"{'rows':>5} {'tokens':>7} {'s/update':>9} {'peak rise MiB':>14}")
    for r in results:
        print(f"{r['rows']:>5} {r['tokens']:>7} {r['seconds']:>9.3f} {r['peak_rise_mib']:>14.1f}")
    print(f"growth exponent in rows: time {growth['time']:.2f} (tokens {growth['tokens']:.2f}); peak rise "
          f"{results[0]['peak_rise_mib']:.1f} -> {results[-1]['peak_rise_mib']:.1f} MiB")
    if args.json:
        record.write(args.json, {"setup": {"micro_batch_size": args.micro_batch_size, "repeats": args.repeats,
                                           "threads": args.threads}, "rows": results, "exponent": growth})


if __name__ == "__main__":
    main()

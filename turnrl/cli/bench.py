"""``turnrl bench`` (a benchmark suite: ``turnrl.bench.suite``), ``turnrl grid`` (an algorithm x
seed grid on one env: ``turnrl.bench.grid``) and ``turnrl credit-lab`` (``turnrl.bench.credit_lab``):
Hydra and torch."""

from __future__ import annotations

import argparse
import os
import sys

from turnrl.bench import record
from turnrl.bench.credit_lab.lab import SWEEPS, run_sweeps
from turnrl.bench.credit_lab.report import write_report
from turnrl.bench.grid import main as grid_main
from turnrl.bench.suite import run_from_args
from turnrl.cli.common import EXIT_USAGE


def bench(args: argparse.Namespace) -> int:
    return run_from_args(args)


def grid(args: argparse.Namespace) -> int:
    return grid_main(args.overrides)


def credit_lab(args: argparse.Namespace) -> int:
    sweeps = args.sweeps or SWEEPS.names()
    unknown = [name for name in sweeps if name not in SWEEPS]
    if unknown:
        print(f"turnrl credit-lab: error: unknown sweeps {unknown}; valid: {SWEEPS.names()}", file=sys.stderr)
        return EXIT_USAGE
    workers = args.workers or max(1, min(4, os.cpu_count() or 1))
    rows = run_sweeps(sweeps, args.batches, args.seed, workers, args.progress)
    print(write_report(rows, args.out))
    if args.json:
        record.write(args.json, {"sweeps": sweeps, "batches": args.batches, "seed": args.seed, "rows": rows})
        print(f"record: {args.json}")
    print(f"report: {os.path.join(args.out, 'report.html')}")
    return 0

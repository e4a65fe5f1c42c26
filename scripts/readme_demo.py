"""The README's demo table, measured: ``make train``'s command (``python -m turnrl.train``, the CPU
defaults) for each seed, one after another, timed; held-out success before and after from each
run's ``summary.txt``. Writes a JSON record (figures, command, commit, date, machine, library
versions) that the README's table is checked against (``tests/test_docs_records.py``), and prints
the table.

    .venv/bin/python scripts/readme_demo.py [--seeds 0 1 2] [--json docs/results/readme_demo.json]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from turnrl.bench import record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"held-out success: before ([0-9.]+) after ([0-9.]+)")


def run_seed(seed: int, out: Path) -> dict:
    """One ``make train`` run with ``seed``: its before/after held-out success and wall time."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "turnrl.train", f"seed={seed}", f"hydra.run.dir={out}"], cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"seed {seed} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    match = SUMMARY.search((out / "summary.txt").read_text())
    return {"seed": seed, "before": float(match.group(1)), "after": float(match.group(2)), "wall_s": round(wall, 1)}


def table(rows: list[dict]) -> str:
    """The README's markdown table of the record's rows."""
    lines = ["| seed | before | after | wall time |", "|---|---|---|---|"]
    for r in rows:
        minutes, seconds = divmod(round(r["wall_s"]), 60)
        lines.append(f"| {r['seed']} | {r['before']:.2f} | {r['after']:.2f} | {minutes} min {seconds:02d} s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--json", default=str(ROOT / "docs/results/readme_demo.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in tqdm(args.seeds, desc="make train", unit="seed"):
            rows.append(run_seed(seed, Path(tmp) / f"seed{seed}"))
    record.write(args.json, {"runs": "python -m turnrl.train seed=SEED (make train; one seed at a time)",
                             "rows": rows})
    print(table(rows))
    print(f"record: {args.json}")


if __name__ == "__main__":
    main()

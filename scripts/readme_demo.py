"""The README's demo table, measured: ``make train``'s command (``python -m turnrl.train``, the CPU
defaults) for each seed, one after another, timed; held-out success before and after from each
run's ``summary.txt``. Prints each seed's figures and writes the record (figures, command,
commit, date, machine, library versions) that ``scripts/doc_tables.py`` builds the README's
table from.

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
    for r in rows:
        print(f"seed {r['seed']}: held-out success before {r['before']:.2f} after {r['after']:.2f}, {r['wall_s']:.0f} s")
    print(f"record: {args.json}")


if __name__ == "__main__":
    main()

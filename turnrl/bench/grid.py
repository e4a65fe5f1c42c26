"""``python -m turnrl grid --algorithms grpo rloo gigpo --seeds 0 1 2 -- env=guess_number trainer.steps=100``

Trains every (algorithm, seed) of the grid on the same env and the same seeds, one after the
other, with the same config otherwise (the overrides after ``--``), and writes into ``--out``:
``bench.json`` (every run), ``table.md`` (per algorithm: held-out success before and after,
mean ± std over seeds, AUC, wall time), ``curves.png`` and ``report.html``.

``--variant NAME "OVERRIDES"`` (repeatable) adds a dimension: every algorithm and seed also runs
under each named set of overrides, e.g. synchronous vs asynchronous rollouts or two backends
(``--variant sync "" --variant async_k1 "trainer.async_rollouts=true trainer.max_staleness=1
algorithm.tis=token"``); rows are then labelled ``algorithm [NAME]``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from turnrl.bench.report import RunRecord, html_report, markdown_table, plot
from turnrl.conf.schema import register_configs
from turnrl.train.loop import train


def compose_config(overrides: Sequence[str]):
    """The ``Config`` composed from ``overrides`` (in order: a later value of a key wins); raises
    Hydra's error at once on a bad override."""
    register_configs()
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_object(cfg)


def compose_run(algorithm: str, seed: int, overrides: Sequence[str]):
    """The composed ``Config`` of one grid cell (fails at once on a bad override)."""
    return compose_config([f"algorithm={algorithm}", f"seed={seed}", *overrides])


def train_cell(cfg, run_dir: str | Path, label: str, env: str = "") -> RunRecord:
    """Train one run of a benchmark (``turnrl.train.loop.train``) and return its record: held-out
    success before and after, the evaluations, wall time, and what it sampled (episodes, and
    generated tokens: per step the mean per episode times the episodes)."""

    start = time.perf_counter()
    result = train(cfg, run_dir)
    return RunRecord(label, cfg.seed, result.before, result.after, [(step, m["success"]) for step, m in result.evals],
                     time.perf_counter() - start, str(run_dir), env=env,
                     episodes_per_step=cfg.trainer.tasks_per_step * cfg.trainer.group_size,
                     sampled_episodes=round(sum(m["episodes"] for m in result.train)),
                     sampled_tokens=round(sum(m["gen_tokens"] * m["episodes"] for m in result.train)))


def run_grid(algorithms: Sequence[str], seeds: Sequence[int], overrides: Sequence[str], out: str | Path,
             progress: bool = True, variants: dict[str, Sequence[str]] | None = None) -> list[RunRecord]:
    """Train the grid and write the reports; returns the run records.

    Args:
        variants: named extra overrides; each algorithm and seed runs once per variant (None:
            once, unlabelled).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cells = variants or {"": []}
    configs = [(a, v, s, compose_run(a, s, [*overrides, *extra])) for a in algorithms for v, extra in cells.items()
               for s in seeds]  # all valid first
    records = []
    for algorithm, variant, seed, cfg in tqdm(configs, desc="bench", unit="run", disable=not progress):
        label = f"{algorithm} [{variant}]" if variant else algorithm
        run_dir = out / algorithm / variant / f"seed{seed}" if variant else out / algorithm / f"seed{seed}"
        records.append(train_cell(cfg, run_dir, label))
        (out / "bench.json").write_text(json.dumps([asdict(r) for r in records], indent=1))
    (out / "table.md").write_text(markdown_table(records) + "\n")
    plot(records, out / "curves.png")
    html_report(records, f"turnrl credit-method benchmark: {' '.join(overrides) or 'defaults'}",
                out / "curves.png", out / "report.html")
    return records


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m turnrl grid", description=__doc__.split("\n\n")[1])
    parser.add_argument("--algorithms", nargs="+", default=["grpo", "rloo", "gigpo"],
                        help="algorithm config names (turnrl/conf/algorithm)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", default="bench", help="output folder (default ./bench)")
    parser.add_argument("--variant", nargs=2, action="append", metavar=("NAME", "OVERRIDES"),
                        help='a named set of extra overrides, quoted as one argument ("" for none); repeatable')
    parser.add_argument("overrides", nargs="*", help="Hydra overrides shared by every run, after --")
    args = parser.parse_args(argv)
    variants = None
    if args.variant:
        variants = {name: shlex.split(extra) for name, extra in args.variant}
        if len(variants) != len(args.variant) or not all(name.replace("_", "").replace("-", "").isalnum()
                                                          for name in variants):
            parser.error(f"--variant names must be distinct words (letters, digits, _ or -), got "
                         f"{[name for name, _ in args.variant]}")
    records = run_grid(args.algorithms, args.seeds, args.overrides, args.out, variants=variants)
    print(markdown_table(records))
    print(f"report: {Path(args.out) / 'report.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

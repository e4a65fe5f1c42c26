"""Off-policy corrections on asynchronous rollouts: how far the sampler lags the learner, what
each correction keeps, and the reward it trains to, at staleness k = 1 and 2.

    .venv/bin/python scripts/bench_corrections.py [--steps 16] [--seeds 0 1] [--json out.json] [-- OVERRIDES]

Trains the ``make train`` defaults (the tiny model on its default env) once synchronously (k = 0,
no correction: the reference) and then with ``trainer.async_rollouts=true
trainer.max_staleness=K`` under each ``algorithm.tis`` correction (``turnrl.algorithms.losses.importance``):
token and sequence TIS, IcePop, token and sequence MIS, and geometric sequence masking, for
K = 1 and 2. Every run shares one warm start (``agent.warmstart.cache``), so the runs of a seed
differ only in the correction and the staleness. ``trainer.threads=1`` and the overrides after
``--`` go to every run.

From each run's ``metrics.jsonl``, means over its RL steps: ``mismatch_kl`` (the KL of the
learner's current policy from the sampler's, per token: what staleness costs), ``policy_lag``
(updates between sampling and learning), ``tis_weight`` (mean importance weight of a sampled
token) and ``tis_masked`` (the share of sampled tokens a masking correction dropped); the mean
training reward over the second half of the steps, and held-out success after the run. Each
figure is the mean over ``--seeds``. Not a timing benchmark (run times are printed, not compared).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from turnrl.bench.record import emit  # noqa: E402

CORRECTIONS = ("token", "sequence", "icepop", "mis_token", "mis_sequence", "geo_mask")
STALENESS = (1, 2)
MEANS = ("mismatch_kl", "policy_lag", "tis_weight", "tis_masked")


def sides() -> dict[str, list[str]]:
    """Side name -> its overrides: the synchronous reference, then each correction at each k."""
    out = {"sync": []}
    for k in STALENESS:
        for tis in CORRECTIONS:
            out[f"{tis} k={k}"] = ["trainer.async_rollouts=true", f"trainer.max_staleness={k}", f"algorithm.tis={tis}"]
    return out


def run_one(name: str, overrides: list[str], out: Path) -> dict:
    """Train one run; its figures from ``metrics.jsonl``."""
    cmd = [sys.executable, "-m", "turnrl.train", *overrides, f"hydra.run.dir={out}"]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name} run failed (exit {done.returncode}): {done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    if not train or not evals:
        raise RuntimeError(f"{name}: no training steps or evaluations in {out / 'metrics.jsonl'}")
    late = train[len(train) // 2:]
    return {**{key: statistics.fmean(float(r.get(key, 0.0)) for r in train) for key in MEANS},
            "reward_late": statistics.fmean(float(r["reward"]) for r in late),
            "success_before": float(evals[0]["success"]), "success_after": float(evals[-1]["success"]),
            "seconds": time.perf_counter() - start}


def run(args) -> dict:
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            shared = [f"seed={seed}", f"trainer.steps={args.steps}", f"trainer.eval_every={args.steps}",
                      f"trainer.eval_episodes={args.eval_episodes}", "trainer.threads=1", "trainer.progress=false",
                      "trainer.save_checkpoint=false", "trainer.tensorboard=false",
                      f"agent.warmstart.cache={Path(tmp) / 'warm'}", *args.overrides]
            for i, (name, extra) in enumerate(sides().items()):
                print(f"  seed {seed}: {name} ...", flush=True)
                results.setdefault(name, []).append(run_one(name, [*shared, *extra], Path(tmp) / f"seed{seed}-run{i}"))
    table = {name: {key: statistics.fmean(r[key] for r in runs) for key in runs[0]} for name, runs in results.items()}
    return {"setup": {"steps": args.steps, "seeds": list(args.seeds), "eval_episodes": args.eval_episodes,
                      "overrides": list(args.overrides)},
            "sides": table, "per_seed": results}


def print_table(result: dict) -> None:
    s = result["setup"]
    print(f"off-policy corrections: make train defaults, {s['steps']} steps, seeds {s['seeds']}, means over steps")
    print(f"{'side':<17} {'mismatch KL':>11} {'lag':>5} {'IS weight':>9} {'masked':>7} {'reward (late)':>13} "
          f"{'held-out after':>14}")
    for name, v in result["sides"].items():
        print(f"{name:<17} {v['mismatch_kl']:>11.2e} {v['policy_lag']:>5.2f} {v['tis_weight']:>9.3f} "
              f"{v['tis_masked']:>7.3f} {v['reward_late']:>13.3f} {v['success_after']:>14.3f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="RL steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--eval-episodes", type=int, default=128, help="held-out episodes before and after")
    parser.add_argument("--json", default=None, help="also write the record to this file")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of every run, after --")
    args = parser.parse_args(argv)
    if args.steps < 4:
        parser.error("--steps must be >= 4")
    emit(run(args), print_table, args.json)


if __name__ == "__main__":
    main()

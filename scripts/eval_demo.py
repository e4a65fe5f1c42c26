"""The evaluation table of docs/benchmarks.md, measured: a tiny run trained here, then ``turnrl
eval``'s figures on its final checkpoint.

    .venv/bin/python scripts/eval_demo.py [--tasks 64] [--samples 8] [--json docs/results/eval_demo.json]

The run is the one ``tests/eval/test_eval.py`` trains: GuessNumber of 1..16, a 2-layer Qwen2 of
hidden size 64 warm-started for 60 supervised steps, a learned reward model of 10 steps that
rewards the env, 2 GRPO steps. The evaluation plays ``--tasks`` held-out tasks once greedily and
``--samples`` times at the run's temperature (``turnrl.eval.run.run_eval``, what ``python -m
turnrl eval --checkpoint RUN`` runs) and prints its table; ``--json`` writes the record.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from turnrl.bench.record import emit  # noqa: E402
from turnrl.conf.schema import Config  # noqa: E402
from turnrl.eval.report import EvalReport  # noqa: E402
from turnrl.eval.run import eval_config, resolve_checkpoint, run_eval  # noqa: E402
from turnrl.train.loop import train  # noqa: E402

MODEL = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)


def train_run(out: Path) -> dict:
    """Train the tiny run into ``out``; the settings that differ from the defaults."""
    settings = {"env.id": "turnrl/GuessNumber-v0", "env.kwargs": {"n": 16}, "agent.max_new_tokens": 8,
                "agent.model": MODEL, "agent.warmstart": dict(steps=60, batch_size=8, lr=3e-3),
                "agent.tokenizer.corpus_episodes": 30, "reward_model": dict(steps=10, scripted_episodes=32),
                "trainer": dict(steps=2, tasks_per_step=4, group_size=4, eval_episodes=8, eval_every=2, threads=1,
                                checkpoint_every=2,  # the reward model is kept in the resumable checkpoint
                                progress=False, tensorboard=False)}
    cfg = OmegaConf.structured(Config)
    for key, value in settings.items():
        node = OmegaConf.select(cfg, key)
        if isinstance(value, dict) and key != "env.kwargs":
            node.update(value)
        else:
            OmegaConf.update(cfg, key, value, merge=False)
    train(OmegaConf.to_object(cfg), out)
    return settings


def run(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        settings = train_run(run_dir)
        target = resolve_checkpoint(str(run_dir))
        cfg = eval_config(target, [])
        ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= args.samples]
        report, _, _ = run_eval(cfg, target, episodes=args.tasks, samples=args.samples, ks=ks, temperature=None,
                                greedy=True, batch_tasks=32, progress=True)
    data = json.loads(report.to_json())
    data["model"] = "the run's final checkpoint"
    return {"trained": settings, "report": data}


def print_table(result: dict) -> None:
    print(EvalReport.from_dict(result["report"]).to_markdown())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=64, help="held-out tasks")
    parser.add_argument("--samples", type=int, default=8, help="sampled episodes per task")
    parser.add_argument("--json", default=None, help="also write the record to this file")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.samples < 1:
        parser.error("--tasks and --samples must be >= 1")
    emit(run(args), print_table, args.json)


if __name__ == "__main__":
    main()

"""``turnrl eval``: a policy on held-out tasks, any backend (``turnrl.eval.run``)."""

from __future__ import annotations

import argparse
import json
import sys

from turnrl.bench import record
from turnrl.cli.common import EXIT_OK, EXIT_USAGE
from turnrl.eval.run import eval_config, resolve_checkpoint, run_eval, write_outputs


def evaluate(args: argparse.Namespace) -> int:
    try:
        target = resolve_checkpoint(args.checkpoint) if args.checkpoint else None
        cfg = eval_config(target, args.overrides)
    except Exception as e:  # a bad path, override or config: Hydra's and validate's messages say which
        print(f"turnrl eval: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    ks = args.k or [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= args.samples]
    try:
        report, greedy, sampled = run_eval(cfg, target, episodes=args.episodes or cfg.trainer.eval_episodes,
                                           samples=args.samples, ks=ks, temperature=args.temperature,
                                           greedy=args.greedy, batch_tasks=args.batch_tasks, progress=args.progress)
    except ValueError as e:
        print(f"turnrl eval: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    out = write_outputs(report, greedy, sampled, args.out)
    if args.json:
        record.write(args.json, json.loads(report.to_json()))
    print(report.to_markdown())
    print(f"wrote eval.json, eval.md and eval_episodes.jsonl to {out}", flush=True)
    return EXIT_OK

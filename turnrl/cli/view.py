"""``turnrl view RUN_DIR``: the page of a run's kept episodes (``turnrl.runs.view``)."""

from __future__ import annotations

import argparse
import sys

from turnrl.cli.common import EXIT_OK, EXIT_USAGE
from turnrl.runs.store import rollout_steps
from turnrl.runs.view import build_view


def view(args: argparse.Namespace) -> int:
    try:
        if not any(rollout_steps(args.run_dir, kind) for kind in ("train", "eval")):
            print(f"turnrl view: error: {args.run_dir} holds no kept episodes (no rollouts/train or rollouts/eval "
                  "files): pass a run's output folder, trained with trainer.rollouts.every >= 1", file=sys.stderr)
            return EXIT_USAGE
        path = build_view(args.run_dir, args.out)
    except (FileNotFoundError, NotADirectoryError) as e:
        print(f"turnrl view: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {path}: open it in a browser (file://{path.resolve()})")
    return EXIT_OK

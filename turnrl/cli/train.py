"""``turnrl train [OVERRIDES]``: training, exactly as ``python -m turnrl.train OVERRIDES``
(Hydra's entry point ``turnrl.train.entry.main``, which reads ``sys.argv``)."""

from __future__ import annotations

import argparse
import sys

from turnrl.cli.common import EXIT_OK
from turnrl.train.entry import main as train_main


def train(args: argparse.Namespace) -> int:
    """Run Hydra's main on the overrides; Hydra exits (``SystemExit``, code 1) on a config or
    override it rejects, printing why."""
    saved = sys.argv
    sys.argv = ["turnrl train", *args.overrides]
    try:
        train_main()
    finally:
        sys.argv = saved
    return EXIT_OK

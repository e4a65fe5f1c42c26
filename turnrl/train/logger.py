"""Step metrics to JSONL and TensorBoard in the run directory, and to the experiment trackers
the config chooses (``turnrl.train.trackers``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

from turnrl.runs.rollouts import EpisodeRecord
from turnrl.train.trackers import Tracker

log = logging.getLogger(__name__)


class RunLogger:
    """Appends ``{"step": s, "kind": prefix, **metrics}`` lines to ``metrics.jsonl``, writes
    TensorBoard scalars under ``tb/`` (``prefix`` namespaces them: ``train/``, ``eval/``) and
    reports to ``trackers``. A tracker that raises is dropped with a warning and the run goes on
    (``metrics.jsonl`` keeps every figure)."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, trackers: Sequence[Tracker] = ()):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboard.compat.proto.summary_pb2 import Summary  # tensorboard's import is slow
            from torch.utils.tensorboard import SummaryWriter

            self._summary = Summary

            self._tb = SummaryWriter(str(self.run_dir / "tb"))
            self._tb._get_file_writer()  # made now: log() writes to its file_writer
        self.trackers = list(trackers)

    def log(self, step: int, metrics: dict[str, float], prefix: str = "train", jsonl: bool = True) -> None:
        """Log one row; ``jsonl=False`` writes TensorBoard and the trackers only (replaying a
        restored log)."""
        if jsonl:
            self._jsonl.write(json.dumps({"step": step, "kind": prefix, **metrics}) + "\n")
            self._jsonl.flush()
        if self._tb is not None:  # one event holding the row's scalars (an event per scalar costs ~9 ms a step)
            values = [self._summary.Value(tag=f"{prefix}/{key}", simple_value=float(value)) for key, value in metrics.items()
                      if isinstance(value, (int, float))]
            self._tb.file_writer.add_summary(self._summary(value=values), step)
        self._report("log", prefix, step, metrics)

    def episodes(self, kind: str, step: int, records: Sequence[EpisodeRecord]) -> None:
        """Sample episodes to the trackers (the run dir keeps them in ``rollouts/``)."""
        if records:
            self._report("episodes", kind, step, records)

    def file(self, path: Path) -> None:
        """A file of the run (the run page) to the trackers as an artifact."""
        if Path(path).is_file():
            self._report("file", Path(path))

    def _report(self, method: str, *args) -> None:
        for tracker in list(self.trackers):
            try:
                getattr(tracker, method)(*args)
            except Exception as e:  # a tracker's failure (network, disk) must not end the run
                log.warning("tracker %s failed in %s (%s: %s); the run goes on without it, metrics.jsonl keeps "
                            "every figure", tracker.name, method, type(e).__name__, e)
                self.trackers.remove(tracker)
                self._close(tracker)

    @staticmethod
    def _close(tracker: Tracker) -> None:
        try:
            tracker.close()
        except Exception as e:
            log.warning("tracker %s did not close cleanly (%s: %s)", tracker.name, type(e).__name__, e)

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        for tracker in self.trackers:
            self._close(tracker)
        self.trackers = []

"""Step metrics to JSONL and TensorBoard in the run directory."""

from __future__ import annotations

import json
from pathlib import Path


class RunLogger:
    """Appends ``{"step": s, **metrics}`` lines to ``metrics.jsonl`` and writes TensorBoard
    scalars under ``tb/``. ``prefix`` namespaces scalars (``train/``, ``eval/``)."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"))

    def log(self, step: int, metrics: dict[str, float], prefix: str = "train", jsonl: bool = True) -> None:
        """Log one row; ``jsonl=False`` writes TensorBoard only (replaying a restored log)."""
        if jsonl:
            self._jsonl.write(json.dumps({"step": step, "kind": prefix, **metrics}) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                self._tb.add_scalar(f"{prefix}/{key}", value, step)

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()

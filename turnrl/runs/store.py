"""The rollout files of a run: ``RUN/rollouts/KIND/step-NNNNNN.jsonl.gz``, one gzip'd JSON Lines
file per step and kind (``turnrl.runs.rollouts.KINDS``), one episode record a line.

A step's file is written whole or not at all (a temporary file renamed into place), so a run
killed mid-write leaves the steps before it readable. A resumed run first removes the files of
the steps after its checkpoint (``drop_after``), then writes those steps again: the files hold
each step once.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from turnrl.runs.rollouts import KINDS, EpisodeRecord

_STEP_FILE = re.compile(r"step-(\d+)\.jsonl\.gz")


def rollouts_dir(run_dir: str | Path) -> Path:
    """``RUN/rollouts``."""
    return Path(run_dir) / "rollouts"


def step_path(run_dir: str | Path, kind: str, step: int) -> Path:
    """The file of one step's records of ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return rollouts_dir(run_dir) / kind / f"step-{step:06d}.jsonl.gz"


def write_step(run_dir: str | Path, kind: str, step: int, records: Iterable[EpisodeRecord],
               compresslevel: int = 1) -> Path:
    """Write one step's records (replacing any file of that step) atomically; returns its path."""
    path = step_path(run_dir, kind, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    lines = "".join(json.dumps(r.to_json(), ensure_ascii=False, separators=(",", ":")) + "\n" for r in records)
    with gzip.open(tmp, "wb", compresslevel=compresslevel) as f:
        f.write(lines.encode("utf-8"))
    os.replace(tmp, path)
    return path


def rollout_steps(run_dir: str | Path, kind: str = "train") -> list[int]:
    """The steps of ``kind`` with a file under ``run_dir``, ascending."""
    folder = step_path(run_dir, kind, 0).parent
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.fullmatch(p.name)))


def drop_after(run_dir: str | Path, step: int) -> list[int]:
    """Remove every kind's files of steps after ``step`` (and unfinished temporary files);
    returns the train steps removed."""
    removed = []
    for kind in KINDS:
        for s in rollout_steps(run_dir, kind):
            if s > step:
                step_path(run_dir, kind, s).unlink()
                if kind == "train":
                    removed.append(s)
        folder = step_path(run_dir, kind, 0).parent
        if folder.is_dir():
            for tmp in folder.glob("*.tmp"):
                tmp.unlink()
    return removed


def load_rollouts(run_dir: str | Path, kind: str = "train", steps: Iterable[int] | None = None
                  ) -> Iterator[EpisodeRecord]:
    """The kept episodes of a run, step by step in ascending order, each a typed
    ``EpisodeRecord``.

    Args:
        run_dir: the run's output folder (the one holding ``rollouts/``).
        kind: ``"train"`` (the episodes each step trained on) or ``"eval"`` (held-out).
        steps: only these steps (default: every step with a file).

    Raises:
        FileNotFoundError: When ``run_dir`` keeps no rollouts of ``kind``.
        ValueError: On a record of another format version.
    """
    available = rollout_steps(run_dir, kind)
    if not available:
        raise FileNotFoundError(f"{rollouts_dir(run_dir) / kind} holds no rollout files: the run kept none "
                                "(trainer.rollouts.every=0, or no step finished), or this is not a run dir")
    wanted = available if steps is None else sorted(set(steps) & set(available))
    for step in wanted:
        with gzip.open(step_path(run_dir, kind, step), "rt", encoding="utf-8") as f:
            for line in f:
                yield EpisodeRecord.from_json(json.loads(line))

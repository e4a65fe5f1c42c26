"""Resumable checkpoints: everything a run needs to continue exactly, saved atomically.

Every ``trainer.checkpoint_every`` steps the trainer writes ``RUN_DIR/checkpoints/step-NNNNNNNN/``:

- ``model/``: ``save_pretrained`` of the policy and its tokenizer (also a valid ``agent.path``);
- ``modules.pt``: state dicts of the other trained or frozen modules (the KL reference model,
  a separate critic, a shared value head, a learned reward model), by name;
- ``optimizers.pt``: optimizer state dicts, by name (``policy``, ``critic``);
- ``metrics.jsonl``: the run's metrics log up to and including that step (the logger's
  position: a resume rewrites the run's log to it, so no line is ever duplicated);
- ``config.yaml``: the config of the run (a resume warns about keys that changed);
- ``state.pt``: a ``TrainingState`` (step, KL coefficient, the RNG states; the task RNG's state
  is the data cursor). Written last.

Atomicity: a checkpoint is written into a sibling ``.tmp-step-...`` folder, every file is
fsynced, and the folder is renamed to ``step-NNNNNNNN`` in one ``os.replace``. Only complete
checkpoints carry that name, so a crash at any point of a save (even SIGKILL) leaves the
previous checkpoint intact and the latest complete one is what ``latest_checkpoint`` finds.
Older checkpoints are deleted only after the new one is in place; a leftover temporary
folder is deleted by the next save.

In-flight rollouts: in the synchronous loop a step collects its rollouts, updates on them
and drops them before the step ends, so none is in flight at a checkpoint. With
asynchronous rollouts (``turnrl.rollout.pipeline``) the batches of the next ``k`` steps are
already being sampled with older weights; the trainer lets them finish (``drain``) and saves
them in ``rollouts.pt`` (one list of ``RolloutBatch`` per process), with the sampler's RNG
and the task cursor as they are after them, so the resumed pipeline goes on exactly.

Several processes (``trainer.accelerate``): the main process writes the checkpoint; the
sampling and global RNG states of every process are gathered into ``TrainingState.ranks``,
and each process restores its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from turnrl.rng import global_rng_state, set_global_rng_state

CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "state.pt"
MODEL_DIR = "model"
LOG_FILE = "metrics.jsonl"
ROLLOUTS_FILE = "rollouts.pt"
_TMP_PREFIX = ".tmp-"
_NAME = re.compile(r"^step-(\d{8,})$")


@dataclass
class TrainingState:
    """The loop's own state between two steps (everything but modules and optimizers).

    Attributes:
        step: RL steps completed.
        kl_coef: the KL controller's current coefficient.
        task_rng: ``bit_generator.state`` of the task RNG (the data cursor).
        policy_rng: state of the policy's sampling generator.
        global_rng: ``global_rng_state()`` (torch, CUDA, numpy and python ``random``).
        model_training: whether the policy was in train mode.
        dtype: the policy's parameter dtype (``"float32"``, ...), to reload it in.
        warned: keys of the once-per-run warnings already given.
        ranks: with several processes, ``{"policy_rng", "global_rng"}`` of each process by
            rank (``policy_rng`` and ``global_rng`` above are rank 0's); empty with one.
    """

    step: int
    kl_coef: float
    task_rng: dict
    policy_rng: torch.Tensor
    global_rng: dict
    model_training: bool = True
    dtype: str = "float32"
    warned: list[str] = field(default_factory=list)
    ranks: list[dict] = field(default_factory=list)

    def rank_rngs(self, rank: int, world: int) -> tuple[torch.Tensor, dict]:
        """``(policy_rng, global_rng)`` of process ``rank`` of ``world``.

        Raises:
            ValueError: If the checkpoint was saved by another number of processes.
        """
        saved = max(len(self.ranks), 1)
        if saved != world:
            raise ValueError(f"the checkpoint was saved by {saved} process(es) and is resumed by {world}; the "
                             "sampling RNG streams are per process, so resume with the same number of processes")
        if not self.ranks:
            return self.policy_rng, self.global_rng
        return self.ranks[rank]["policy_rng"], self.ranks[rank]["global_rng"]


@dataclass
class Checkpoint:
    """A checkpoint read back by ``read_checkpoint``."""

    path: Path
    state: TrainingState
    modules: dict[str, dict]
    optimizers: dict[str, dict]
    log_text: str
    config_yaml: str
    rollouts: list[list] = field(default_factory=list)

    def pending_rollouts(self, rank: int) -> list:
        """The in-flight ``RolloutBatch`` es process ``rank`` saved (none for a synchronous run)."""
        return list(self.rollouts[rank]) if rank < len(self.rollouts) else []

    @property
    def model_dir(self) -> Path:
        """The ``save_pretrained`` folder of the policy and tokenizer."""
        return self.path / MODEL_DIR

    def module(self, name: str) -> dict:
        """The state dict saved under ``name``; a clear error when there is none."""
        return _pick(self.modules, name, "module", self.path)

    def optimizer(self, name: str) -> dict:
        """The optimizer state saved under ``name``; a clear error when there is none."""
        return _pick(self.optimizers, name, "optimizer", self.path)

    def log_rows(self) -> list[dict]:
        """The saved metrics log, one dict per line."""
        return [json.loads(line) for line in self.log_text.splitlines() if line.strip()]

    def history(self) -> tuple[list[dict], list[tuple[int, dict]]]:
        """``(train, evals)`` as ``TrainResult`` holds them, rebuilt from the saved log."""
        train, evals = [], []
        for row in self.log_rows():
            kind = row.pop("kind", "train")
            if kind == "train":
                train.append(row)
            elif kind == "eval":
                step = row.pop("step")
                evals.append((step, row))
        return train, evals


def _pick(saved: dict, name: str, what: str, path: Path) -> dict:
    if name not in saved:
        raise ValueError(f"checkpoint {path} has no {what} {name!r} (it has {sorted(saved)}); it was saved by a "
                         "run with other algorithm settings: resume with the config it was saved with")
    return saved[name]


def step_dir_name(step: int) -> str:
    """``step-00000012``: zero-padded so names sort by step."""
    return f"step-{step:08d}"


def write_checkpoint(run_dir: str | Path, state: TrainingState, model, tokenizer, modules: dict[str, dict],
                     optimizers: dict[str, dict], config_yaml: str, keep: int = 1,
                     after_write: Callable[[Path], None] | None = None, rollouts: list[list] | None = None) -> Path:
    """Write a checkpoint of ``state.step`` atomically into ``run_dir/checkpoints``.

    Args:
        run_dir: the run folder; its ``metrics.jsonl`` (if any) is copied in.
        state: the loop state.
        model: the policy (``save_pretrained``).
        tokenizer: its tokenizer (``save_pretrained``).
        modules: state dicts of the other modules, by name.
        optimizers: optimizer state dicts, by name.
        config_yaml: the run's config as YAML.
        keep: complete checkpoints to keep (the newest); older ones are deleted after this
            one is in place.
        after_write: called with the path of each file or folder once it is written inside
            the temporary folder (a hook for progress or for testing a crash mid-save); an
            exception it raises aborts the save and removes the temporary folder.
        rollouts: in-flight rollout batches of an asynchronous run, one list per process
            (written to ``rollouts.pt``; None or empty writes nothing).

    Returns:
        The checkpoint folder.

    Raises:
        ValueError: If ``keep < 1``, or a checkpoint of this step already exists.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the checkpoint just written is kept), got {keep}")
    run_dir = Path(run_dir)
    root = run_dir / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(state.step)
    if final.exists():
        raise ValueError(f"a checkpoint of step {state.step} already exists at {final}; resume from the latest "
                         "checkpoint of a run, or into a fresh run dir")
    tmp = root / f"{_TMP_PREFIX}{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()

    def wrote(path: Path) -> None:
        if after_write is not None:
            after_write(path)

    try:
        model.save_pretrained(tmp / MODEL_DIR)
        tokenizer.save_pretrained(tmp / MODEL_DIR)
        wrote(tmp / MODEL_DIR)
        torch.save(modules, tmp / "modules.pt")
        wrote(tmp / "modules.pt")
        torch.save(optimizers, tmp / "optimizers.pt")
        wrote(tmp / "optimizers.pt")
        log = run_dir / LOG_FILE
        (tmp / LOG_FILE).write_bytes(log.read_bytes() if log.exists() else b"")
        wrote(tmp / LOG_FILE)
        (tmp / "config.yaml").write_text(config_yaml, encoding="utf-8")
        wrote(tmp / "config.yaml")
        if rollouts and any(rollouts):
            torch.save(rollouts, tmp / ROLLOUTS_FILE)
            wrote(tmp / ROLLOUTS_FILE)
        torch.save(asdict(state), tmp / STATE_FILE)
        wrote(tmp / STATE_FILE)
        _fsync_tree(tmp)
        os.replace(tmp, final)
        _fsync(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(root, keep)
    return final


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint folder written by ``write_checkpoint``.

    Raises:
        ValueError: If ``path`` is not a complete checkpoint.
    """
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise ValueError(f"{path} is not a complete checkpoint (no {STATE_FILE}); give a checkpoints/step-N folder")
    state = TrainingState(**torch.load(path / STATE_FILE, weights_only=True))
    return Checkpoint(
        path=path, state=state,
        modules=torch.load(path / "modules.pt", weights_only=True),
        optimizers=torch.load(path / "optimizers.pt", weights_only=True),
        log_text=(path / LOG_FILE).read_text(encoding="utf-8"),
        config_yaml=(path / "config.yaml").read_text(encoding="utf-8"),
        # trajectories (dataclasses) are pickled: only load checkpoints you trust, as with any .pt
        rollouts=torch.load(path / ROLLOUTS_FILE, weights_only=False) if (path / ROLLOUTS_FILE).is_file() else [],
    )


def checkpoint_steps(run_dir: str | Path) -> dict[int, Path]:
    """The complete checkpoints under ``run_dir/checkpoints``, by step (temporary folders of
    interrupted saves are not among them)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    found = {}
    if root.is_dir():
        for child in root.iterdir():
            match = _NAME.match(child.name)
            if match and (child / STATE_FILE).is_file():
                found[int(match.group(1))] = child
    return dict(sorted(found.items()))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint of the highest step under ``run_dir``, or None."""
    steps = checkpoint_steps(run_dir)
    return steps[max(steps)] if steps else None


def resolve_resume(resume: str | bool | None, run_dir: str | Path) -> Path | None:
    """The checkpoint folder ``trainer.resume`` names, or None to start fresh.

    Args:
        resume: None, ``""`` or false: start fresh. ``true`` or ``latest``: the latest
            checkpoint in ``run_dir`` (None when it has none yet, so the same command line
            starts a run and resumes it). Else a path: a checkpoint folder (``.../step-N``)
            or a run dir whose latest checkpoint is taken.
        run_dir: this run's folder.

    Raises:
        ValueError: If a path is given that holds no complete checkpoint.
    """
    if resume is None or resume is False:
        return None
    text = str(resume).strip()
    if text.lower() in ("", "false", "none", "null"):
        return None
    if text.lower() in ("true", "latest"):
        return latest_checkpoint(run_dir)
    path = Path(text).expanduser()
    if (path / STATE_FILE).is_file():
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise ValueError(f"trainer.resume={text!r} is neither a checkpoint folder (with {STATE_FILE}) nor a run dir "
                         f"with {CHECKPOINTS_DIR}/step-N checkpoints; give one of those, or true for this run dir")
    return latest


def restore_log(run_dir: str | Path, checkpoint: Checkpoint) -> None:
    """Make ``run_dir``'s metrics log the checkpoint's (atomically) and drop its TensorBoard
    events (the trainer replays the log into fresh ones), so nothing after the checkpoint's
    step survives and nothing is written twice."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f"{_TMP_PREFIX}{LOG_FILE}"
    tmp.write_text(checkpoint.log_text, encoding="utf-8")
    os.replace(tmp, run_dir / LOG_FILE)
    shutil.rmtree(run_dir / "tb", ignore_errors=True)


def set_aside_log(run_dir: str | Path) -> None:
    """Before a run that starts afresh in ``run_dir`` although it was asked to resume
    (``trainer.resume=true`` found no complete checkpoint: the run before was stopped before its
    first one), move that run's metrics log and TensorBoard events aside (``*.before-restart``),
    so the new log holds each step once and the old one is not lost."""
    run_dir = Path(run_dir)
    for name in (LOG_FILE, "tb"):
        old = run_dir / name
        if old.exists():
            aside = run_dir / f"{name}.before-restart"
            shutil.rmtree(aside, ignore_errors=True) if aside.is_dir() else aside.unlink(missing_ok=True)
            os.replace(old, aside)


def _prune(root: Path, keep: int) -> None:
    for child in root.iterdir():
        if child.name.startswith(_TMP_PREFIX):
            shutil.rmtree(child, ignore_errors=True)
    steps = checkpoint_steps(root.parent)
    for step in list(steps)[:-keep]:
        shutil.rmtree(steps[step], ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            _fsync(Path(dirpath) / name)
        _fsync(Path(dirpath))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_due(step: int, every: int) -> bool:
    """Whether a resumable checkpoint follows update ``step`` (``trainer.checkpoint_every``; 0 = never)."""
    return bool(every) and step % every == 0


@dataclass
class Restored:
    """The loop's position after ``restore``: the step done, the metrics history up to it
    (``TrainResult.train`` / ``evals``) and the once-per-run warnings already given."""

    step: int
    train: list[dict]
    evals: list[tuple[int, dict]]
    warned: list[str]


def save(run_dir: str | Path, step: int, *, model, tokenizer, algorithm, source, warned: set[str], config_yaml: str,
         keep: int, pending: list, extra_modules: dict[str, dict] | None = None, rank: int = 0, world: int = 1,
         gather: Callable[[list], list] | None = None) -> Path | None:
    """Save a resumable checkpoint after update ``step``; every process calls it (their RNG
    states and in-flight rollouts are gathered), the main one writes.

    Args:
        model, tokenizer: the policy.
        algorithm: its ``state() -> (modules, optimizers, kl_coef)`` (``turnrl.train.algorithm``).
        source: the rollout source; ``source.state()`` gives the task cursor and sampling RNG
            (taken after ``drain``, with the sampler at rest).
        warned: the once-per-run warnings given so far.
        pending: this process's in-flight rollouts (``source.drain(step)``).
        extra_modules: state dicts of modules outside the algorithm (a learned reward model).

    Returns:
        The checkpoint folder (main process), else None.
    """
    source_state = source.state()
    rngs = {"policy_rng": source_state["policy_rng"], "global_rng": global_rng_state()}
    ranks, rollouts = [rngs], [pending]
    if gather is not None:
        ranks, rollouts = gather([rngs]), gather([pending])
    if rank != 0:
        return None
    modules, optimizers, kl_coef = algorithm.state()
    modules.update(extra_modules or {})
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    state = TrainingState(step=step, kl_coef=kl_coef, task_rng=source_state["task_rng"],
                          policy_rng=ranks[0]["policy_rng"], global_rng=ranks[0]["global_rng"],
                          model_training=model.training, dtype=dtype, warned=sorted(warned),
                          ranks=ranks if world > 1 else [])
    return write_checkpoint(run_dir, state, model, tokenizer, modules, optimizers, config_yaml, keep=keep,
                            rollouts=rollouts)


def restore(ckpt: Checkpoint, *, algorithm, source, rank: int = 0, world: int = 1) -> Restored:
    """Put every module, optimizer, the KL coefficient, the task cursor, this process's RNGs
    and in-flight rollouts back as they were at ``ckpt`` (the policy's weights were loaded
    with the model). Call it last before the loop: nothing may draw from an RNG after it.

    Raises:
        ValueError: If the checkpoint was saved by another number of processes, or it holds
            in-flight rollouts and the source is synchronous.
    """
    algorithm.load_state(ckpt)
    policy_rng, global_rng = ckpt.state.rank_rngs(rank, world)
    source.restore(ckpt.state.step, {"task_rng": ckpt.state.task_rng, "policy_rng": policy_rng},
                   ckpt.pending_rollouts(rank))
    set_global_rng_state(global_rng)
    train, evals = ckpt.history()
    return Restored(ckpt.state.step, train, evals, list(ckpt.state.warned))

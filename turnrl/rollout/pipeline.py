"""Asynchronous rollouts with bounded staleness: collection overlaps learning.

A background thread collects the rollouts of step ``s`` with the policy weights of update
``v(s) = max(0, s - 1 - k)`` while the learner runs updates ``s - k .. s - 1``; ``k`` is the
maximum policy-version lag (``trainer.max_staleness``). The schedule is fixed, not "whatever
weights are newest": each batch's version depends only on ``s`` and ``k``, so a run is
reproducible and resumable exactly, and

- ``k = 0`` is the synchronous algorithm: batch ``s`` is sampled with the weights of update
  ``s - 1``, after it, from the same RNG streams in the same order (tested to give the same
  trajectories, metrics and parameters as the synchronous loop);
- ``k >= 1`` lets the sampler run up to ``k`` updates ahead. The learner's "old" logprobs
  are then those of a policy ``min(s - 1, k)`` updates behind, so the trainer requires
  truncated importance sampling (``algorithm.tis``): the PPO ratio is taken against the
  learner's own logprobs before the update (the proximal policy) and each token is weighted
  by ``min(pi_proximal / pi_sampler, cap)`` (decoupled PPO), which corrects for the lag.

The learner publishes a snapshot of its weights after each update (``publish``); the worker
loads the snapshot its next batch needs into its own sampler (a copy of the policy, or a
vLLM engine via the policy's ``load_weights``) between batches, never during generation.
At most ``k + 1`` snapshots and ``k + 1`` finished batches are held at once.

Checkpoints: ``drain(step)`` waits until every batch that needs no weights newer than
update ``step - 1`` is collected (batches ``step + 1 .. step + k``, the ones "in flight" at a
checkpoint after ``step``) and returns them; the worker then waits for ``publish(step)``, so
its RNG and the task cursor are at rest and can be saved with those batches. A resumed
pipeline starts from them (``pending``) and goes on exactly as the uninterrupted one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from turnrl.rollout.collector import Task
from turnrl.rollout.trajectory import Trajectory


@dataclass
class RolloutBatch:
    """One step's rollouts and how they were made.

    Attributes:
        step: the RL step (1-based) that trains on them.
        policy_version: updates the sampler's weights had seen (``max(0, step - 1 - k)``).
        tasks: the step's tasks (this process's share).
        trajectories: ``len(tasks) * group_size`` grouped trajectories.
        rollout_time: seconds the worker spent collecting them.
    """

    step: int
    policy_version: int
    tasks: list[Task]
    trajectories: list[Trajectory]
    rollout_time: float = 0.0

    @property
    def staleness(self) -> int:
        """Policy-version lag at the step's update: ``(step - 1) - policy_version``."""
        return self.step - 1 - self.policy_version


def policy_version(step: int, max_staleness: int) -> int:
    """The weights (updates seen) that step ``step``'s rollouts are sampled with."""
    return max(0, step - 1 - max_staleness)


@dataclass
class _Shared:
    """State guarded by the pipeline's condition variable."""

    snapshots: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    ready: dict[int, RolloutBatch] = field(default_factory=dict)
    next_step: int = 1  # the next step the worker collects
    waiting_for: int | None = None  # the version the worker is blocked on
    error: BaseException | None = None
    stop: bool = False


class AsyncRollouts:
    """Collects steps ``first .. last`` in a background thread, ``max_staleness`` ahead at most.

    Args:
        collect: ``collect(step) -> (tasks, trajectories)``: draws the step's tasks and rolls
            them out with ``sampler`` (called in the worker thread only, in step order).
        load_weights: ``load_weights(state_dict)``: puts a published snapshot into the sampler
            (called in the worker thread, between batches).
        max_staleness: ``k >= 0``.
        first: the first step to collect (1, or the step after a checkpoint's in-flight
            batches).
        last: the last step to collect.
        version: the weights the sampler holds now (updates seen): 0 at the start of a run,
            the checkpoint's step on resume.
        pending: batches collected before a checkpoint (``drain``), handed out first.
        state_of: the weights ``publish`` snapshots of a model (default ``state_dict()``; a
            vLLM sampler takes ``merged_state_dict``, LoRA adapters merged).
    """

    def __init__(self, collect: Callable[[int], tuple[list[Task], list[Trajectory]]],
                 load_weights: Callable[[dict[str, torch.Tensor]], None], max_staleness: int, first: int,
                 last: int, version: int = 0, pending: list[RolloutBatch] | None = None,
                 state_of: Callable[[torch.nn.Module], dict[str, torch.Tensor]] | None = None):
        if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
            raise ValueError(f"max_staleness must be an int >= 0 (0 = synchronous), got {max_staleness!r}")
        pending = list(pending or [])
        expected = list(range(first - len(pending), first))
        if [b.step for b in pending] != expected:
            raise ValueError(f"pending batches must be of steps {expected} (the ones before first={first}), "
                             f"got {[b.step for b in pending]}")
        self.k = max_staleness
        self._collect, self._load = collect, load_weights
        self._last, self._version = last, version
        self._state_of = state_of or (lambda model: model.state_dict())
        self._cv = threading.Condition()
        self._s = _Shared(ready={b.step: b for b in pending}, next_step=first)
        self._thread = threading.Thread(target=self._run, name="turnrl-rollouts", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- learner side
    def publish(self, version: int, model: torch.nn.Module) -> None:
        """Make the weights after update ``version`` available (a detached copy is taken now)."""
        needed = {policy_version(s, self.k) for s in range(self._s.next_step, self._last + 1)}
        if version not in needed:  # no future batch samples with these weights
            return
        snapshot = {k: v.detach().clone() for k, v in self._state_of(model).items()}
        with self._cv:
            self._s.snapshots[version] = snapshot
            self._cv.notify_all()

    def next(self, step: int) -> tuple[RolloutBatch, float]:
        """Block until step ``step``'s batch is collected; return it and the seconds waited.

        Raises:
            RuntimeError: If the worker failed (its exception is the cause), or ``step``'s
                batch can never come (its weights were not published: a learner bug).
        """
        t0 = time.perf_counter()
        with self._cv:
            while step not in self._s.ready:
                self._raise_if_failed()
                w = self._s.waiting_for
                if w is not None and w < step and w not in self._s.snapshots:
                    raise RuntimeError(f"the rollout worker waits for the weights of update {w}, which were never "
                                       f"published, while step {step} waits for rollouts; call publish({w}, model)")
                self._cv.wait(timeout=1.0)
            batch = self._s.ready.pop(step)
            self._cv.notify_all()
        return batch, time.perf_counter() - t0

    def drain(self, step: int) -> list[RolloutBatch]:
        """After update ``step`` (before ``publish(step)``): wait until the batches that need
        no newer weights are collected, and return copies of them (steps ``step + 1 ..``).
        The worker is then idle until ``publish(step)``, so its RNG states can be saved."""
        with self._cv:
            while True:
                self._raise_if_failed()
                done = self._s.next_step > self._last or self._s.waiting_for == step
                if done:
                    return [self._s.ready[s] for s in sorted(self._s.ready)]
                self._cv.wait(timeout=1.0)

    def close(self) -> None:
        """Stop the worker after its current batch (it is a daemon thread: exit never waits)."""
        with self._cv:
            self._s.stop = True
            self._cv.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)  # a batch in progress finishes on its own (daemon)

    def _raise_if_failed(self) -> None:
        if self._s.error is not None:
            raise RuntimeError(f"the rollout worker failed: {self._s.error!r}") from self._s.error

    # ---------------------------------------------------------------- worker side
    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    step = self._s.next_step
                    if step > self._last or self._s.stop:
                        return
                    want = policy_version(step, self.k)
                    snapshot = None
                    if want != self._version:
                        self._s.waiting_for = want
                        self._cv.notify_all()
                        while want not in self._s.snapshots and not self._s.stop:
                            self._cv.wait()
                        if self._s.stop:
                            return
                        snapshot = self._s.snapshots[want]
                        for v in [v for v in self._s.snapshots if v <= want]:
                            del self._s.snapshots[v]
                        self._s.waiting_for = None
                if snapshot is not None:
                    self._load(snapshot)
                    self._version = want
                t0 = time.perf_counter()
                tasks, trajectories = self._collect(step)
                batch = RolloutBatch(step, want, tasks, trajectories, time.perf_counter() - t0)
                with self._cv:
                    self._s.ready[step] = batch
                    self._s.next_step = step + 1
                    self._cv.notify_all()
        except BaseException as exc:  # handed to the learner by next()/drain()
            with self._cv:
                self._s.error = exc
                self._cv.notify_all()

"""Where each RL step's rollouts come from: one interface over the synchronous loop and the
asynchronous pipeline, and over every sampler (the learner's own model, a copy of it, a vLLM
engine, rollout servers). The train loop calls, per step:

- ``next(step) -> (RolloutBatch, seconds_waited)``: step ``step``'s rollouts (1-based);
- ``after_update(step, model)``: the learner finished update ``step``; the sampler gets the
  new weights (synchronous: now; asynchronous: published for the steps that need them);

and, for checkpoints and the end of the run,

- ``drain(step)``: before a checkpoint after update ``step``: the rollouts already in
  flight (asynchronous: steps ``step + 1 .. step + k``), finished and returned, with the
  sampler at rest so that ``state()`` can be saved; ``[]`` for the synchronous loop;
- ``state()`` / ``restore(step, state, pending)``: the task cursor and sampling RNG, and a
  resumed run's in-flight rollouts;
- ``close()``: stop the worker and the sampler (idempotent).

``eval_policy`` is the policy held-out evaluation samples with: the sampler itself when it
holds the learner's weights at every evaluation (synchronous rollouts), else the learner's
own model.

``rollout_source`` builds the right one from the config: the only place that knows which
sampler and which pipeline a run has.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from turnrl.rollout.trajectory import assert_trainable
from turnrl.policies.sampling import SamplingParams
from turnrl.policies.weights import merged_state_dict
from turnrl.train.factories import rollout_policy
from turnrl.train.checkpoint import is_due
from turnrl.algorithms.distributed import shard_list
from turnrl.rollout.collector import RolloutCollector, Task
from turnrl.rollout.pipeline import AsyncRollouts, RolloutBatch
from turnrl.train.stages import PreRL, engine_agreement

log = logging.getLogger(__name__)


class TaskStream:
    """The training tasks of each step, drawn from one seeded RNG (its state is the data
    cursor a checkpoint saves)."""

    def __init__(self, seed: int, tasks_per_step: int):
        self.rng = np.random.default_rng(seed)
        self.tasks_per_step = tasks_per_step

    def draw(self) -> list[Task]:
        """The next step's ``tasks_per_step`` train-split tasks."""
        return [Task(seed=int(self.rng.integers(2**31)), split="train") for _ in range(self.tasks_per_step)]


class _Source:
    """What both sources share: drawing a step's tasks and rolling out this process's share."""

    def __init__(self, collector: RolloutCollector, tasks: TaskStream, group_size: int,
                 sampling_at: Callable[[int], SamplingParams], rank: int, world: int):
        self.collector, self.tasks, self.sampler = collector, tasks, collector.policy
        self.group_size, self.sampling_at, self.rank, self.world = group_size, sampling_at, rank, world

    def collect(self, step: int) -> RolloutBatch:
        """Draw step ``step``'s tasks and roll out this process's share of them."""
        t0 = time.perf_counter()
        tasks = self.tasks.draw()
        trajectories = self.collector.collect(shard_list(tasks, self.world, self.rank), self.group_size,
                                              self.sampling_at(step))
        return RolloutBatch(step, step - 1, tasks, trajectories, time.perf_counter() - t0)

    def sampler_metrics(self) -> dict[str, float]:
        """The sampler's own figures since the last call (rollout servers: their prefix-cache hit
        rate and sticky routing, ``ServedPolicy.step_metrics``); {} for samplers without any."""
        metrics = getattr(self.sampler, "step_metrics", None)
        return metrics() if callable(metrics) else {}

    def state(self) -> dict:
        """``{"task_rng", "policy_rng"}``: the data cursor and the sampler's RNG."""
        return {"task_rng": self.tasks.rng.bit_generator.state, "policy_rng": self.sampler.rng_state()}

    def restore(self, step: int, state: dict, pending: list[RolloutBatch]) -> None:
        """Continue after step ``step`` of a checkpoint: its ``state()`` and in-flight rollouts."""
        self.tasks.rng.bit_generator.state = state["task_rng"]
        self.sampler.set_rng_state(state["policy_rng"])

    def close(self) -> None:
        try:
            self.collector.close()
        finally:
            self.sampler.close()


class SyncRollouts(_Source):
    """Each step's rollouts sampled when the loop asks, with the weights of the update before.

    Args:
        push_weights: the sampler holds weights of its own and takes the learner's after
            every update (``sync_from``).
        sleep_during_update: a colocated vLLM engine frees its memory from the end of the
            rollouts to the end of the update (level-2 sleep), then wakes for the push.
    """

    def __init__(self, *args, push_weights: bool, sleep_during_update: bool = False):
        super().__init__(*args)
        self.push_weights, self.sleep = push_weights, sleep_during_update
        self.eval_policy = self.sampler

    def next(self, step: int) -> tuple[RolloutBatch, float]:
        batch = self.collect(step)
        assert_trainable(batch.trajectories)
        if self.sleep:
            self.sampler.sleep(level=2)
        return batch, batch.rollout_time

    def after_update(self, step: int, model) -> None:
        if self.sleep:
            self.sampler.wake_up()
        if self.push_weights:
            self.sampler.sync_from(model)

    def drain(self, step: int) -> list[RolloutBatch]:
        return []

    def restore(self, step: int, state: dict, pending: list[RolloutBatch]) -> None:
        if pending:
            raise ValueError("the checkpoint holds in-flight rollouts of an asynchronous run; resume it with "
                             "trainer.async_rollouts=true and the same trainer.max_staleness")
        super().restore(step, state, pending)


class AsyncSource(_Source):
    """Rollouts sampled in a background thread, up to ``max_staleness`` updates ahead
    (``turnrl.rollout.pipeline.AsyncRollouts``; the worker starts at the first ``next``).

    Args:
        eval_policy: the learner's own policy (the sampler runs ahead of it).
        last: the run's last step.
        checkpoint_every: the checkpoint cadence: after a checkpoint-due update the weights are
            published only once ``drain`` has saved the in-flight rollouts.
        state_of: how a published snapshot is taken of the learner's model.
    """

    def __init__(self, *args, eval_policy, max_staleness: int, last: int, checkpoint_every: int,
                 state_of: Callable | None = None):
        super().__init__(*args)
        self.eval_policy = eval_policy
        self.k, self.last, self.checkpoint_every, self.state_of = max_staleness, last, checkpoint_every, state_of
        self.pipeline: AsyncRollouts | None = None
        self._start, self._pending, self._held = 0, [], None

    def next(self, step: int) -> tuple[RolloutBatch, float]:
        if self.pipeline is None:
            self.pipeline = AsyncRollouts(self._collect, self.sampler.load_weights, self.k,
                                          first=self._start + 1 + len(self._pending), last=self.last,
                                          version=self._start, pending=self._pending, state_of=self.state_of)
        batch, waited = self.pipeline.next(step)
        assert_trainable(batch.trajectories)
        return batch, waited

    def _collect(self, step: int):
        batch = self.collect(step)
        return batch.tasks, batch.trajectories

    def after_update(self, step: int, model) -> None:
        if is_due(step, self.checkpoint_every):  # published by drain, once the in-flight rollouts are saved
            self._held = (step, model)
        else:
            self.pipeline.publish(step, model)

    def drain(self, step: int) -> list[RolloutBatch]:
        pending = self.pipeline.drain(step)
        if self._held is not None and self._held[0] == step:
            self.pipeline.publish(*self._held)
            self._held = None
        return pending

    def restore(self, step: int, state: dict, pending: list[RolloutBatch]) -> None:
        super().restore(step, state, pending)
        self._start, self._pending = step, list(pending)

    def close(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()
        super().close()


def rollout_source(run, stages: PreRL, sampling_at: Callable[[int], SamplingParams]) -> SyncRollouts | AsyncSource:
    """The rollout source of ``run.cfg``: the sampler (``agent.backend``) and the pipeline
    (``trainer.async_rollouts``). A sampler with weights of its own is given the learner's
    weights now and checked against the learner (``engine_agreement``, logged as the
    ``engine_check`` row of a fresh run) without touching its sampling RNG."""
    cfg, procs = run.cfg, run.procs
    tcfg = cfg.trainer
    sampler = run.policy
    if tcfg.async_rollouts or cfg.agent.backend != "transformers":
        workdir = Path(run.run_dir) / ("sampler" if procs.world == 1 else f"sampler{procs.rank}")
        sampler = rollout_policy(cfg, run.model, run.tokenizer, workdir, seed=cfg.seed + procs.rank, own_copy=True)
    if sampler.needs_weight_push:  # it must serve the learner's model before anything is sampled
        sampler.sync_from(run.model)
        rng = sampler.rng_state()
        check = engine_agreement(sampler, run.model, run.renderer, run.env_fn, cfg)
        sampler.set_rng_state(rng)
        if run.resumed is None:  # (a resumed run's log already holds it)
            run.logger.log(0, check, prefix="engine_check")
    collector = RolloutCollector.for_run(cfg, stages.train_env_fn, sampler, run.renderer)
    args = (collector, TaskStream(cfg.seed, tcfg.tasks_per_step), tcfg.group_size, sampling_at, procs.rank,
            procs.world)
    if not tcfg.async_rollouts:
        return SyncRollouts(*args, push_weights=sampler.needs_weight_push,
                            sleep_during_update=cfg.agent.vllm.sleep_during_update)
    return AsyncSource(*args, eval_policy=run.policy, max_staleness=tcfg.max_staleness, last=tcfg.steps,
                       checkpoint_every=tcfg.checkpoint_every, state_of=merged_state_dict)

"""Held-out evaluation: greedy episodes on the env's test split."""

from __future__ import annotations

from collections.abc import Callable

from turnrl.policies.sampling import SamplingParams
from turnrl.rollout.collector import RolloutCollector, Task
from turnrl.rollout.metrics import rollout_metrics
from turnrl.rollout.trajectory import Trajectory

EVAL_SEED_OFFSET = 1_000_000  # eval seeds never collide with training seeds' low range


def heldout_tasks(num_episodes: int) -> list[Task]:
    """The fixed held-out task list: ``num_episodes`` seeds on the ``test`` split."""
    return [Task(seed=EVAL_SEED_OFFSET + i, split="test") for i in range(num_episodes)]


def evaluate(collector: RolloutCollector, tasks: list[Task], max_new_tokens: int,
             gather: Callable[[list[Trajectory]], list[Trajectory]] | None = None
             ) -> tuple[dict[str, float], list[Trajectory]]:
    """Greedy rollouts of ``tasks`` (one each); returns ``rollout_metrics`` of them and the
    trajectories.

    With several processes each runs its share of the tasks (``turnrl.algorithms.distributed.shard_list``)
    and ``gather`` (e.g. accelerate's ``gather_object``) joins every process's trajectories in
    rank order, so every process returns the metrics and trajectories of the whole held-out set.
    """
    params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    trajectories = collector.collect(tasks, group_size=1, params=params)
    trajectories = trajectories if gather is None else gather(trajectories)
    return rollout_metrics(trajectories), trajectories

"""Held-out evaluation: greedy episodes on the env's test split."""

from __future__ import annotations

from turnrl.agents.sampling import SamplingParams
from turnrl.rollout.collector import RolloutCollector, Task
from turnrl.rollout.metrics import rollout_metrics

EVAL_SEED_OFFSET = 1_000_000  # eval seeds never collide with training seeds' low range


def heldout_tasks(num_episodes: int) -> list[Task]:
    """The fixed held-out task list: ``num_episodes`` seeds on the ``test`` split."""
    return [Task(seed=EVAL_SEED_OFFSET + i, split="test") for i in range(num_episodes)]


def evaluate(collector: RolloutCollector, tasks: list[Task], max_new_tokens: int) -> dict[str, float]:
    """Greedy rollouts of ``tasks`` (one each); returns ``rollout_metrics`` of them."""
    params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    return rollout_metrics(collector.collect(tasks, group_size=1, params=params))

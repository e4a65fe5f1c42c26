"""Rollouts: the ``Trajectory`` of an episode, the batched multi-turn collector that plays envs with a
policy (``collector``), env calls with deadlines, termination reasons, per-step metrics, the
asynchronous pipeline and the scripted experts' episodes (``scripted``)."""

from turnrl.rollout.collector import RolloutCollector, Task
from turnrl.rollout.trajectory import Trajectory

__all__ = ["RolloutCollector", "Task", "Trajectory"]

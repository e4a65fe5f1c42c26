"""Trajectories and the collector that produces them."""

from turnrl.rollout.collector import RolloutCollector, Task
from turnrl.rollout.trajectory import Trajectory

__all__ = ["RolloutCollector", "Task", "Trajectory"]

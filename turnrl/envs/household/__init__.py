"""The household env (``turnrl/Household-v0``): layout data, rules, planner, generator, env.

See ``turnrl.envs.household.env`` for the env's documentation.
"""

from turnrl.envs.household.env import HouseholdEnv
from turnrl.envs.household.game import World, normalize
from turnrl.envs.household.generate import HouseConfig, draw_task, expert_steps, generate_task
from turnrl.envs.household.layout import FAMILIES, Goal, Layout, Receptacle, Task
from turnrl.envs.household.planner import expert_command

__all__ = [
    "FAMILIES",
    "Goal",
    "HouseConfig",
    "HouseholdEnv",
    "Layout",
    "Receptacle",
    "Task",
    "World",
    "draw_task",
    "expert_command",
    "expert_steps",
    "generate_task",
    "normalize",
]

"""The household env (``turnrl/Household-v0``): layout data, rules, planner, generator, env.

See ``turnrl.envs.games.household.env`` for the env's documentation.
"""

from turnrl.envs.games.household.env import HouseholdEnv
from turnrl.envs.games.household.game import World, normalize
from turnrl.envs.games.household.generate import HouseConfig, draw_task, expert_steps, generate_task
from turnrl.envs.games.household.layout import FAMILIES, Goal, Layout, Receptacle, Task
from turnrl.envs.games.household.planner import expert_command

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

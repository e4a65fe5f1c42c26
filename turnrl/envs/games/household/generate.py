"""Procedural household tasks: ``generate_task(rng, split, config)`` (and ``draw_task``).

A draw, all from ``rng``:

1. rooms: the kitchen plus ``rooms - 1`` others, shuffled; each room after the first gets a
   door to a random earlier room (a tree, so the way between two rooms is unique);
2. receptacles: each room's fixed kinds plus a draw of extras (``receptacles`` range);
   the desklamp stands on a random desk or sidetable (a house without one has no lamp);
3. the goal: a family from ``families`` (``look`` only with a lamp), an eligible object
   kind, and a target kind among the house's receptacle kinds (not the family's appliance);
4. objects: ``count`` goal objects (``+ extra_goal_objects`` drawn from ``[0, 1]``), never in
   a target receptacle, and ``distractors`` objects of other kinds, all in random receptacles;
5. a random start room.

A draw is kept when its split (``Task.split``) is the one asked for and the scripted expert
(``planner``) solves it in ``[min_expert_steps, max_expert_steps]`` commands; otherwise it
is redrawn (``MAX_DRAWS`` times at most).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from turnrl.envs.games.household.game import World
from turnrl.envs.games.household.layout import (
    APPLIANCE,
    ELIGIBLE,
    FAMILIES,
    LAMP_KINDS,
    OBJECT_KINDS,
    ROOM_KINDS,
    ROOM_NAMES,
    Goal,
    Layout,
    Receptacle,
    Task,
)
from turnrl.envs.games.household.planner import expert_command

MAX_DRAWS = 2000


@dataclass(frozen=True)
class HouseConfig:
    """Generation ranges (inclusive ``(low, high)`` pairs) and filters.

    Attributes:
        rooms: Number of rooms (1..5).
        receptacles: Extra receptacles per room beyond its fixed ones.
        distractors: Objects of non-goal kinds.
        families: Task families to draw from (subset of ``FAMILIES``).
        min_expert_steps: Shortest expert solution kept.
        max_expert_steps: Longest expert solution kept.
    """

    rooms: tuple[int, int] = (2, 3)
    receptacles: tuple[int, int] = (1, 3)
    distractors: tuple[int, int] = (4, 8)
    families: tuple[str, ...] = FAMILIES
    min_expert_steps: int = 6
    max_expert_steps: int = 30

    def __post_init__(self) -> None:
        for name, most in (("rooms", len(ROOM_NAMES)), ("receptacles", None), ("distractors", None)):
            low_high = getattr(self, name)
            if (not isinstance(low_high, (tuple, list)) or len(low_high) != 2
                    or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in low_high)):
                raise ValueError(f"{name} must be a (low, high) pair of ints, got {low_high!r}")
            low, high = int(low_high[0]), int(low_high[1])
            floor = 1 if name == "rooms" else 0
            if not floor <= low <= high or (most is not None and high > most):
                bound = f" and high <= {most}" if most is not None else ""
                raise ValueError(f"{name} must satisfy {floor} <= low <= high{bound}, got {low_high!r}")
            object.__setattr__(self, name, (low, high))
        families = tuple(self.families)
        unknown = [f for f in families if f not in FAMILIES]
        if not families or unknown:
            raise ValueError(f"families must be a non-empty subset of {FAMILIES}, got {self.families!r}")
        object.__setattr__(self, "families", families)
        if not 1 <= self.min_expert_steps <= self.max_expert_steps:
            raise ValueError(f"need 1 <= min_expert_steps <= max_expert_steps, got "
                             f"{self.min_expert_steps} and {self.max_expert_steps}")


def generate_task(rng: np.random.Generator, split: str, config: HouseConfig) -> Task:
    """Draw a task of ``split`` (see the module docstring for the recipe and the redraws)."""
    for _ in range(MAX_DRAWS):
        task = draw_task(rng, config)
        if task is None or task.split != split:
            continue
        steps = expert_steps(task, limit=config.max_expert_steps)
        if steps is not None and steps >= config.min_expert_steps:
            return task
    raise RuntimeError(
        f"no {split!r} household task found in {MAX_DRAWS} draws with {config}; widen the ranges "
        "(more rooms, receptacles) or the [min_expert_steps, max_expert_steps] window"
    )


def expert_steps(task: Task, limit: int) -> int | None:
    """Commands the expert needs to solve ``task``; None when it takes more than ``limit``."""
    w = World(task)
    for step in range(1, limit + 1):
        if w.execute(expert_command(w)) is None:  # pragma: no cover - the planner only emits admissible commands
            raise RuntimeError(f"the household planner emitted an inadmissible command in {task.task_id}")
        if w.goal_met():
            return step
    return None


def _pick(rng: np.random.Generator, items) -> object:
    items = list(items)
    return items[int(rng.integers(len(items)))]


def draw_task(rng: np.random.Generator, config: HouseConfig) -> Task | None:
    """One unfiltered draw (steps 1-5 of the module docstring; either split, any expert
    length); None when no family of ``config.families`` fits the house (``look`` without a lamp)."""
    n_rooms = int(rng.integers(config.rooms[0], config.rooms[1] + 1))
    others = [r for r in ROOM_NAMES if r != "kitchen"]
    chosen = ["kitchen"] + [others[i] for i in rng.permutation(len(others))[: n_rooms - 1]]
    rooms = tuple(chosen[i] for i in rng.permutation(n_rooms))
    doors = tuple((rooms[int(rng.integers(i))], rooms[i]) for i in range(1, n_rooms))

    counters: dict[str, int] = {}
    receptacles: list[Receptacle] = []
    for room in rooms:
        fixed, extras = ROOM_KINDS[room]
        n_extra = int(rng.integers(config.receptacles[0], config.receptacles[1] + 1))
        picked = [extras[i] for i in sorted(rng.permutation(len(extras))[:n_extra])]
        for kind in (*fixed, *picked):
            counters[kind] = counters.get(kind, 0) + 1
            receptacles.append(Receptacle(f"{kind} {counters[kind]}", kind, room))
    lamp_spots = [r.name for r in receptacles if r.kind in LAMP_KINDS]
    lamp = _pick(rng, lamp_spots) if lamp_spots else None

    families = [f for f in config.families if f != "look" or lamp is not None]
    if not families:
        return None
    family = _pick(rng, families)
    obj_kind = _pick(rng, sorted(ELIGIBLE[family]))
    appliance = APPLIANCE.get(Goal(family, obj_kind, "x").state or "")
    kinds = sorted({r.kind for r in receptacles} - {appliance})
    target = None if family == "look" else _pick(rng, kinds)
    goal = Goal(family, obj_kind, target)

    sources = [r.name for r in receptacles if r.kind != target]
    n_goal = goal.count + int(rng.integers(0, 2))
    n_distract = int(rng.integers(config.distractors[0], config.distractors[1] + 1))
    other_kinds = [k for k in OBJECT_KINDS if k != obj_kind]
    kinds_drawn = [obj_kind] * n_goal + [_pick(rng, other_kinds) for _ in range(n_distract)]
    objects, placement, numbers = [], [], {}
    for kind in kinds_drawn:
        numbers[kind] = numbers.get(kind, 0) + 1
        name = f"{kind} {numbers[kind]}"
        spots = sources if kind == obj_kind else [r.name for r in receptacles]
        objects.append((name, kind))
        placement.append((name, _pick(rng, spots)))
    start = _pick(rng, rooms)
    layout = Layout(rooms, doors, tuple(receptacles), tuple(objects), lamp)
    return Task(layout, tuple(placement), start, goal)

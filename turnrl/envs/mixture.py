"""Mixture: each episode is a task of one of several registered envs, chosen by the seed.

Description:
    ``MixtureEnv(envs=[{"id": ..., "kwargs": {...}, "weight": w}, ...])`` holds one instance
    of every sub-env. Each ``reset(seed=s)`` draws the sub-env index with probability
    proportional to its weight from ``default_rng(s)`` and then a sub-seed from the same
    generator, and resets that sub-env with the sub-seed: the same seed gives the same
    sub-env and the same task, and a batch of seeds is routed row by row (every episode
    of a ``RolloutCollector`` batch runs in its own mixture, so rows of different sub-envs
    mix freely). The sub-seed is a second draw, not ``s`` itself, so which sub-env a seed
    picks is independent of which task that sub-env draws. Default mixture:
    ``turnrl/GuessNumber-v0`` and ``turnrl/CalcMath-v0``, weight 1 each.

Action Space:
    The sub-env's: the assistant turn's text (``messages.action_space``); ``step`` is
    delegated to the current sub-env, which parses and executes its own tools.

Observation Space:
    The sub-env's messages (``messages.observation_space``). The reset ``info["tools"]`` is
    the schemas of the episode's sub-env's tools (``[]`` for a sub-env without tools), which the
    agent gives the chat template. ``tools`` is the union of the sub-envs' tools; a tool name
    declared by two sub-envs with different schemas is refused at construction.

Rewards:
    The sub-env's.

Episode End:
    The sub-env's; ``max_turns`` is the current sub-env's (the largest before a reset).

Splits:
    Delegated: ``options={"split": ...}`` picks the split of the sub-env's tasks; the
    mixture's ``splits`` are those every sub-env has. ``info["task_id"]`` is
    ``"<name>:<sub task_id>"``, ``info["state_key"]`` is ``(name, sub state_key)`` and
    ``info["env_id"]`` is ``name`` (per-env metrics), where ``name`` is the entry's
    ``"name"`` (default: its ``"id"``). ``options={"env": name}`` forces the sub-env (the
    seed still draws the sub-seed), e.g. to evaluate one env of the mixture.

Scripted players:
    ``expert_action``, ``weak_expert_action(rng)`` and ``random_action(rng)`` are the
    current sub-env's. Measured by ``python -m turnrl baselines turnrl/Mixture-v0
    --episodes 200`` (test split, default mixture), success (mean turns): random 0.09 (2.9),
    weak 0.34 (3.0), expert 1.00 (3.4).

Version History:
    v0: initial version.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium
import numpy as np

from turnrl.envs.base import SPLITS
from turnrl.envs.messages import action_space, observation_space
from turnrl.tools import Tool

__all__ = ["DEFAULT_ENVS", "MIXTURE_ID", "MixtureEnv", "SubEnvSpec"]

MIXTURE_ID = "turnrl/Mixture-v0"
DEFAULT_ENVS: tuple[dict, ...] = (
    {"id": "turnrl/GuessNumber-v0", "kwargs": {}, "weight": 1.0},
    {"id": "turnrl/CalcMath-v0", "kwargs": {}, "weight": 1.0},
)
ENTRY_KEYS = frozenset({"id", "kwargs", "weight", "name"})
SUB_SEED_HIGH = 2**31 - 1
"""Sub-seeds are drawn from ``[0, SUB_SEED_HIGH)``."""


@dataclass(frozen=True)
class SubEnvSpec:
    """One validated entry of the mixture.

    Attributes:
        id: The registered gymnasium id.
        kwargs: Constructor kwargs of the sub-env.
        weight: Relative sampling weight (> 0).
        name: The label in task ids, state keys and ``info["env_id"]`` (default ``id``).
    """

    id: str
    kwargs: dict
    weight: float
    name: str


def parse_entries(envs: Sequence[Mapping[str, Any]]) -> tuple[SubEnvSpec, ...]:
    """Validate the ``envs`` argument of ``MixtureEnv``; raises ValueError saying what is wrong."""
    if isinstance(envs, (str, bytes, Mapping)) or not isinstance(envs, Sequence):
        raise ValueError(f"envs must be a list of {{'id', 'kwargs', 'weight'}} dicts, got {type(envs).__name__}")
    if len(envs) == 0:
        raise ValueError("envs is empty; give at least one {'id': ..., 'kwargs': {...}, 'weight': ...} entry")
    specs = []
    for i, entry in enumerate(envs):
        if not isinstance(entry, Mapping):
            raise ValueError(f"envs[{i}] must be a dict with 'id' (and optional 'kwargs', 'weight', 'name'), "
                             f"got {entry!r}")
        unknown = sorted(set(entry) - ENTRY_KEYS)
        if unknown:
            raise ValueError(f"envs[{i}] has unknown keys {unknown}; allowed: {sorted(ENTRY_KEYS)}")
        env_id = entry.get("id")
        if not isinstance(env_id, str) or env_id not in gymnasium.registry:
            known = sorted(k for k in gymnasium.registry if k.startswith("turnrl/") and k != MIXTURE_ID)
            raise ValueError(f"envs[{i}]['id']={env_id!r} is not a registered env id; registered turnrl envs: "
                             f"{known}")
        if env_id == MIXTURE_ID:
            raise ValueError(f"envs[{i}] is {MIXTURE_ID} itself; list its sub-envs directly instead of nesting")
        kwargs = entry.get("kwargs") or {}
        if not isinstance(kwargs, Mapping):
            raise ValueError(f"envs[{i}]['kwargs'] must be a dict of constructor kwargs, got {kwargs!r}")
        weight = entry.get("weight", 1.0)
        if (isinstance(weight, bool) or not isinstance(weight, (int, float, np.integer, np.floating))
                or not math.isfinite(weight) or weight <= 0):
            raise ValueError(f"envs[{i}]['weight'] must be a finite number > 0, got {weight!r}")
        name = entry.get("name", env_id)
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"envs[{i}]['name'] must be a non-empty string without ':', got {name!r}")
        specs.append(SubEnvSpec(env_id, dict(kwargs), float(weight), name))
    names = [s.name for s in specs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"envs has several entries named {repeated}; give each a distinct 'name' "
                         "(it labels task ids, state keys and info['env_id'])")
    return tuple(specs)


def union_tools(named_tools: Sequence[tuple[str, Sequence[Tool]]]) -> tuple[Tool, ...]:
    """The tools of all sub-envs, each name once; raises ValueError when two sub-envs declare
    one name with different schemas."""
    seen: dict[str, tuple[str, Tool]] = {}
    for owner, tools in named_tools:
        for t in tools:
            if t.name not in seen:
                seen[t.name] = (owner, t)
            elif seen[t.name][1].schema() != t.schema():
                raise ValueError(f"tool {t.name!r} of {owner} has a different schema than the one of "
                                 f"{seen[t.name][0]}; a mixture needs one schema per tool name (rename one tool)")
    return tuple(t for _, t in seen.values())


class MixtureEnv(gymnasium.Env[tuple, str]):
    """Episodes drawn from several envs by weight, routed by the reset seed (see the module docstring).

    Args:
        envs: Entries ``{"id": str, "kwargs": dict, "weight": float, "name": str}`` (``kwargs``,
            ``weight`` = 1 and ``name`` = ``id`` are optional).
        tool_parser: When set, the default ``tool_parser`` of every sub-env (an entry's own
            ``kwargs`` win).
        max_turns: When set, the default ``max_turns`` of every sub-env (likewise).

    Raises:
        ValueError: On an empty list, an unknown id, a weight <= 0, repeated names, or a
            tool name with two different schemas.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, envs: Sequence[Mapping[str, Any]] = DEFAULT_ENVS, *, tool_parser: str | None = None,
                 max_turns: int | None = None) -> None:
        self.specs = parse_entries(envs)
        shared = {k: v for k, v in (("tool_parser", tool_parser), ("max_turns", max_turns)) if v is not None}
        self.envs: tuple[gymnasium.Env, ...] = tuple(
            gymnasium.make(s.id, disable_env_checker=True, **(shared | s.kwargs)) for s in self.specs
        )
        self.tools = union_tools([(s.name, getattr(e.unwrapped, "tools", ())) for s, e in zip(self.specs, self.envs)])
        weights = np.array([s.weight for s in self.specs])
        self.probabilities = weights / weights.sum()
        self.observation_space = observation_space()
        self.action_space = action_space()
        self._index: int | None = None

    # ------------------------------------------------------------ routing
    @property
    def names(self) -> tuple[str, ...]:
        """The sub-env names, in entry order."""
        return tuple(s.name for s in self.specs)

    @property
    def current(self) -> gymnasium.Env:
        """The sub-env of the current episode (RuntimeError before the first reset)."""
        if self._index is None:
            raise RuntimeError("MixtureEnv has no current sub-env before reset(); call reset() first")
        return self.envs[self._index]

    @property
    def current_name(self) -> str:
        """The name of the current episode's sub-env."""
        self.current  # noqa: B018  (raises before reset)
        return self.specs[self._index].name

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits every sub-env has."""
        per_env = [tuple(getattr(e.unwrapped, "splits", SPLITS)) for e in self.envs]
        return tuple(s for s in per_env[0] if all(s in p for p in per_env[1:]))

    @property
    def max_turns(self) -> int:
        """The current sub-env's turn limit (the largest of all before the first reset)."""
        if self._index is None:
            return max(int(getattr(e.unwrapped, "max_turns", 0)) for e in self.envs)
        return int(self.current.unwrapped.max_turns)

    @property
    def tool_parser(self) -> str | None:
        """The current sub-env's tool-call format (None before the first reset)."""
        return None if self._index is None else getattr(self.current.unwrapped, "tool_parser", None)

    @property
    def task(self) -> Any:
        """The current sub-env's task (None before the first reset)."""
        return None if self._index is None else getattr(self.current.unwrapped, "task", None)

    @property
    def done(self) -> bool:
        """Whether the current episode has ended (True before the first reset)."""
        return self._index is None or bool(getattr(self.current.unwrapped, "done", False))

    def route(self, seed: int) -> tuple[int, int]:
        """``(sub-env index, sub-seed)`` that ``reset(seed=seed)`` uses."""
        rng = np.random.default_rng(seed)
        index = int(rng.choice(len(self.specs), p=self.probabilities))
        return index, int(rng.integers(SUB_SEED_HIGH))

    # --------------------------------------------------------------- loop
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[tuple, dict]:
        """Start an episode of the sub-env the seed picks; ``options`` pass on to it, except
        ``"env"`` (a sub-env name) that forces the sub-env."""
        super().reset(seed=seed)
        options = dict(options or {})
        forced = options.pop("env", None)
        if seed is None:  # unseeded: draw a seed from the mixture's own generator
            seed = int(self.np_random.integers(SUB_SEED_HIGH))
        index, sub_seed = self.route(seed)
        if forced is not None:
            if forced not in self.names:
                raise ValueError(f"options['env'] must be one of {list(self.names)}, got {forced!r}")
            index = self.names.index(forced)
        self._index = index
        obs, info = self.envs[index].reset(seed=sub_seed, options=options)
        info = self._wrap_info(info)
        if "tools" not in info:  # a sub-env that is not a MultiTurnEnv: its declared tools
            info["tools"] = [t.schema() for t in getattr(self.envs[index].unwrapped, "tools", ())]
        return obs, info

    def step(self, action: str) -> tuple[tuple, float, bool, bool, dict]:
        """Play one turn in the current sub-env; its result with the info namespaced."""
        obs, reward, terminated, truncated, info = self.current.step(action)
        return obs, reward, terminated, truncated, self._wrap_info(info)

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[tuple, dict]:
        """``reset`` for a caller on its own event loop (runs in a worker thread)."""
        return await asyncio.to_thread(self.reset, seed=seed, options=options)

    async def astep(self, action: str) -> tuple[tuple, float, bool, bool, dict]:
        """``step`` for a caller on its own event loop (runs in a worker thread)."""
        return await asyncio.to_thread(self.step, action)

    def close(self) -> None:
        """Close every sub-env."""
        for env in self.envs:
            env.close()
        super().close()

    def _wrap_info(self, info: dict) -> dict:
        name = self.specs[self._index].name
        wrapped = dict(info)
        wrapped["task_id"] = f"{name}:{info.get('task_id', '')}"
        wrapped["state_key"] = (name, info.get("state_key"))
        wrapped["env_id"] = name
        return wrapped

    # ------------------------------------------------------------ players
    def expert_action(self) -> str:
        """The current sub-env's expert action."""
        return self.current.unwrapped.expert_action()

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """The current sub-env's weak-expert action."""
        return self.current.unwrapped.weak_expert_action(rng)

    def random_action(self, rng: np.random.Generator) -> str:
        """The current sub-env's random action."""
        return self.current.unwrapped.random_action(rng)

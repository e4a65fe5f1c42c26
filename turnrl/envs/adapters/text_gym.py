"""TextGym: any gymnasium env with ``Text`` observations and actions as a multi-turn chat env.

Description:
    ``TextGymEnv(env)`` wraps a gymnasium env (an object, or an id for ``gymnasium.make``)
    whose ``observation_space`` and ``action_space`` are both ``gymnasium.spaces.Text``.
    A turnrl reset draws a seed for the wrapped env from ``self.np_random`` and resets it;
    every assistant turn is one wrapped ``step``. Opening messages: the ``system_prompt``
    (when given) and the wrapped env's first observation as a user message.

Action Space:
    The assistant's text, stripped of surrounding whitespace, is the wrapped env's action.
    It is first checked against the wrapped action space (length and charset); a reply
    that does not fit gets a user message saying what is wrong and what is allowed, the
    wrapped env is not stepped, and the turn still counts. Tool calls in a reply get an
    "unknown tool" message (the wrapper has no tools); the text goes to the wrapped env
    as written. The wrapped env must accept any text of its action space.

Observation Space:
    One user message per turn: the wrapped env's observation string (characters outside
    the message charset become ``?``; see ``turnrl.envs.messages.to_observation``).

Rewards:
    The wrapped env's rewards, unchanged (0.0 on turns whose reply did not fit the
    action space).

Episode End:
    ``terminated`` and ``truncated`` pass through from the wrapped env; the episode is
    also truncated after ``max_turns`` turns (default: the wrapped spec's
    ``max_episode_steps``, else ``DEFAULT_MAX_TURNS``).

Info:
    The wrapped env's latest info dict passes through, with the ``MultiTurnEnv`` keys
    on top: ``task_id`` is the wrapped reset info's ``"task_id"`` when it has one, else
    ``f"{name}-seed{wrapped_seed}"``; ``state_key`` is ``state_key_fn(observation, info)``
    when given, else the wrapped info's ``"state_key"``, else the latest observation
    string; ``success`` is the wrapped info's ``"success"`` when present, else
    ``terminated and reward > 0`` (sticky once reached).

Splits:
    ``split_fn`` decides the split of a wrapped reset from ``(observation, info)``:

    * ``"auto"`` (default): the wrapped reset info's ``"split"`` (``"train"``/``"test"``)
      when it has one, else ``test`` iff ``crc32(initial observation) % 5 == 0``;
    * a callable ``(observation, info) -> "train" | "test"``;
    * ``None``: the env has no held-out tasks: ``splits == ("train",)`` and
      ``reset(options={"split": "test"})`` draws from the same tasks (info says "test").

    A turnrl reset redraws the wrapped seed until the split matches (at most
    ``MAX_DRAWS`` times, then ValueError: an env with one fixed start state has one
    split only; pass ``split_fn=None``).

Scripted players:
    ``expert(env, observation) -> str`` (with the wrapped env, so it can read its state)
    is the expert; without one ``expert_action`` raises NotImplementedError.
    ``random_player(env, observation, rng) -> str`` is the random player; by default a
    uniformly random string of the action space (length uniform in its bounds, at most
    ``RANDOM_MAX_CHARS``; whitespace left out). Weak player: the default.

Version History:
    v0: initial version.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from turnrl.envs.base import SPLITS, Message, MultiTurnEnv, TurnOutcome
from turnrl.tools import ParseResult, ToolResult

__all__ = ["DEFAULT_MAX_TURNS", "TextGymEnv", "TextTask", "hash_split"]

DEFAULT_MAX_TURNS = 50
MAX_DRAWS = 1000
RANDOM_MAX_CHARS = 32
SHOWN_CHARS = 40
TEST_BUCKETS, TEST_BUCKET = 5, 0

Expert = Callable[[gymnasium.Env, str], str]
RandomPlayer = Callable[[gymnasium.Env, str, np.random.Generator], str]
SplitFn = Callable[[str, dict], str]


def hash_split(observation: str, info: Mapping[str, Any] | None = None) -> str:
    """``"test"`` iff ``crc32(observation) % 5 == 0``, else ``"train"`` (``info`` unused)."""
    return "test" if zlib.crc32(observation.encode()) % TEST_BUCKETS == TEST_BUCKET else "train"


def auto_split(observation: str, info: Mapping[str, Any]) -> str:
    """The wrapped info's ``"split"`` when it is a turnrl split, else ``hash_split``."""
    split = info.get("split")
    return split if split in SPLITS else hash_split(observation)


@dataclass(frozen=True)
class TextTask:
    """One wrapped reset.

    Attributes:
        seed: The seed the wrapped env was reset with.
        observation: Its first observation.
        info: Its reset info.
    """

    seed: int
    observation: str
    info: dict = field(hash=False, compare=False, repr=False)


class TextGymEnv(MultiTurnEnv):
    """A ``Text``-in, ``Text``-out gymnasium env as a chat env; see the module docstring.

    Args:
        env: The env to wrap, or a gymnasium id (made with ``env_kwargs``).
        env_kwargs: Keyword arguments for ``gymnasium.make`` (only with an id).
        system_prompt: The opening system message (none when None).
        max_turns: Turn limit; None: the wrapped spec's ``max_episode_steps`` or ``DEFAULT_MAX_TURNS``.
        expert: ``expert(env, observation) -> str``, the scripted expert (optional).
        random_player: ``random_player(env, observation, rng) -> str`` (optional).
        split_fn: ``"auto"``, a callable ``(observation, info) -> split``, or None (one split).
        state_key_fn: ``state_key_fn(observation, info) -> Hashable`` (optional).
        name: Prefix of seed-based task ids (default: the wrapped spec id or class name).
        tool_parser: Parser name (the wrapper has no tools; calls get "unknown tool").

    Raises:
        TypeError: If the wrapped spaces are not ``Text`` or a callable argument is not callable.
        ValueError: If ``env_kwargs`` comes with an env object, or ``split_fn`` is unknown.
    """

    def __init__(self, env: gymnasium.Env | str, *, env_kwargs: Mapping[str, Any] | None = None,
                 system_prompt: str | None = None, max_turns: int | None = None,
                 expert: Expert | None = None, random_player: RandomPlayer | None = None,
                 split_fn: SplitFn | str | None = "auto",
                 state_key_fn: Callable[[str, dict], Hashable] | None = None,
                 name: str | None = None, tool_parser: str = "hermes") -> None:
        if isinstance(env, str):
            env = gymnasium.make(env, **dict(env_kwargs or {}))
        elif env_kwargs:
            raise ValueError("env_kwargs only applies to an env id; construct the env object with them instead")
        if not isinstance(env, gymnasium.Env):
            raise TypeError(f"env must be a gymnasium.Env or an env id, got {type(env).__name__}")
        for label, space in (("observation_space", env.observation_space), ("action_space", env.action_space)):
            if not isinstance(space, spaces.Text):
                raise TypeError(f"TextGymEnv wraps envs whose {label} is gymnasium.spaces.Text, got {space!r}; "
                                "convert observations/actions to strings first (see turnrl.envs.adapters.toy_text)")
        for label, fn in (("expert", expert), ("random_player", random_player), ("state_key_fn", state_key_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{label} must be callable or None, got {type(fn).__name__}")
        if split_fn == "auto":
            split_fn = auto_split
        elif split_fn is not None and not callable(split_fn):
            raise ValueError("split_fn must be 'auto', a callable (observation, info) -> split, or None; "
                             f"got {split_fn!r}")
        spec = getattr(env, "spec", None)
        if max_turns is None:
            max_turns = spec.max_episode_steps if spec is not None and spec.max_episode_steps else DEFAULT_MAX_TURNS
        self.env = env
        self.system_prompt = system_prompt
        self.name = name or (spec.id if spec is not None else type(env.unwrapped).__name__)
        self.splits: tuple[str, ...] = SPLITS if split_fn is not None else ("train",)
        self._split_fn = split_fn
        self._expert = expert
        self._random_player = random_player
        self._state_key_fn = state_key_fn
        super().__init__(tool_parser=tool_parser, max_turns=max_turns)
        self._observation = ""
        self._inner_info: dict = {}
        self._inner_truncated = False

    @property
    def inner_action_space(self) -> spaces.Text:
        """The wrapped env's action space."""
        return self.env.action_space

    @property
    def observation_text(self) -> str:
        """The wrapped env's latest observation."""
        return self._observation

    def split_of(self, observation: str, info: Mapping[str, Any]) -> str:
        """The split of a wrapped reset (always "train" when the env has one split)."""
        if self._split_fn is None:
            return "train"
        split = self._split_fn(observation, dict(info))
        if split not in SPLITS:
            raise ValueError(f"split_fn must return one of {SPLITS}, got {split!r}")
        return split

    def action_problem(self, text: str) -> str | None:
        """Why ``text`` does not fit the wrapped action space (None when it does)."""
        space = self.inner_action_space
        if not space.min_length <= len(text) <= space.max_length:
            return (f"your reply has {len(text)} characters; it must have {space.min_length} to "
                    f"{space.max_length}")
        bad = sorted(set(text) - space.character_set)
        if bad:
            allowed = space.characters if len(space.characters) <= SHOWN_CHARS else None
            shown = ", ".join(repr(c) for c in bad[:10])
            return f"characters {shown} are not allowed" + (f"; use only {allowed!r}" if allowed else "")
        return None

    # ----------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> TextTask:
        for _ in range(MAX_DRAWS):
            seed = int(rng.integers(2**31 - 1))
            observation, info = self.env.reset(seed=seed)
            if not isinstance(observation, str):
                raise TypeError(f"the wrapped env's reset returned {type(observation).__name__}, not str")
            if self._split_fn is None or self.split_of(observation, info) == split:
                return TextTask(seed, observation, dict(info))
        raise ValueError(f"no {split!r} task of {self.name} in {MAX_DRAWS} wrapped resets: its initial observations "
                         "all fall in the other split (e.g. a fixed start state); pass split_fn=None (one split) "
                         "or a split_fn")

    def _task_id(self, task: TextTask) -> str:
        task_id = task.info.get("task_id")
        return str(task_id) if task_id is not None else f"{self.name}-seed{task.seed}"

    def _start_episode(self, task: TextTask) -> list[Message]:
        self._observation, self._inner_info, self._inner_truncated = task.observation, dict(task.info), False
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        return [*opening, {"role": "user", "content": task.observation}]

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        text = action.strip()
        problem = self.action_problem(text)
        if problem is not None:
            return TurnOutcome(messages=({"role": "user", "content": f"Invalid action: {problem}."},))
        observation, reward, terminated, truncated, info = self.env.step(text)
        if not isinstance(observation, str):
            raise TypeError(f"the wrapped env's step returned {type(observation).__name__}, not str")
        self._observation, self._inner_info, self._inner_truncated = observation, dict(info), bool(truncated)
        success = bool(info["success"]) if "success" in info else bool(terminated) and float(reward) > 0
        return TurnOutcome(messages=({"role": "user", "content": observation},), reward=float(reward),
                           terminated=bool(terminated), success=success)

    def _state_key(self) -> Hashable:
        if self._state_key_fn is not None:
            return self._state_key_fn(self._observation, self._inner_info)
        return self._inner_info.get("state_key", self._observation)

    def _info(self, **extra: Any) -> dict:
        return {**self._inner_info, **super()._info(**extra)}

    def step(self, action: str) -> tuple[tuple, float, bool, bool, dict]:
        """One turn; the wrapped env's ``truncated`` passes through (see the module docstring)."""
        observation, reward, terminated, truncated, info = super().step(action)
        if self._inner_truncated and not terminated and not truncated:
            truncated = self._done = True
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()
        super().close()

    # --------------------------------------------------------------- players
    def expert_action(self) -> str:
        """The ``expert`` callable's action for the wrapped env's current state.

        Raises:
            NotImplementedError: If no expert was given.
        """
        self._require_active("expert_action()")
        if self._expert is None:
            raise NotImplementedError(f"TextGymEnv({self.name}) has no scripted expert; "
                                      "pass expert=callable(env, observation) -> str")
        return self._expert(self.env, self._observation)

    def random_action(self, rng: np.random.Generator) -> str:
        """``random_player``'s action, else a uniformly random string of the action space."""
        self._require_active("random_action()")
        if self._random_player is not None:
            return self._random_player(self.env, self._observation, rng)
        space = self.inner_action_space
        chars = [c for c in space.characters if not c.isspace()] or list(space.characters)
        high = max(space.min_length, min(space.max_length, RANDOM_MAX_CHARS))
        length = int(rng.integers(space.min_length, high + 1))
        return "".join(chars[int(i)] for i in rng.integers(len(chars), size=length))

"""``MultiTurnEnv``: the multi-turn chat environment contract and its episode loop.

One episode is a conversation. ``reset`` returns the opening messages (system +
user prompt); each ``step(action)`` takes the assistant turn's text, parses and
executes its tool calls, lets the subclass judge the turn, and returns the new
messages (tool results first, then the env's own messages).

Subclasses override small hooks only:

* ``_new_task(rng, split)``: draw a task from the split with ``rng``.
* ``_task_id(task)``: a stable id string for the task.
* ``_start_episode(task)``: reset per-episode state; return the opening messages.
* ``_on_turn(action, parse, tool_results)``: update state; return a ``TurnOutcome``.
* ``_state_key()``: hashable env state at the start of the next turn.
* ``expert_action()``: the scripted expert's action for the current state.
* ``random_action(rng)`` (optional): a uniformly random well-formed action, the
  random-policy baseline (``turnrl.envs.baselines``).
* ``weak_expert_action(rng)`` (optional): the warm-start player; by default the expert
  with p=``WEAK_EXPERT_PROB``, else ``random_action``.

Info keys, always: ``task_id`` (str), ``state_key`` (Hashable), ``turn`` (turns
taken so far), ``split``. After ``step`` also: ``success`` (bool, final when the
episode ends), ``parse_status`` ("ok" | "malformed" | "absent"), ``parse_error``
(bool), ``tool_calls`` (int), ``tool_errors`` (int).

Tool execution: each tool runs on an executor (``turnrl.tools.executors``): the tool's own
``Tool.executor`` kind unless the ``executors`` kwarg overrides it, built with
``executor_options[kind]`` and shared process-wide (``get_executor``). All calls of one turn
run concurrently on the shared background event loop; ``step`` blocks until they finish.
Every episode is an executor *session* (a sandbox working dir, a container...), closed by the
next ``reset`` and by ``close``. ``areset``/``astep`` are the awaitable forms for callers on
their own event loop (they run ``reset``/``step`` in a worker thread).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from abc import abstractmethod
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium
import numpy as np

from turnrl.envs.messages import Message, action_space, observation_space, to_observation
from turnrl.tools import ParseResult, Tool, ToolCall, ToolResult, check_call, get_parser, tool_map
from turnrl.tools.executors import EXECUTORS, Executor, get_executor, run_sync

__all__ = ["Message", "MultiTurnEnv", "Split", "TurnOutcome", "SPLITS", "WEAK_EXPERT_PROB"]

Split = Literal["train", "test"]
SPLITS: tuple[str, ...] = ("train", "test")
WEAK_EXPERT_PROB = 0.5
"""Probability that the default ``weak_expert_action`` plays the expert's move."""


@dataclass(frozen=True)
class TurnOutcome:
    """A subclass's verdict on one assistant turn.

    Attributes:
        messages: Env messages to append after the tool-result messages.
        reward: Reward for this turn (outcome rewards arrive on the last turn).
        terminated: Whether the episode ends now (task solved or failed).
        success: Whether the task is solved (meaningful when ``terminated``).
    """

    messages: tuple[Message, ...] = field(default=())
    reward: float = 0.0
    terminated: bool = False
    success: bool = False


class MultiTurnEnv(gymnasium.Env[tuple, str]):
    """Base class for chat environments; see the module docstring for the contract.

    Observation: a tuple of ``{"role", "content"}`` dicts (``messages.observation_space``).
    Action: the assistant turn's text (``messages.action_space``). ``truncated`` is
    True when ``max_turns`` turns pass without termination. Stepping after the
    episode ended (or before ``reset``) raises ``RuntimeError``. Any text action
    is handled; failures show up as messages, never exceptions.

    Args:
        tool_parser: Name of a registered tool-call parser (``turnrl.tools.PARSERS``).
        max_turns: Assistant turns before truncation; None means ``default_max_turns``.
        executors: Tool name -> executor kind, overriding ``Tool.executor`` for that tool.
        executor_options: Executor kind -> keyword options for ``get_executor`` (e.g.
            ``{"sandbox": {"limits": {"cpu_s": 2}}}``).

    Raises:
        ValueError: On an unknown tool name or executor kind (the message lists the valid ones).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    tools: tuple[Tool, ...] = ()
    default_max_turns: ClassVar[int] = 4

    def __init__(self, *, tool_parser: str = "hermes", max_turns: int | None = None,
                 executors: Mapping[str, str] | None = None,
                 executor_options: Mapping[str, Mapping] | None = None) -> None:
        max_turns = self.default_max_turns if max_turns is None else max_turns
        if not isinstance(max_turns, (int, np.integer)) or isinstance(max_turns, bool) or max_turns < 1:
            raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
        self.max_turns = int(max_turns)
        self.tool_parser = tool_parser
        self._parse = get_parser(tool_parser)
        self._tools_by_name = tool_map(self.tools)
        self._executors = self._resolve_executors(executors, executor_options)
        self._session_prefix = f"{type(self).__name__}-{uuid.uuid4().hex[:12]}"
        self._episodes = itertools.count()
        self._session: str | None = None
        self.observation_space = observation_space()
        self.action_space = action_space()
        self._task: Any = None
        self._split: str = "train"
        self._turn = 0
        self._done = False
        self._success = False

    # ----------------------------------------------------------------- hooks
    @abstractmethod
    def _new_task(self, rng: np.random.Generator, split: str) -> Any:
        """Draw a task of ``split`` ("train" or "test") using only ``rng``."""

    @abstractmethod
    def _task_id(self, task: Any) -> str:
        """Stable id of ``task`` (equal tasks, equal ids; disjoint across splits)."""

    @abstractmethod
    def _start_episode(self, task: Any) -> list[Message]:
        """Reset per-episode state for ``task``; return the opening messages."""

    @abstractmethod
    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        """Update state from one turn (its tool calls already executed) and judge it."""

    @abstractmethod
    def _state_key(self) -> Hashable:
        """The env state at the start of the next turn (equal states, equal keys)."""

    @abstractmethod
    def expert_action(self) -> str:
        """The scripted expert's next action for the current state."""

    def random_action(self, rng: np.random.Generator) -> str:
        """A uniformly random well-formed action for the current state (random baseline).

        Well-formed means the env understands it (a legal move, a parseable tool call),
        drawn uniformly from the legal choices the env offers; it uses only ``rng``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define random_action(rng)")

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """A warm-start player: the expert's move with p=``WEAK_EXPERT_PROB``, else ``random_action``.

        Args:
            rng: The player's own generator (the env's ``np_random`` is not touched).
        """
        self._require_active("weak_expert_action()")
        return self.expert_action() if rng.random() < WEAK_EXPERT_PROB else self.random_action(rng)

    # ------------------------------------------------------------------ loop
    @property
    def task(self) -> Any:
        """The current task (None before the first reset)."""
        return self._task

    @property
    def done(self) -> bool:
        """Whether the current episode has ended."""
        return self._done

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[tuple, dict]:
        """Start an episode; ``options={"split": "train"|"test"}`` picks the task split (default train)."""
        super().reset(seed=seed)
        split = (options or {}).get("split", "train")
        if split not in SPLITS:
            raise ValueError(f"options['split'] must be one of {SPLITS}, got {split!r}")
        self._split = split
        self._close_session()
        self._session = f"{self._session_prefix}-{next(self._episodes)}"
        self._task = self._new_task(self.np_random, split)
        self._turn, self._done, self._success = 0, False, False
        return to_observation(self._start_episode(self._task)), self._info()

    def step(self, action: str) -> tuple[tuple, float, bool, bool, dict]:
        """Play one assistant turn; returns ``(obs, reward, terminated, truncated, info)``."""
        self._require_active("step()")
        if not isinstance(action, str):
            raise TypeError(f"action must be the assistant turn as str, got {type(action).__name__}")
        parse = self._parse(action)
        results = self._execute(parse.calls)
        outcome = self._on_turn(action, parse, results)
        self._turn += 1
        self._success = self._success or outcome.success
        terminated = bool(outcome.terminated)
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        messages = [{"role": "tool", "content": r.content} for r in results] + list(outcome.messages)
        info = self._info(
            success=self._success,
            parse_status=parse.status,
            parse_error=parse.status == "malformed",
            tool_calls=len(parse.calls),
            tool_errors=sum(not r.ok for r in results),
        )
        return to_observation(messages), float(outcome.reward), terminated, truncated, info

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[tuple, dict]:
        """``reset`` for a caller on its own event loop (runs in a worker thread)."""
        return await asyncio.to_thread(self.reset, seed=seed, options=options)

    async def astep(self, action: str) -> tuple[tuple, float, bool, bool, dict]:
        """``step`` for a caller on its own event loop: its tool calls overlap with other awaits."""
        return await asyncio.to_thread(self.step, action)

    def close(self) -> None:
        """End the current executor session (free its sandbox dir / container)."""
        self._close_session()
        super().close()

    @property
    def session(self) -> str | None:
        """The executor session id of the current episode (None before the first reset)."""
        return self._session

    def executor_for(self, tool_name: str) -> Executor:
        """The executor that runs ``tool_name`` in this env."""
        if tool_name not in self._executors:
            raise ValueError(f"{type(self).__name__} has no tool {tool_name!r}; its tools: {sorted(self._executors)}")
        return self._executors[tool_name]

    # ------------------------------------------------------------- tool calls
    def _resolve_executors(self, executors: Mapping[str, str] | None,
                           options: Mapping[str, Mapping] | None) -> dict[str, Executor]:
        executors, options = dict(executors or {}), dict(options or {})
        unknown_tools = sorted(set(executors) - set(self._tools_by_name))
        if unknown_tools:
            raise ValueError(f"executors names unknown tools {unknown_tools}; "
                             f"this env's tools: {sorted(self._tools_by_name)}")
        kinds = {name: executors.get(name, t.executor) for name, t in self._tools_by_name.items()}
        unknown_kinds = sorted({k for k in [*kinds.values(), *options] if k not in EXECUTORS})
        if unknown_kinds:
            raise ValueError(f"unknown executor kind(s) {unknown_kinds}; valid executors: {EXECUTORS.names()}")
        for kind, opts in options.items():
            if not isinstance(opts, Mapping):
                raise ValueError(f"executor_options[{kind!r}] must be a mapping of options, got {type(opts).__name__}")
        return {name: get_executor(kind, **dict(options.get(kind, {}))) for name, kind in kinds.items()}

    def _execute(self, calls: tuple[ToolCall, ...]) -> tuple[ToolResult, ...]:
        """Validate every call, then run the valid ones concurrently on their executors."""
        if not calls:
            return ()
        checked = [check_call(call, self._tools_by_name) for call in calls]
        pending = [(i, c, call) for i, (c, call) in enumerate(zip(checked, calls)) if isinstance(c, Tool)]
        if pending:
            session = self._session or f"{self._session_prefix}-none"

            async def run_all() -> list[ToolResult]:
                return await asyncio.gather(*(self._executors[t.name].arun(t, call, session) for _, t, call in pending))

            for (i, _, _), result in zip(pending, run_sync(run_all())):
                checked[i] = result
        return tuple(checked)  # type: ignore[arg-type]

    def _close_session(self) -> None:
        if getattr(self, "_session", None) is not None:
            for executor in {id(e): e for e in self._executors.values()}.values():
                executor.close_session(self._session)
            self._session = None

    def _info(self, **extra: Any) -> dict:
        return {
            "task_id": self._task_id(self._task),
            "state_key": self._state_key(),
            "turn": self._turn,
            "split": self._split,
            **extra,
        }

    def _require_active(self, what: str) -> None:
        """Raise RuntimeError unless an episode is in progress."""
        if self._task is None:
            raise RuntimeError(f"{what} called before reset(); call reset() first")
        if self._done:
            raise RuntimeError(f"{what} called after the episode ended; call reset() to start a new episode")

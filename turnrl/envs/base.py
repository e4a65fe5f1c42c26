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
taken so far), ``split``. After ``reset`` also: ``tools``, the episode's tools as OpenAI-style
function schemas (``[t.schema() for t in self.tools]``: ``{"type": "function", "function":
{"name", "description", "parameters"}}``; ``[]`` without tools), which the agent gives the chat
template (``apply_chat_template(..., tools=...)``). After ``step`` also: ``success`` (bool,
final when the episode ends), ``parse_status`` ("ok" | "malformed" | "absent"), ``parse_error``
(bool), ``tool_calls`` (int), ``tool_errors`` (int).

Tools: ``tools`` (a class attribute, or set on the instance before or after
``super().__init__()``) lists ``Tool`` objects; ``@tool`` methods of the class are tools too,
bound to the env, so they can read the current episode (``self.task``). The tools reach the model
through ``info["tools"]`` and the chat template, never through the env's prompt: the opening
messages state the task only (what to do, what to answer and how the answer is written), with no
tool listing or example call. ``tools_prompt()`` is the text a renderer writes into the system
message for a template that does not render tools (the schemas and ``example_call()`` in the
format of the env's ``tool_parser``). A turn whose calls the parser finds malformed (broken markup
or JSON), or that holds calls of the env's tools in another registered format
(``turnrl.tools.other_formats``), is ``malformed``: nothing runs, and the model is told what was
wrong and shown a well-formed call (``_parse_feedback``, which an env may override), before the
messages of ``_on_turn`` (which still sees the turn). The first reset warns when the opening
messages hand-write the tools (a ``Tool: {`` listing or a call of the env's tools in a registered
format).

Text: observations and actions are any Unicode text (``turnrl.envs.messages.TextSpace``), kept
as they are. The messages of ``step`` (tool results, feedback, the env's own) show NUL and lone
surrogates, which no text can carry, as visible escapes (``messages.escape_invalid``): a model's
code may print them; the opening messages must not hold them (``reset`` raises ValueError).

Tool execution: each tool runs on an executor (``turnrl.tools.executors``): the tool's own
``Tool.executor`` kind unless the ``executors`` kwarg overrides it, built with
``executor_options[kind]`` and shared process-wide (``get_executor``). All calls of one turn
run concurrently on the shared background event loop; ``step`` blocks until they finish.
Every episode is an executor *session* (a sandbox working dir, a container...), closed by the
next ``reset`` and by ``close``. A call the model got wrong (unknown tool, bad arguments, a tool
that refused its input, a program that crashed or hit a sandbox limit) is an error message in
the observation; a call that failed for the infrastructure's reason (an ``"unavailable"``
result: a sandbox that could not start, a tool server gone, a tool that hung or raised
``ToolUnavailableError``; ``turnrl.tools.execute``) makes ``step`` raise
``turnrl.tools.ToolUnavailableError`` instead, once every call of the turn has finished: the
episode has ended (the rollout collector records termination ``"tool_error"``) and the env
serves again after the next ``reset``. ``areset``/``astep`` are the awaitable forms for callers on
their own event loop (they run ``reset``/``step`` in a worker thread).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
import warnings
from abc import abstractmethod
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium
import numpy as np

from turnrl.envs.messages import Message, action_space, escape_invalid, observation_space, to_observation
from turnrl.tools import (
    PARSERS,
    ParseResult,
    Tool,
    ToolCall,
    ToolResult,
    ToolUnavailableError,
    bind_tools,
    check_call,
    example_call,
    format_call,
    get_parser,
    other_formats,
    tool_map,
    tools_prompt,
)
from turnrl.tools.executors import EXECUTORS, Executor, get_executor, run_sync

__all__ = ["Message", "MultiTurnEnv", "PARSE_ERROR_PREFIX", "Split", "TOOL_LISTING", "TurnOutcome", "SPLITS",
           "WEAK_EXPERT_PROB", "hand_written_tools"]

Split = Literal["train", "test"]
SPLITS: tuple[str, ...] = ("train", "test")
WEAK_EXPERT_PROB = 0.5
"""Probability that the default ``weak_expert_action`` plays the expert's move."""
PARSE_ERROR_PREFIX = "Error: could not parse your tool call: "
"""How the default ``_parse_feedback`` message starts."""


TOOL_LISTING = "Tool: {"
"""How ``turnrl.tools.tools_prompt`` starts a tool's schema line: an env prompt holding it lists tools."""


def hand_written_tools(text: str, tool_names: Collection[str], parser: str | None = None) -> list[str]:
    """How ``text`` (an env's opening messages) hand-writes tools: a ``Tool: {`` schema listing,
    or calls of ``tool_names`` written in a registered format (``turnrl.tools.PARSERS``; when
    ``parser``, the env's own, is given, a call in another format is said to be unreadable too).
    Empty when it does neither. Each item reads after "the opening messages ...".
    """
    problems = []
    if TOOL_LISTING in text:
        problems.append(f"list tool schemas ({TOOL_LISTING!r} lines, as tools_prompt() writes them)")
    if tool_names:
        formats = [name for name in PARSERS.names() if (parse := PARSERS[name](text)).status == "ok"
                   and any(call.name in tool_names for call in parse.calls)]
        if formats:
            unread = "" if parser is None or parser in formats else (
                f", which the env cannot even read (it parses tool_parser={parser!r})")
            problems.append(f"show calls of its tools in the {' / '.join(formats)} format{unread}")
    return problems


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
    is handled; the model's failures show up as messages, never exceptions (a tool failure
    that is not the model's raises ``ToolUnavailableError``: see ``step``).

    Args:
        tool_parser: Name of a registered tool-call parser (``turnrl.tools.PARSERS``).
        max_turns: Assistant turns before truncation; None means ``default_max_turns``.
        executors: Tool name -> executor kind, overriding ``Tool.executor`` for that tool.
        executor_options: Executor kind -> keyword options for ``get_executor`` (e.g.
            ``{"sandbox": {"limits": {"cpu_s": 2}}}``).

    Raises:
        ValueError: On an unknown tool name or executor kind (the message lists the valid ones).
        TypeError: If ``tools`` holds something that is not a tool.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    tools: tuple[Tool, ...] = ()
    """The env's tools; assigning it (at any time) also adds the class's ``@tool`` methods."""
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
        self._executor_config = (dict(executors or {}), dict(executor_options or {}))
        self.tools = self.tools  # the class's (or an earlier assignment's) tools, bound; builds the tool table
        self._prompt_checked = False
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

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "tools":  # bind @tool methods; once __init__ has run, rebuild the tool table too
            value = bind_tools(value, self)
            if "_executor_config" in self.__dict__:
                by_name = tool_map(value)
                executors = self._resolve_executors(by_name, *self._executor_config)
                self._tools_by_name, self._executors = by_name, executors
            super().__setattr__(name, value)
            return
        super().__setattr__(name, value)

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

    def example_call(self) -> ToolCall:
        """The call that ``tools_prompt()`` and the malformed-call feedback show. By default the
        first tool with placeholder arguments (``turnrl.tools.example_call``); override it to
        show a meaningful call. Raises ValueError when the env has no tools."""
        if not self.tools:
            raise ValueError(f"{type(self).__name__} has no tools, so there is no call to show")
        return example_call(self.tools[0])

    def tools_prompt(self) -> str:
        """The tools' schemas and ``example_call()`` written in this env's ``tool_parser`` format
        (``turnrl.tools.tools_prompt``): what a renderer writes into the system message for a chat
        template that does not render ``tools=``. Never put it in the env's own messages: the
        tools reach the model through ``info["tools"]`` (``tool_schemas()``)."""
        return tools_prompt(self.tools, self.tool_parser, self.example_call())

    def tool_schemas(self) -> list[dict]:
        """The env's tools as OpenAI-style function schemas (``Tool.schema()``), ``[]`` without
        tools: ``info["tools"]`` of ``reset``."""
        return [t.schema() for t in self.tools]

    def _parse_feedback(self, parse: ParseResult) -> list[Message]:
        """The messages the model gets about how its calls were written, before ``_on_turn``'s.

        Default: for a ``malformed`` parse, one user message saying what was wrong
        (``PARSE_ERROR_PREFIX`` + the parser's reason) and showing a well-formed call
        (``example_call()``), or saying that the task has no tools; nothing otherwise.
        """
        if parse.status != "malformed":
            return []
        if not self.tools:
            how = " No tools are available in this task."
        else:
            how = f"\nWrite a call like this:\n{format_call(self.example_call(), self.tool_parser)}"
        return [{"role": "user", "content": f"{PARSE_ERROR_PREFIX}{parse.error}.{how}"}]

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
        messages = self._start_episode(self._task)
        if not self._prompt_checked:
            self._prompt_checked = True
            self._warn_on_foreign_prompt(messages)
        return to_observation(messages), self._info(tools=self.tool_schemas())

    def step(self, action: str) -> tuple[tuple, float, bool, bool, dict]:
        """Play one assistant turn; returns ``(obs, reward, terminated, truncated, info)``.

        Raises:
            ToolUnavailableError: If a tool call of the turn failed for a reason that is not the
                model's (an ``"unavailable"`` result; it names the first such call's tool and
                why). The episode has then ended without ``_on_turn`` seeing the turn: call
                ``reset`` to go on.
        """
        self._require_active("step()")
        if not isinstance(action, str):
            raise TypeError(f"action must be the assistant turn as str, got {type(action).__name__}")
        parse = self._read_calls(action)
        results = self._execute(parse.calls)
        broken = next((r for r in results if r.unavailable), None)
        if broken is not None:
            self._done = True
            raise ToolUnavailableError.of(broken)
        outcome = self._on_turn(action, parse, results)
        self._turn += 1
        self._success = self._success or outcome.success
        terminated = bool(outcome.terminated)
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        messages = ([{"role": "tool", "content": r.content} for r in results] + self._parse_feedback(parse)
                    + list(outcome.messages))
        messages = [{**m, "content": escape_invalid(m["content"])} if isinstance(m, dict)
                    and isinstance(m.get("content"), str) else m for m in messages]
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
    def _read_calls(self, action: str) -> ParseResult:
        """The parse of ``action``; a turn without well-formed calls in the env's format but with
        calls of its tools in another format is ``malformed`` with a message naming that format
        (the env cannot read them; the model is told which format to use), also where the env's
        parser took the foreign markup for a broken call of its own."""
        parse = self._parse(action)
        if parse.status == "ok" or not self._tools_by_name:
            return parse
        others = other_formats(action, self.tool_parser, self._tools_by_name)
        if not others:
            return parse
        return ParseResult("malformed", (), parse.content, (
            f"the call is written in the {' / '.join(others)} format, but this task reads calls in the "
            f"{self.tool_parser} format"))

    def _warn_on_foreign_prompt(self, messages: list[Message]) -> None:
        """Warn when the opening messages hand-write the tools (``hand_written_tools``): they reach
        the model through ``info["tools"]`` and the chat template, in the model's own format."""
        problems = hand_written_tools("\n".join(str(m.get("content", "")) for m in messages), self._tools_by_name,
                                      self.tool_parser)
        if problems:
            warnings.warn(
                f"{type(self).__name__}'s opening messages {'; and '.join(problems)}. The tools reach the model "
                "through info['tools'] and the chat template (or the renderer's tools_prompt() for a template "
                "without tools), in the format the model writes: state the task only in the prompt, and write "
                "the expert's calls with format_call(call, self.tool_parser).", UserWarning, stacklevel=3)

    @staticmethod
    def _resolve_executors(tools: Mapping[str, Tool], executors: Mapping[str, str] | None,
                           options: Mapping[str, Mapping] | None) -> dict[str, Executor]:
        """Tool name -> the executor that runs it (``executors`` overrides, built with ``options``)."""
        executors, options = dict(executors or {}), dict(options or {})
        unknown_tools = sorted(set(executors) - set(tools))
        if unknown_tools:
            raise ValueError(f"executors names unknown tools {unknown_tools}; "
                             f"this env's tools: {sorted(tools)}")
        kinds = {name: executors.get(name, t.executor) for name, t in tools.items()}
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

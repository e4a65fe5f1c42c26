"""MCP: an MCP server's tools, with tasks and a reward from the env definition, as a chat env.

Description:
    ``MCPEnv(url, tasks, verify=...)`` is a tool-using env whose tools live on an MCP server (the
    ``mcp`` package's streamable HTTP transport: ``MCPServer(...).streamable_http_app()``, or any
    MCP server reachable at a URL). The MCP protocol has tools but no tasks or rewards, so those
    come from the env definition, as in the MCP envs of other RL frameworks:

    * ``tasks``: the prompts, each a mapping with ``"prompt"`` (str) and anything a verifier or a
      scripted player needs (``"answer"``...), optionally ``"id"`` and ``"split"``;
    * the reward of the final answer: ``verify(task, answer) -> float | bool`` (a Python function
      of the definition) when given, else the server's **reward tool**: the tool named
      ``reward_tool``, or the one whose MCP ``_meta`` holds ``{"turnrl/reward": true}``. The reward
      tool is hidden from the model (also when ``verify`` is given); at the end it is called with
      the arguments its schema names, taken from ``{"answer": <final answer>, **task}``, and returns
      the reward (a number, as its structured result or its text).

    Each episode is one MCP session (opened at reset, closed at the next reset or ``close``), so a
    server that keeps state per session gives every episode a fresh one. The client is the ``mcp``
    package's ``Client``, driven on turnrl's background event loop.

Action Space:
    The assistant's text. Its tool calls (in the env's ``tool_parser`` format) are the server's
    tools (``tools/list``; the reward tool left out), shown through ``info["tools"]``. A turn
    without a tool call is the final answer. A call the server refuses (an ``isError`` result, an
    MCP error) is an error message to the model; a call the server does not answer (gone, no reply
    within ``timeout_s``, a result that is not text) raises ``ToolUnavailableError`` (the episode
    ends with ``tool_error``).

Observation Space:
    Reset: the ``system_prompt`` (when given) and the task's prompt as a user message. Each call's
    result is a tool message (its text contents, joined by newlines).

Rewards:
    0.0 on tool turns; the final answer's reward on the last turn (``verify``'s, or the reward
    tool's; a bool is 0.0 / 1.0; a reward that is not a finite number raises ``ProtocolError``).

Episode End:
    ``terminated`` on the final answer; ``truncated`` after ``max_turns`` turns of tool calls
    (default ``DEFAULT_MAX_TURNS``). A session that cannot be opened, a tool listing that is not one,
    or a reward tool that fails raises ``ProtocolError`` from ``reset`` / ``step``: that episode ends
    with ``env_error``.

Info:
    The ``MultiTurnEnv`` keys. ``task_id`` is the task's ``"id"``, else a hash of its prompt;
    ``state_key`` is ``(task_id, number of tool results so far)``; ``success`` is ``reward > 0`` on
    the final answer. ``env.history`` is the episode's messages, for scripted players.

Splits:
    A task's ``"split"`` when it has one, else ``test`` iff ``crc32(prompt) % 5 == 0``; ``tasks`` may
    also be ``{"train": [...], "test": [...]}``. A reset draws uniformly from the split's tasks with
    ``self.np_random``. Without test tasks the env has one split.

Scripted players:
    ``expert(env) -> str`` and ``random_player(env, rng) -> str`` (optional).

Version History:
    v0: initial version (mcp 2.3).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import math
import zlib
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from turnrl.envs.adapters.served_tools import MAX_TOOLS, ProtocolError, checked_reward, checked_text, served_tool
from turnrl.envs.base import SPLITS, Message, MultiTurnEnv, TurnOutcome
from turnrl.tools import ParseResult, ToolResult, ToolUnavailableError
from turnrl.tools.executors import get_loop

__all__ = ["DEFAULT_MAX_TURNS", "MCPEnv", "REWARD_META"]

DEFAULT_MAX_TURNS = 8
REWARD_META = "turnrl/reward"
"""The ``_meta`` key by which an MCP server marks its reward tool."""
TEST_BUCKETS, TEST_BUCKET = 5, 0

Verify = Callable[[Mapping[str, Any], str], Any]
Player = Callable[["MCPEnv"], str]
RandomPlayer = Callable[["MCPEnv", np.random.Generator], str]


class _Session:
    """One MCP client session, held open by a task on the background loop that runs the jobs it is
    sent, one at a time (the ``mcp`` client's context must be entered and left in one task)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self._loop = get_loop()
        self._queue: asyncio.Queue | None = None
        opened: concurrent.futures.Future = concurrent.futures.Future()
        self._done = asyncio.run_coroutine_threadsafe(self._serve(opened), self._loop)
        try:
            opened.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError as e:
            self.close()
            raise ProtocolError(f"no MCP session within timeout_s={timeout_s:g}", url=url, what="opening a session") \
                from e
        except Exception as e:
            raise ProtocolError(f"{type(e).__name__}: {_first_error(e)} (is an MCP server serving streamable HTTP "
                                "there?)", url=url, what="opening a session") from e

    async def _serve(self, opened: concurrent.futures.Future) -> None:
        from mcp import Client  # the protocols extra

        pending: list[concurrent.futures.Future] = []
        try:
            async with Client(self.url, read_timeout_seconds=self.timeout_s) as client:
                self._queue = asyncio.Queue()
                opened.set_result(None)
                while True:
                    job = await self._queue.get()
                    if job is None:
                        return
                    run, result = job
                    pending = [result]
                    try:
                        value = await asyncio.wait_for(run(client), self.timeout_s)
                    except Exception as e:
                        if not result.done():
                            result.set_exception(e)
                        if isinstance(e, (asyncio.TimeoutError, OSError)) or "Closed" in type(e).__name__:
                            return  # the connection is unusable: later jobs fail at once
                    else:
                        if not result.done():
                            result.set_result(value)
                    pending = []
        except BaseException as e:
            if not opened.done():
                opened.set_exception(e)
            for result in pending:
                if not result.done():
                    result.set_exception(e)
            if not isinstance(e, Exception):
                raise
        finally:
            queue, self._queue = self._queue, None
            while queue is not None and not queue.empty():
                job = queue.get_nowait()
                if job is not None and not job[1].done():
                    job[1].set_exception(ConnectionError("the MCP session has ended"))

    def run(self, job: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run ``job(client)`` in the session and return its value (its exception is raised here)."""
        result: concurrent.futures.Future = concurrent.futures.Future()

        def put() -> None:
            if self._queue is None:
                result.set_exception(ConnectionError("the MCP session has ended"))
            else:
                self._queue.put_nowait((job, result))

        self._loop.call_soon_threadsafe(put)
        try:
            return result.result(timeout=self.timeout_s + 5)
        except concurrent.futures.TimeoutError as e:
            raise TimeoutError(f"no reply within timeout_s={self.timeout_s:g}") from e

    def close(self) -> None:
        """End the session (the client says goodbye to the server); waits at most a few seconds."""
        def stop() -> None:
            if self._queue is not None:
                self._queue.put_nowait(None)

        self._loop.call_soon_threadsafe(stop)
        try:
            self._done.result(timeout=5)
        except Exception:  # a dead server: the task is left to end on its own
            self._done.cancel()


class MCPEnv(MultiTurnEnv):
    """Tasks of your own, played with an MCP server's tools; see the module docstring.

    Args:
        url: The server's streamable HTTP endpoint, e.g. ``http://127.0.0.1:8000/mcp``.
        tasks: The tasks (mappings with ``"prompt"``), or ``{"train": [...], "test": [...]}``.
        verify: ``verify(task, answer) -> float | bool``, the final answer's reward (or None with a
            reward tool on the server).
        reward_tool: The server's reward tool (default: the one ``_meta`` marks with ``REWARD_META``).
        system_prompt: The opening system message (none when None).
        expert: ``expert(env) -> str``, the scripted expert (optional).
        random_player: ``random_player(env, rng) -> str`` (optional).
        max_turns: Turn limit (default ``DEFAULT_MAX_TURNS``).
        timeout_s: Seconds to open a session and for each call.
        tool_parser: The tool-call format the model writes.

    Raises:
        ValueError: On bad tasks or arguments, or with neither ``verify`` nor a reward tool.
        ProtocolError: When the server cannot be reached or lists what is not a tool.
    """

    def __init__(self, url: str, tasks: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]], *,
                 verify: Verify | None = None, reward_tool: str | None = None, system_prompt: str | None = None,
                 expert: Player | None = None, random_player: RandomPlayer | None = None,
                 max_turns: int | None = None, timeout_s: float = 30.0, tool_parser: str = "hermes") -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL such as 'http://127.0.0.1:8000/mcp', got {url!r}")
        if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if verify is not None and not callable(verify):
            raise ValueError(f"verify must be callable (task, answer) -> reward, got {verify!r}")
        self.url, self.timeout_s, self.system_prompt = url, float(timeout_s), system_prompt
        self.tasks = _split_tasks(tasks)
        self.splits: tuple[str, ...] = tuple(s for s in SPLITS if self.tasks[s])
        self._verify, self._expert, self._random_player = verify, expert, random_player
        self._mcp: _Session | None = None
        listed = self._with_session(lambda client: client.list_tools(), "listing tools", probe=True)
        tools, self.reward_tool, self._reward_args = self._read_tools(listed, reward_tool)
        if verify is None and self.reward_tool is None:
            raise ValueError("the env needs a reward: verify=callable(task, answer) -> reward, or a reward tool on the "
                             f"server (reward_tool=name, or a tool whose _meta holds {{{REWARD_META!r}: true}})")
        super().__init__(tool_parser=tool_parser, max_turns=DEFAULT_MAX_TURNS if max_turns is None else max_turns)
        self.tools = tools
        self.history: list[Message] = []
        self._results = 0

    # ------------------------------------------------------------ protocol
    def _with_session(self, job: Callable[[Any], Awaitable[Any]], what: str, *, probe: bool = False) -> Any:
        """Run ``job(client)`` in the episode's session (``probe``: in a session of its own)."""
        session = _Session(self.url, self.timeout_s) if probe else self._mcp_session
        try:
            return session.run(job)
        except (TimeoutError, ConnectionError, OSError) as e:
            raise ProtocolError(f"{type(e).__name__}: {e or 'no detail'}", url=self.url, what=what) from e
        finally:
            if probe:
                session.close()

    @property
    def _mcp_session(self) -> _Session:
        if self._mcp is None:
            self._mcp = _Session(self.url, self.timeout_s)
        return self._mcp

    def _read_tools(self, listed: Any, reward_tool: str | None) -> tuple[tuple, str | None, tuple[str, ...]]:
        what = "listing tools"
        specs = getattr(listed, "tools", None)
        if not isinstance(specs, list) or len(specs) > MAX_TOOLS:
            raise ProtocolError(f"tools/list gave {type(specs).__name__}, not a list of at most {MAX_TOOLS} tools",
                                url=self.url, what=what)
        marked = [t.name for t in specs if isinstance(t.meta, dict) and t.meta.get(REWARD_META) is True]
        if reward_tool is None and len(marked) > 1:
            raise ProtocolError(f"{len(marked)} tools are marked as the reward tool ({marked}); pass reward_tool=",
                                url=self.url, what=what)
        reward_tool = reward_tool if reward_tool is not None else (marked[0] if marked else None)
        names = [t.name for t in specs]
        if reward_tool is not None and reward_tool not in names:
            raise ValueError(f"reward_tool={reward_tool!r} is not one of the server's tools {names}")
        reward_args = next((tuple((t.input_schema or {}).get("properties", {})) for t in specs
                            if t.name == reward_tool), ())
        tools = tuple(served_tool(t.name, t.description, t.input_schema, self._call_tool, url=self.url)
                      for t in specs if t.name != reward_tool)
        return tools, reward_tool, reward_args

    def _call(self, name: str, arguments: dict) -> tuple[str, Any]:
        """Call a tool in the episode's session: ``(text, structured result)``; ValueError when the server
        refused the call; ProtocolError when it did not answer with a result."""
        from mcp import MCPError

        what = f"tool {name!r}"

        async def call(client: Any) -> Any:
            return await client.call_tool(name, arguments)

        try:
            result = self._with_session(call, what)
        except MCPError as e:
            raise ValueError(f"the server refused the call: {e}") from e
        except ProtocolError:
            raise
        except Exception as e:  # a malformed result the client could not read
            raise ProtocolError(f"{type(e).__name__}: {_first_error(e)}", url=self.url, what=what) from e
        texts = []
        for i, block in enumerate(getattr(result, "content", None) or []):
            if getattr(block, "type", None) != "text":
                raise ProtocolError(f"content[{i}] is a {getattr(block, 'type', '?')!r} block; a turnrl env takes text "
                                    "only", url=self.url, what=what)
            texts.append(checked_text(block.text, f"content[{i}].text", url=self.url, what=what))
        text = "\n".join(texts)
        if getattr(result, "is_error", False):
            raise ValueError(text or "the tool reported an error")
        return text, getattr(result, "structured_content", None)

    def _call_tool(self, name: str, arguments: dict) -> str:
        try:
            return self._call(name, arguments)[0]
        except ProtocolError as e:
            raise ToolUnavailableError(name, str(e)) from e

    def _reward(self, answer: str) -> float:
        what = "reward"
        if self._verify is not None:
            return checked_reward(self._verify(self.task, answer), "verify's reward", url=self.url, what=what)
        values = {"answer": answer, **self.task}
        try:
            text, structured = self._call(self.reward_tool, {k: values[k] for k in self._reward_args if k in values})
        except ValueError as e:
            raise ProtocolError(f"the reward tool {self.reward_tool!r} failed: {e}", url=self.url, what=what) from e
        if isinstance(structured, dict) and len(structured) == 1:
            structured = next(iter(structured.values()))
        value = structured if structured is not None else _number(text)
        return checked_reward(value, f"the reward tool {self.reward_tool!r}'s result", url=self.url, what=what)

    # ---------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> Mapping[str, Any]:
        tasks = self.tasks[split] or self.tasks["train"]
        return tasks[int(rng.integers(len(tasks)))]

    def _task_id(self, task: Mapping[str, Any]) -> str:
        return str(task["id"]) if "id" in task else "mcp-" + hashlib.sha256(task["prompt"].encode()).hexdigest()[:12]

    def _start_episode(self, task: Mapping[str, Any]) -> list[Message]:
        self._end_session()
        self._mcp_session  # noqa: B018  (open the episode's session now: a server that is down fails the reset)
        self._results = 0
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        self.history = [*opening, {"role": "user", "content": task["prompt"]}]
        return list(self.history)

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        self.history += [{"role": "assistant", "content": action},
                         *({"role": "tool", "content": r.content} for r in tool_results)]
        self._results += len(tool_results)
        if parse.calls:
            return TurnOutcome()
        reward = self._reward(action.strip())
        return TurnOutcome(reward=reward, terminated=True, success=reward > 0)

    def _state_key(self) -> Hashable:
        return (self._task_id(self.task), self._results)

    def _end_session(self) -> None:
        session, self._mcp = self._mcp, None
        if session is not None:
            session.close()

    def close(self) -> None:
        """End the episode's MCP session."""
        self._end_session()
        super().close()

    # -------------------------------------------------------------- players
    def expert_action(self) -> str:
        """The ``expert`` callable's action (NotImplementedError without one)."""
        self._require_active("expert_action()")
        if self._expert is None:
            raise NotImplementedError("this MCPEnv has no scripted expert; pass expert=callable(env) -> str")
        return self._expert(self)

    def random_action(self, rng: np.random.Generator) -> str:
        """The ``random_player`` callable's action (NotImplementedError without one)."""
        self._require_active("random_action()")
        if self._random_player is None:
            raise NotImplementedError("this MCPEnv has no random player; pass random_player=callable(env, rng) -> str")
        return self._random_player(self, rng)


def _split_tasks(tasks: Any) -> dict[str, list[Mapping[str, Any]]]:
    """``{"train": [...], "test": [...]}`` of checked tasks (see the module docstring's Splits)."""
    if isinstance(tasks, Mapping):
        unknown = sorted(set(tasks) - set(SPLITS))
        if unknown:
            raise ValueError(f"tasks by split must use the splits {SPLITS}, got {unknown}")
        items = [(split, task) for split in SPLITS for task in tasks.get(split, ())]
    elif isinstance(tasks, Sequence) and not isinstance(tasks, str):
        items = [(None, task) for task in tasks]
    else:
        raise ValueError(f"tasks must be a list of {{'prompt': ...}} mappings or {{'train': [...], 'test': [...]}}, "
                         f"got {type(tasks).__name__}")
    by_split: dict[str, list[Mapping[str, Any]]] = {s: [] for s in SPLITS}
    for i, (split, task) in enumerate(items):
        if not isinstance(task, Mapping) or not isinstance(task.get("prompt"), str) or not task["prompt"].strip():
            raise ValueError(f"task #{i} must be a mapping with a non-empty 'prompt' string, got {task!r:.120}")
        split = split or task.get("split") or (
            "test" if zlib.crc32(task["prompt"].encode()) % TEST_BUCKETS == TEST_BUCKET else "train")
        if split not in SPLITS:
            raise ValueError(f"task #{i} has split {split!r}; the splits are {SPLITS}")
        by_split[split].append(dict(task))
    if not by_split["train"]:
        raise ValueError("tasks holds no train task")
    return by_split


def _number(text: str) -> float | str:
    """``text`` as a float when it is one, else the text (which ``checked_reward`` refuses)."""
    try:
        value = float(text.strip())
    except ValueError:
        return text
    return value if math.isfinite(value) else value


def _first_error(error: BaseException) -> str:
    """The first leaf of an exception group (anyio wraps transport errors in them), as text."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}" if not isinstance(error, str) else error

"""OpenReward: an Open Reward Standard (ORS) env server as a multi-turn chat env.

Description:
    ``OpenRewardEnv(url)`` plays an environment that an ORS server serves (the ``openreward``
    package's ``Server``, or any server of the standard): the server lists splits and tasks, a
    session is one task, the model acts through the session's tools, and each tool result carries
    a reward and whether the episode finished. It speaks the standard's HTTP routes itself
    (``httpx``; no event loop, one bounded request at a time): ``GET /{env}/splits`` and
    ``/{env}/tools`` at construction; per episode ``POST /create_session`` (SSE, the session id),
    ``POST /create`` (the split and task index), ``POST /{env}/task`` (the task spec, for scripted
    players), ``GET /{env}/prompt`` and ``/{env}/task_tools``; ``POST /{env}/call`` (SSE) per tool
    call; ``POST /delete`` when the episode is replaced or the env closed. ``env_name`` picks one
    of the server's environments (default: its first, from ``GET /list_environments``).

    A turnrl reset draws the task index uniformly from the split's ``num_tasks`` with
    ``self.np_random`` (same seed, same task). Opening messages: the ``system_prompt`` (when given)
    and the task's prompt (its text blocks) as a user message.

Action Space:
    The assistant's text. Its tool calls (in the env's ``tool_parser`` format) are the session's
    tools (``task_tools``: the environment's tools and the task's own), shown to the model through
    ``info["tools"]``. A turn without a call goes to the environment's terminal tool when it has
    one (``@terminal``: the plain answer is the submission, as the standard's harnesses do); else
    it gets a user message saying the task is played with its tools. A call the server refuses
    (``ok: false``: an unknown tool, input that fails validation, a call after the episode
    finished) is an error message to the model; a tool that raised on the server (an SSE
    ``error`` event, which the standard treats as the end of the rollout) or a server that cannot
    be reached raises ``ToolUnavailableError`` (the episode ends with ``tool_error``).

Observation Space:
    Each call's result is a tool message (its output's text blocks, joined by newlines); the
    terminal tool's output is a user message. Image blocks are refused (``ProtocolError``): a
    turnrl env is text.

Rewards:
    The sum of the rewards of the turn's tool outputs (``None`` is 0.0).

Episode End:
    ``terminated`` when an output says ``finished``; ``truncated`` after ``max_turns`` turns (default
    ``DEFAULT_MAX_TURNS``). A reply that breaks the standard (a missing field, a reward that is not a
    finite number, text no message can carry, more than ``MAX_REPLY_BYTES``), an HTTP error, or no
    reply within ``timeout_s`` raises ``ProtocolError`` from ``reset`` / ``step``: that episode ends
    with ``env_error``, the next reset opens a new session.

Info:
    The ``MultiTurnEnv`` keys. ``task_id`` is ``f"{env_name}/{split}/{index}"`` (the server's split
    name); ``state_key`` is ``(task_id, latest observation text)``; ``success`` is ``success_fn(env)``
    when given, else whether the output that finished the episode had a reward > 0. ``env.task_spec``
    is the task's JSON spec and ``env.history`` the episode's messages, for scripted players.

Splits:
    ``splits`` maps turnrl's ``train`` and ``test`` to the server's split names; by default the
    server's first split of type ``train``, and its first of type ``test`` (else ``validation``). A
    server without a held-out split gives one split (``splits == ("train",)``).

Scripted players:
    ``expert(env) -> str`` and ``random_player(env, rng) -> str`` (optional).

Version History:
    v0: initial version (openreward 0.1.167's server).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import httpx
import numpy as np

from turnrl.envs.adapters.served_tools import (
    MAX_TOOLS,
    ProtocolError,
    checked_bool,
    checked_reward,
    checked_text,
    served_tool,
)
from turnrl.envs.base import SPLITS, Message, MultiTurnEnv, TurnOutcome
from turnrl.tools import ParseResult, ToolResult, ToolUnavailableError

__all__ = ["DEFAULT_MAX_TURNS", "OpenRewardEnv"]

DEFAULT_MAX_TURNS = 20
MAX_REPLY_BYTES = 8 * 1024 * 1024
"""The largest reply (or SSE stream) taken from the server."""
NO_CALL = "Play this task by calling one of its tools."

Player = Callable[["OpenRewardEnv"], str]
RandomPlayer = Callable[["OpenRewardEnv", np.random.Generator], str]


class OpenRewardEnv(MultiTurnEnv):
    """An ORS server's environment as a chat env; see the module docstring.

    Args:
        url: The env server's base URL (``http://`` or ``https://``).
        env_name: The environment to play (default: the server's first).
        splits: turnrl split -> the server's split name (default: found from the split types).
        system_prompt: The opening system message (none when None).
        expert: ``expert(env) -> str``, the scripted expert (optional).
        random_player: ``random_player(env, rng) -> str`` (optional).
        success_fn: ``success_fn(env) -> bool`` after each turn (default: finished with reward > 0).
        headers: Extra HTTP headers for every request (e.g. an ``Authorization`` the server wants).
        max_turns: Turn limit (default ``DEFAULT_MAX_TURNS``).
        timeout_s: Seconds each request (a tool call's whole stream included) may take.
        tool_parser: The tool-call format the model writes.

    Raises:
        ProtocolError: When the server's environments, splits or tools cannot be read.
        ValueError: On bad arguments, or ``splits`` naming a split the server does not have.
    """

    def __init__(self, url: str, env_name: str | None = None, *, splits: Mapping[str, str] | None = None,
                 system_prompt: str | None = None, expert: Player | None = None,
                 random_player: RandomPlayer | None = None, success_fn: Callable[[OpenRewardEnv], bool] | None = None,
                 headers: Mapping[str, str] | None = None, max_turns: int | None = None, timeout_s: float = 60.0,
                 tool_parser: str = "hermes") -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL such as 'http://127.0.0.1:8080', got {url!r}")
        if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.system_prompt = system_prompt
        self._expert, self._random_player, self._success_fn = expert, random_player, success_fn
        self._client = httpx.Client(base_url=self.url, timeout=self.timeout_s, headers=dict(headers or {}),
                                    trust_env=False)
        self._sid: str | None = None
        try:
            if env_name is None:
                names = self._get("/list_environments", "listing environments")
                if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
                    raise ProtocolError(f"expected a list of environment names, got {_short(names)}", url=self.url,
                                        what="listing environments")
                env_name = names[0]
            self.env_name = env_name
            self.server_splits = self._read_splits()
            self.split_names = self._choose_splits(splits)
            listing = self._get(f"/{env_name}/tools", "listing tools")
            tools, self._terminal = self._read_tools(listing, "listing tools")
        except BaseException:
            self._client.close()
            raise
        self.splits: tuple[str, ...] = tuple(s for s in SPLITS if s in self.split_names)
        super().__init__(tool_parser=tool_parser, max_turns=DEFAULT_MAX_TURNS if max_turns is None else max_turns)
        self.tools = tools
        self.task_spec: Any = None
        self.history: list[Message] = []
        self._text = ""
        self._turn_reward, self._turn_finished, self._finishing_reward = 0.0, False, 0.0

    # ------------------------------------------------------------ protocol
    def _headers(self) -> dict:
        return {} if self._sid is None else {"X-Session-ID": self._sid}

    def _get(self, path: str, what: str) -> Any:
        return self._json("GET", path, what)

    def _json(self, method: str, path: str, what: str, body: dict | None = None) -> Any:
        try:
            response = self._client.request(method, path, json=body, headers=self._headers())
        except httpx.HTTPError as e:
            raise ProtocolError(f"{method} {path} failed: {type(e).__name__}: {e or 'no detail'} (is the ORS server "
                                f"running, and did it answer within timeout_s={self.timeout_s:g}?)", url=self.url,
                                what=what) from e
        if len(response.content) > MAX_REPLY_BYTES:
            raise ProtocolError(f"{method} {path}: a reply of {len(response.content)} bytes, over {MAX_REPLY_BYTES}",
                                url=self.url, what=what)
        try:
            reply = response.json()
        except ValueError:
            reply = None
        if response.status_code != 200:
            detail = reply.get("detail") if isinstance(reply, dict) else response.text[:300]
            raise ProtocolError(f"{method} {path}: HTTP {response.status_code}: {_short(detail, 300)}", url=self.url,
                                what=what)
        if reply is None:
            raise ProtocolError(f"{method} {path}: the reply is not JSON: {response.text[:200]!r}", url=self.url,
                                what=what)
        return reply

    def _sse(self, path: str, what: str, body: dict | None = None) -> tuple[str, str]:
        """POST ``path`` and read its event stream to the end: ``("end", data)`` (the ``chunk`` and
        ``end`` events' data joined) or ``("error", data)``; ``task_id`` events are skipped."""
        deadline = time.monotonic() + self.timeout_s
        event, data, chunks, size = "message", [], [], 0
        try:
            with self._client.stream("POST", path, json=body, headers=self._headers()) as response:
                if response.status_code != 200:
                    response.read()
                    raise ProtocolError(f"POST {path}: HTTP {response.status_code}: {response.text[:300]}",
                                        url=self.url, what=what)
                for line in response.iter_lines():
                    size += len(line) + 1
                    if size > MAX_REPLY_BYTES or time.monotonic() > deadline:
                        raise ProtocolError(f"POST {path}: the event stream passed {MAX_REPLY_BYTES} bytes or "
                                            f"timeout_s={self.timeout_s:g}", url=self.url, what=what)
                    if line.startswith(":"):  # a keep-alive comment
                        continue
                    if line:
                        field, _, value = line.partition(":")
                        value = value[1:] if value.startswith(" ") else value
                        if field == "event":
                            event = value
                        elif field == "data":
                            data.append(value)
                        continue
                    if event == "error":
                        return "error", "\n".join(data)
                    if event in ("chunk", "end"):
                        chunks.append("\n".join(data))
                        if event == "end":
                            return "end", "".join(chunks)
                    elif event == "task_id" and path == "/create_session":
                        return "end", "\n".join(data)
                    event, data = "message", []
        except httpx.HTTPError as e:
            raise ProtocolError(f"POST {path} failed: {type(e).__name__}: {e or 'no detail'}", url=self.url,
                                what=what) from e
        raise ProtocolError(f"POST {path}: the event stream ended without an 'end' or 'error' event", url=self.url,
                            what=what)

    def _read_splits(self) -> list[tuple[str, str]]:
        what = "listing splits"
        reply = self._get(f"/{self.env_name}/splits", what)
        if not isinstance(reply, list) or not all(isinstance(s, dict) and isinstance(s.get("name"), str)
                                                  for s in reply):
            raise ProtocolError(f"expected [{{'name': ..., 'type': ...}}, ...], got {_short(reply)}", url=self.url,
                                what=what)
        return [(s["name"], str(s.get("type"))) for s in reply]

    def _choose_splits(self, splits: Mapping[str, str] | None) -> dict[str, str]:
        names = [name for name, _ in self.server_splits]
        if splits is not None:
            unknown = {k: v for k, v in splits.items() if k not in SPLITS or v not in names}
            if unknown or "train" not in splits:
                raise ValueError(f"splits must map 'train' (and optionally 'test') to the server's splits {names}, "
                                 f"got {dict(splits)}")
            return dict(splits)
        by_type: dict[str, str] = {}
        for name, kind in self.server_splits:
            by_type.setdefault(kind, name)
        train = by_type.get("train", names[0] if names else None)
        if train is None:
            raise ProtocolError("the environment lists no split", url=self.url, what="listing splits")
        test = by_type.get("test", by_type.get("validation"))
        return {"train": train, **({"test": test} if test is not None and test != train else {})}

    def _read_tools(self, listing: Any, what: str) -> tuple[tuple, dict | None]:
        if not isinstance(listing, dict) or not isinstance(listing.get("tools"), list):
            raise ProtocolError(f"expected {{'tools': [...], 'terminal_tool': ...}}, got {_short(listing)}",
                                url=self.url, what=what)
        specs = listing["tools"]
        if len(specs) > MAX_TOOLS or not all(isinstance(t, dict) for t in specs):
            raise ProtocolError(f"expected at most {MAX_TOOLS} tool specs, got {_short(specs)}", url=self.url,
                                what=what)
        tools = tuple(served_tool(t.get("name"), t.get("description"), t.get("input_schema"), self._call_tool,
                                  url=self.url) for t in specs)
        terminal = listing.get("terminal_tool")
        if terminal is not None and not (isinstance(terminal, dict) and isinstance(terminal.get("name"), str)
                                         and (terminal.get("arg") is None or isinstance(terminal.get("arg"), str))):
            raise ProtocolError(f"terminal_tool must be {{'name': str, 'arg': str | null}}, got {_short(terminal)}",
                                url=self.url, what=what)
        return tools, terminal

    def _run(self, name: str, arguments: dict) -> tuple[str, float, bool]:
        """Call a tool of the session: ``(text, reward, finished)``; ValueError when the server refused it."""
        what = f"tool {name!r}"
        kind, data = self._sse(f"/{self.env_name}/call", what, {"name": name, "input": arguments})
        if kind == "error":
            raise ProtocolError(f"the tool raised on the server: {data[:500]}", url=self.url, what=what)
        try:
            result = json.loads(data)
        except ValueError as e:
            raise ProtocolError(f"the result is not JSON: {data[:200]!r}", url=self.url, what=what) from e
        if not isinstance(result, dict) or not isinstance(result.get("ok"), bool):
            raise ProtocolError(f"expected {{'ok': true|false, ...}}, got {_short(result)}", url=self.url, what=what)
        if not result["ok"]:
            raise ValueError(checked_text(result.get("error"), "error", url=self.url, what=what))
        output = result.get("output")
        if not isinstance(output, dict):
            raise ProtocolError(f"output must be an object, got {_short(output)}", url=self.url, what=what)
        text = self._blocks_text(output.get("blocks"), "output.blocks", what)
        reward = checked_reward(output.get("reward"), "output.reward", url=self.url, what=what)
        finished = checked_bool(output.get("finished", False), "output.finished", url=self.url, what=what)
        return text, reward, finished

    def _call_tool(self, name: str, arguments: dict) -> str:
        try:
            text, reward, finished = self._run(name, arguments)
        except ProtocolError as e:
            raise ToolUnavailableError(name, str(e)) from e
        self._count(reward, finished)
        return text

    def _count(self, reward: float, finished: bool) -> None:
        self._turn_reward += reward
        if finished and not self._turn_finished:
            self._turn_finished, self._finishing_reward = True, reward

    def _blocks_text(self, blocks: Any, where: str, what: str) -> str:
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise ProtocolError(f"{where} must be a list of blocks, got {_short(blocks)}", url=self.url, what=what)
        texts = []
        for i, block in enumerate(blocks):
            if block.get("type", "text") != "text":
                raise ProtocolError(f"{where}[{i}] is a {_short(block.get('type'))} block; a turnrl env takes text "
                                    "blocks only", url=self.url, what=what)
            texts.append(checked_text(block.get("text"), f"{where}[{i}].text", url=self.url, what=what))
        return "\n".join(texts)

    def _open_session(self, split: str, index: int) -> None:
        self._close_session_on_server()
        kind, sid = self._sse("/create_session", "opening a session")
        if kind != "end" or not sid or len(sid) > 256 or not sid.isprintable():
            raise ProtocolError(f"/create_session gave no session id ({kind}: {sid[:100]!r})", url=self.url,
                                what="opening a session")
        self._sid = sid
        self._json("POST", "/create", "opening a session", {"env_name": self.env_name, "split": split, "index": index})

    def _close_session_on_server(self) -> None:
        if self._sid is not None:
            try:
                self._client.post("/delete", headers=self._headers(), timeout=min(self.timeout_s, 5.0))
            except httpx.HTTPError:  # a dead server must not stall the next reset; its reaper frees the session
                pass
            self._sid = None

    # ---------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> tuple[str, int]:
        name = self.split_names["test" if split == "test" and "test" in self.split_names else "train"]
        what = "reset"
        reply = self._json("POST", f"/{self.env_name}/num_tasks", what, {"split": name})
        count = reply.get("num_tasks") if isinstance(reply, dict) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ProtocolError(f"num_tasks of split {name!r} must be a positive int, got {_short(reply)}",
                                url=self.url, what=what)
        return name, int(rng.integers(count))

    def _task_id(self, task: tuple[str, int]) -> str:
        return f"{self.env_name}/{task[0]}/{task[1]}"

    def _start_episode(self, task: tuple[str, int]) -> list[Message]:
        split, index = task
        what = "reset"
        reply = self._json("POST", f"/{self.env_name}/task", what, {"split": split, "index": index})
        self.task_spec = reply.get("task") if isinstance(reply, dict) else None
        self._open_session(split, index)
        self._text = self._blocks_text(self._get(f"/{self.env_name}/prompt", what), "prompt", what)
        self.tools, self._terminal = self._read_tools(self._get(f"/{self.env_name}/task_tools", what), what)
        self._turn_reward, self._turn_finished, self._finishing_reward = 0.0, False, 0.0
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        self.history = [*opening, {"role": "user", "content": self._text}]
        return list(self.history)

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        messages: list[Message] = []
        if tool_results:
            self._text = "\n".join(r.content for r in tool_results)
        elif self._terminal is not None and not self._turn_finished:
            arg = self._terminal.get("arg")
            text, reward, finished = self._run(self._terminal["name"], {} if arg is None else {arg: action.strip()})
            self._count(reward, finished)
            self._text = text
            messages.append({"role": "user", "content": text})
        else:
            self._text = NO_CALL
            messages.append({"role": "user", "content": NO_CALL})
        reward, finished = self._turn_reward, self._turn_finished
        self._turn_reward, self._turn_finished = 0.0, False
        success = bool(self._success_fn(self)) if self._success_fn is not None else (
            finished and self._finishing_reward > 0)
        self.history += [{"role": "assistant", "content": action}, *({"role": "tool", "content": r.content}
                                                                      for r in tool_results), *messages]
        return TurnOutcome(messages=tuple(messages), reward=reward, terminated=finished, success=success)

    def _state_key(self) -> Hashable:
        return (self._task_id(self.task), self._text)

    def close(self) -> None:
        """Delete the session on the server (a failure is ignored) and close the connection."""
        self._close_session_on_server()
        self._client.close()
        super().close()

    # -------------------------------------------------------------- players
    def expert_action(self) -> str:
        """The ``expert`` callable's action (NotImplementedError without one)."""
        self._require_active("expert_action()")
        if self._expert is None:
            raise NotImplementedError(f"OpenRewardEnv({self.env_name}) has no scripted expert; pass "
                                      "expert=callable(env) -> str")
        return self._expert(self)

    def random_action(self, rng: np.random.Generator) -> str:
        """The ``random_player`` callable's action (NotImplementedError without one)."""
        self._require_active("random_action()")
        if self._random_player is None:
            raise NotImplementedError(f"OpenRewardEnv({self.env_name}) has no random player; pass "
                                      "random_player=callable(env, rng) -> str")
        return self._random_player(self, rng)


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

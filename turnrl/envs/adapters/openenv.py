"""OpenEnv: an env served by an OpenEnv server (``openenv-core``) as a multi-turn chat env.

Description:
    ``OpenEnvEnv(url)`` plays an env that an OpenEnv server serves (``openenv-core``'s
    ``create_app`` / ``HTTPEnvServer``: a Hugging Face Space, a container, ``uvicorn`` on your
    machine). It speaks the server's WebSocket protocol (``/ws``: one persistent session, one env
    instance on the server, the messages ``reset``, ``step``, ``state`` and ``close`` of
    ``openenv.core.env_server.types``), which is the protocol of OpenEnv's own ``EnvClient``: the
    HTTP ``/reset`` and ``/step`` routes build a fresh env per request and cannot hold an episode.
    At construction it reads ``GET /schema`` (the action and observation JSON schemas), which
    also tells whether the server is an OpenEnv server. The session opens on the first reset and
    is opened again by a reset after the connection was lost.

    A turnrl reset draws a seed from ``self.np_random`` and sends ``reset`` with it (and
    ``reset_kwargs``): an env whose ``reset(seed=...)`` is deterministic gives turnrl's
    same-seed-same-episode contract. Opening messages: the ``system_prompt`` (when given) and the
    first observation as a user message.

Action Space:
    Two shapes of OpenEnv env, found from the action schema (or set with ``action_field`` /
    ``tools``):

    * a text env (an action with one string field, e.g. ``{"message": str}``): the assistant's
      text, stripped, is sent as ``{action_field: text}``; one step per turn;
    * an MCP-shaped env (its actions include OpenEnv's ``CallToolAction``: ``{"type":
      "call_tool", "tool_name", "arguments"}``, e.g. an ``MCPEnvironment``): the server's tools
      (``ListToolsAction`` after connecting) are the env's tools, shown to the model through
      ``info["tools"]``; each tool call of a turn is one ``call_tool`` step, and its result is the
      call's tool message. A turn without a call gets a user message saying the task is played
      with its tools (and, when the env also has a text field, is sent as a text action).

    A tool the server refuses (``CallToolObservation.error``, an unknown tool, bad arguments) is an
    error message to the model; a server that cannot be reached during a call raises
    ``ToolUnavailableError`` (the episode ends with ``tool_error``).

Observation Space:
    One user message per step: the observation's ``observation_field`` (default: its only string
    field, else the whole observation as key-sorted JSON; ``reward``, ``done`` and ``metadata``
    are not part of it).

Rewards:
    The steps' rewards (``None`` is 0.0), summed over the turn's steps (a turn of three tool calls
    gets the sum of three rewards).

Episode End:
    ``terminated`` when a step answers ``done: true``; ``truncated`` after ``max_turns`` turns
    (default ``DEFAULT_MAX_TURNS``). A reply that breaks the protocol (not JSON, a missing field, a
    reward that is not a finite number, a text no message can carry), an error message, a lost
    connection or no reply within ``timeout_s`` raises ``ProtocolError`` from ``reset`` / ``step``:
    that episode ends with ``env_error`` and the next reset starts afresh.

Info:
    The ``MultiTurnEnv`` keys. ``task_id`` is ``f"{name}-seed{seed}"``; ``state_key`` is the latest
    observation text; ``success`` is ``success_fn(env)`` when given, else ``done and reward > 0``
    on the last step (sticky once reached). ``env.observation`` is the latest observation dict,
    ``env.history`` the episode's messages so far (assistant turns included), for scripted players.

Splits:
    As ``TextGymEnv``: ``split_fn`` decides the split from ``(first observation text, {})``:
    ``"auto"`` (default) holds out the tasks whose first observation hashes to bucket 0 of 5
    (``hash_split``), a callable decides itself, ``None`` gives one split. A reset redraws the seed
    (at most ``MAX_DRAWS`` times) until the split matches.

Scripted players:
    ``expert(env) -> str`` and ``random_player(env, rng) -> str`` (both optional; the env passes
    itself, so a player reads ``env.observation`` and ``env.history``).

Version History:
    v0: initial version (openenv-core 0.3).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import httpx
import numpy as np

from turnrl.envs.adapters.served_tools import (
    ProtocolError,
    checked_bool,
    checked_reward,
    checked_text,
    served_tool,
    to_text,
)
from turnrl.envs.adapters.text_gym import MAX_DRAWS, auto_split
from turnrl.envs.base import SPLITS, Message, MultiTurnEnv, TurnOutcome
from turnrl.tools import ParseResult, ToolResult, ToolUnavailableError

__all__ = ["DEFAULT_MAX_TURNS", "OpenEnvEnv"]

DEFAULT_MAX_TURNS = 20
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""The largest WebSocket message taken from the server (a bigger one ends the episode)."""
NO_CALL = "Play this task by calling one of its tools."
_HIDDEN_FIELDS = ("reward", "done", "metadata")

Expert = Callable[["OpenEnvEnv"], str]
RandomPlayer = Callable[["OpenEnvEnv", np.random.Generator], str]
SplitFn = Callable[[str, dict], str]


class OpenEnvEnv(MultiTurnEnv):
    """An OpenEnv server's env as a chat env; see the module docstring.

    Args:
        url: The server's base URL (``http://`` or ``https://``; the WebSocket URL is derived).
        action_field: The action's string field a text reply goes to (default: found from the
            action schema; None when the action has no such field).
        tools: Whether the env is played with the server's MCP tools: ``"auto"`` (when the action
            schema takes ``call_tool``), True or False.
        observation_field: The observation field shown to the model (default: its only string
            field, else the observation as JSON).
        reset_kwargs: Extra ``reset`` arguments sent with every reset (the server passes those its
            env's ``reset`` takes).
        system_prompt: The opening system message (none when None).
        expert: ``expert(env) -> str``, the scripted expert (optional).
        random_player: ``random_player(env, rng) -> str`` (optional).
        success_fn: ``success_fn(env) -> bool`` after each step (default: done with reward > 0).
        split_fn: ``"auto"``, a callable ``(first observation, info) -> split``, or None (one split).
        name: Prefix of task ids (default: the host and port).
        max_turns: Turn limit (default ``DEFAULT_MAX_TURNS``).
        timeout_s: Seconds to connect and to wait for each reply.
        tool_parser: The tool-call format the model writes.

    Raises:
        ProtocolError: When ``GET /schema`` fails or is not an OpenEnv schema, or the tools cannot
            be listed.
        ValueError: On bad arguments, or when the env has neither a text field nor tools.
    """

    def __init__(self, url: str, *, action_field: str | None = None, tools: bool | str = "auto",
                 observation_field: str | None = None, reset_kwargs: Mapping[str, Any] | None = None,
                 system_prompt: str | None = None, expert: Expert | None = None,
                 random_player: RandomPlayer | None = None, success_fn: Callable[[OpenEnvEnv], bool] | None = None,
                 split_fn: SplitFn | str | None = "auto", name: str | None = None, max_turns: int | None = None,
                 timeout_s: float = 30.0, tool_parser: str = "hermes") -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL such as 'http://127.0.0.1:8000', got {url!r}")
        if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if tools not in ("auto", True, False):
            raise ValueError(f"tools must be 'auto', True or False, got {tools!r}")
        if split_fn == "auto":
            split_fn = auto_split
        elif split_fn is not None and not callable(split_fn):
            raise ValueError(f"split_fn must be 'auto', a callable (observation, info) -> split, or None; got {split_fn!r}")
        self.url = url.rstrip("/")
        self.ws_url = "ws" + self.url[len("http"):] + "/ws"
        self.timeout_s = float(timeout_s)
        self.reset_kwargs = dict(reset_kwargs or {})
        self.system_prompt = system_prompt
        self.name = name or self.url.split("://", 1)[1]
        self.splits: tuple[str, ...] = SPLITS if split_fn is not None else ("train",)
        self._split_fn, self._expert, self._random_player, self._success_fn = split_fn, expert, random_player, success_fn
        self._lock = threading.Lock()
        self._ws: Any = None
        schema = self._schema()
        self.action_field = action_field if action_field is not None else _text_field(schema["action"])
        self.observation_field = observation_field
        self.uses_tools = _takes_tool_calls(schema["action"]) if tools == "auto" else bool(tools)
        if self.action_field is None and not self.uses_tools:
            raise ValueError(f"the env at {self.url} takes actions {_short(schema['action'])}: no string field to send "
                             "a reply in and no call_tool action; pass action_field=... (or tools=True for an "
                             "MCP-shaped env)")
        super().__init__(tool_parser=tool_parser, max_turns=DEFAULT_MAX_TURNS if max_turns is None else max_turns)
        if self.uses_tools:
            self.tools = self._list_tools()
        self.observation: dict = {}
        self.history: list[Message] = []
        self._seed: int | None = None
        self._text = ""
        self._turn_reward, self._turn_done, self._last_reward = 0.0, False, 0.0

    # ------------------------------------------------------------ protocol
    def _schema(self) -> dict:
        what = "GET /schema"
        try:
            response = httpx.get(f"{self.url}/schema", timeout=self.timeout_s, trust_env=False)
            reply = response.json()
        except (httpx.HTTPError, ValueError) as e:
            raise ProtocolError(f"{type(e).__name__}: {e}; is an OpenEnv server running there?", url=self.url,
                                what=what) from e
        if response.status_code != 200 or not isinstance(reply, dict) or not all(
                isinstance(reply.get(k), dict) for k in ("action", "observation")):
            raise ProtocolError(f"HTTP {response.status_code}, {_short(reply)}: not an OpenEnv schema "
                                "{'action': {...}, 'observation': {...}, 'state': {...}}", url=self.url, what=what)
        return reply

    def _request(self, message: dict, what: str) -> dict:
        """Send one message on the session's WebSocket and return the checked ``data`` of the reply."""
        from websockets.exceptions import WebSocketException  # openenv-core's client library
        from websockets.sync.client import connect

        with self._lock:
            try:
                if self._ws is None:
                    self._ws = connect(self.ws_url, open_timeout=self.timeout_s, close_timeout=1,
                                       max_size=MAX_MESSAGE_BYTES)
                self._ws.send(json.dumps(message))
                raw = self._ws.recv(timeout=self.timeout_s)
            except (OSError, TimeoutError, WebSocketException) as e:
                self._drop()  # a late reply would answer the next request: start a new session
                raise ProtocolError(f"{type(e).__name__}: {e or 'no detail'} (the server is gone, or gave no reply "
                                    f"within timeout_s={self.timeout_s:g})", url=self.url, what=what) from e
            try:
                reply = json.loads(raw)
            except ValueError as e:
                self._drop()
                raise ProtocolError(f"the reply is not JSON: {_short(raw)}", url=self.url, what=what) from e
        if not isinstance(reply, dict) or not isinstance(reply.get("data"), dict):
            raise ProtocolError(f"the reply must be {{'type': ..., 'data': {{...}}}}, got {_short(reply)}", url=self.url,
                                what=what)
        if reply.get("type") == "error":
            data = reply["data"]
            raise ProtocolError(f"the server answered an error: {_short(data.get('message'))} "
                                f"(code {_short(data.get('code'))})", url=self.url, what=what)
        if reply.get("type") != "observation":
            raise ProtocolError(f"expected an observation reply, got type {_short(reply.get('type'))}", url=self.url,
                                what=what)
        return reply["data"]

    def _result(self, message: dict, what: str) -> tuple[dict, float, bool]:
        """``(observation, reward, done)`` of a reset or step reply, checked."""
        data = self._request(message, what)
        observation = data.get("observation")
        if not isinstance(observation, dict):
            raise ProtocolError(f"observation must be an object, got {_short(observation)}", url=self.url, what=what)
        reward = checked_reward(data.get("reward"), "reward", url=self.url, what=what)
        done = checked_bool(data.get("done", False), "done", url=self.url, what=what)
        return observation, reward, done

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.close()
            except Exception:  # already broken: nothing to close
                pass

    def _list_tools(self) -> tuple:
        data = self._request({"type": "step", "data": {"type": "list_tools"}}, "list_tools")
        listed = data.get("observation", {}).get("tools") if isinstance(data.get("observation"), dict) else None
        if not isinstance(listed, list) or not all(isinstance(t, dict) for t in listed):
            raise ProtocolError(f"list_tools must answer {{'tools': [{{name, description, input_schema}}, ...]}}, got "
                                f"{_short(data)}", url=self.url, what="list_tools")
        return tuple(served_tool(t.get("name"), t.get("description"), t.get("input_schema"), self._call_tool,
                                 url=self.url) for t in listed)

    def _call_tool(self, name: str, arguments: dict) -> str:
        what = f"tool {name!r}"
        try:
            observation, reward, done = self._result(
                {"type": "step", "data": {"type": "call_tool", "tool_name": name, "arguments": arguments}}, what)
        except ProtocolError as e:
            raise ToolUnavailableError(name, str(e)) from e
        with self._lock:
            self._turn_reward += reward
            self._turn_done = self._turn_done or done
            self._last_reward = reward
            self.observation = observation
        error = observation.get("error")
        if error:
            message = error.get("message", error) if isinstance(error, dict) else error
            raise ValueError(checked_text(to_text(message), "error", url=self.url, what=what))
        return checked_text(_tool_text(observation.get("result")), "result", url=self.url, what=what)

    def _observation_text(self, observation: dict, what: str) -> str:
        field = self.observation_field
        if field is None:
            strings = [k for k, v in observation.items() if isinstance(v, str) and k not in _HIDDEN_FIELDS]
            field = strings[0] if len(strings) == 1 else None
        if field is not None:
            return checked_text(observation.get(field), f"observation[{field!r}]", url=self.url, what=what)
        shown = {k: v for k, v in observation.items() if k not in _HIDDEN_FIELDS}
        return checked_text(to_text(shown), "observation", url=self.url, what=what)

    # ---------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> tuple[int, dict, str]:
        for _ in range(MAX_DRAWS):
            seed = int(rng.integers(2**31 - 1))
            observation, _, _ = self._result({"type": "reset", "data": {**self.reset_kwargs, "seed": seed}}, "reset")
            text = self._observation_text(observation, "reset")
            if self._split_fn is None or self._split_of(text) == split:
                return seed, observation, text
        raise ValueError(f"no {split!r} task of {self.name} in {MAX_DRAWS} resets: the first observations all fall in "
                         "the other split; pass split_fn=None (one split) or a split_fn")

    def _split_of(self, text: str) -> str:
        split = self._split_fn(text, {})
        if split not in SPLITS:
            raise ValueError(f"split_fn must return one of {SPLITS}, got {split!r}")
        return split

    def _task_id(self, task: tuple[int, dict, str]) -> str:
        return f"{self.name}-seed{task[0]}"

    def _start_episode(self, task: tuple[int, dict, str]) -> list[Message]:
        self._seed, self.observation, self._text = task
        self._turn_reward, self._turn_done, self._last_reward = 0.0, False, 0.0
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        self.history = [*opening, {"role": "user", "content": self._text}]
        return list(self.history)

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        messages: list[Message] = []
        with self._lock:
            reward, done = self._turn_reward, self._turn_done
            self._turn_reward, self._turn_done = 0.0, False
        if tool_results:
            self._text = "\n".join(r.content for r in tool_results)
        elif self.action_field is not None:
            observation, step_reward, step_done = self._result(
                {"type": "step", "data": {self.action_field: action.strip()}}, "step")
            self.observation, self._text = observation, self._observation_text(observation, "step")
            reward, done, self._last_reward = reward + step_reward, done or step_done, step_reward
            messages.append({"role": "user", "content": self._text})
        else:
            messages.append({"role": "user", "content": NO_CALL})
        success = bool(self._success_fn(self)) if self._success_fn is not None else done and self._last_reward > 0
        self.history += [{"role": "assistant", "content": action}, *({"role": "tool", "content": r.content}
                                                                      for r in tool_results), *messages]
        return TurnOutcome(messages=tuple(messages), reward=reward, terminated=done, success=success)

    def _state_key(self) -> Hashable:
        return self._text

    def close(self) -> None:
        """Close the session (the server closes its env instance)."""
        if self._ws is not None:
            try:
                with self._lock:
                    self._ws.send(json.dumps({"type": "close"}))
            except Exception:  # a dead server must not stall shutdown
                pass
            self._drop()
        super().close()

    # -------------------------------------------------------------- players
    def expert_action(self) -> str:
        """The ``expert`` callable's action (NotImplementedError without one)."""
        self._require_active("expert_action()")
        if self._expert is None:
            raise NotImplementedError(f"OpenEnvEnv({self.name}) has no scripted expert; pass expert=callable(env) -> str")
        return self._expert(self)

    def random_action(self, rng: np.random.Generator) -> str:
        """The ``random_player`` callable's action (NotImplementedError without one)."""
        self._require_active("random_action()")
        if self._random_player is None:
            raise NotImplementedError(f"OpenEnvEnv({self.name}) has no random player; pass "
                                      "random_player=callable(env, rng) -> str")
        return self._random_player(self, rng)


def _text_field(schema: dict) -> str | None:
    """The action's string field (the required one when several are strings), or None."""
    properties = schema.get("properties", {}) if isinstance(schema.get("properties"), dict) else {}
    strings = [k for k, v in properties.items() if isinstance(v, dict) and v.get("type") == "string"
               and k not in ("type", "tool_name") and k not in _HIDDEN_FIELDS]
    required = [k for k in strings if k in schema.get("required", [])]
    return (required or strings)[0] if len(required or strings) == 1 else None


def _takes_tool_calls(schema: dict) -> bool:
    """Whether an action schema accepts OpenEnv's ``CallToolAction`` (itself, or in a union)."""
    text = json.dumps(schema)
    return '"tool_name"' in text and '"call_tool"' in text or schema.get("title") in ("Action", "CallToolAction")


def _tool_text(result: Any) -> str:
    """A ``CallToolObservation.result`` as text: an MCP result's text content, a value as JSON."""
    if isinstance(result, dict):
        if "data" in result and result["data"] is not None:
            return to_text(result["data"])
        content = result.get("content")
        if isinstance(content, list) and all(isinstance(c, dict) and isinstance(c.get("text"), str) for c in content):
            return "\n".join(c["text"] for c in content)
    return to_text(result)


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

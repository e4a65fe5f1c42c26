"""Serve tools over HTTP: ``ToolServer`` and ``python -m turnrl.tools.serve module:attr``.

The protocol (JSON over HTTP/1.1, what ``turnrl.tools.executors.remote`` speaks):

- ``GET /tools`` -> 200, the list of ``tool.schema()``.
- ``POST /call`` with ``{"name": str, "arguments": object, "session": str}`` (``name`` a
  non-empty string; ``arguments`` and ``session`` may be omitted: ``{}`` and ``""``; no other
  keys), e.g. ``{"name": "calculator", "arguments": {"expression": "1+2"}, "session":
  "episode-1"}`` -> 200 ``{"content": str, "error": null | str}``, where ``error`` is a
  ``ToolResult.error`` kind (``"bad_arguments"`` when the arguments break the tool's schema,
  ``"exception"`` when the tool raised, ...).
- ``POST /close_session`` with ``{"session": str}`` -> 200 ``{"closed": session}``: frees the
  session's resources on the executors its calls used (see Sessions below).
- ``GET /health`` -> 200 ``{"status": "ok"}`` (open without a token).

Every refusal has the one error format of turnrl's servers (``turnrl.serving.errors``)::

    {"error": {"message": str, "type": str, "code": <the HTTP status>, "param": str | null, ...}}

- 404 ``"unknown_tool"``: the call names a tool this server does not serve (the model's
  mistake); the error also holds ``"tools"``, the names it serves, and its message is the
  text the model sees (``Error: unknown tool 'x'. Available tools: ...``).
- 503 ``"unavailable"``: the call's result is ``"unavailable"``, which is not the call's fault
  (the tool raised ``ToolUnavailableError``, ``ConnectionError``..., or its executor could not
  run it; see ``turnrl.tools.execute``); a transient failure: clients retry, then report the
  call ``"unavailable"``. ``ToolUnavailable("reason")`` is the short way for a tool to say so.
- 400 ``"invalid_request_error"``: a body that is not JSON, or not the endpoint's shape
  (``param`` names the field at fault; the message says what is wrong and shows an example
  body); also a bad ``Content-Length``, JSON nested more than 64 levels deep or an integer of
  thousands of digits.
- 404 ``"not_found_error"``: no such endpoint (the message lists them); clients take it for a
  wrong URL, not for an unknown tool. 405: a method the endpoint does not take. 411: a body
  sent with ``Transfer-Encoding`` (send a ``Content-Length``). 413: a body over
  ``MAX_BODY_BYTES``.
- 401 ``"authentication_error"``: a server with a ``token`` (the command line reads it from the
  variable ``--token-env`` names, default ``TURNRL_SERVER_TOKEN``; required when bound to an
  address other than loopback) refuses every request but ``GET /health`` without
  ``Authorization: Bearer <token>``.
- 500 ``"server_error"``: a bug of the server (logged with its traceback); it keeps serving.

A connection that does not deliver its next whole request within ``read_timeout_s`` (idle
keep-alive time included) is closed (``turnrl.serving.server``).

Sessions: a session is a name the client chooses (``RemoteExecutor`` sends the env's episode
session) that groups calls sharing state on a stateful executor, e.g. the files of a
``sandbox`` code tool. The server records no owner for a session: any client that can reach
it (holding its token, if it has one) and knows a session's name can call tools in that
session, reading and changing its state, and can close it. The name is the session's only
protection, so clients must choose names others cannot guess (turnrl's envs put 48 random bits
in theirs); calls without a session all share the session ``""``. Parties that must not
reach each other's state need a server each (with a token each). Sessions of plain
(``"inprocess"``) tools hold nothing.

Plain tools run in one of the server's worker threads (at most ``max_threads`` calls at
once; more wait for a thread) with the same validation and error texts as ``execute_call``.
A tool whose ``executor`` is another kind (e.g. a ``sandbox`` code tool) runs on the shared
executor of that kind (``get_executor(kind, **executor_options.get(kind, {}))``), so a server
can host sandboxed code execution for remote clients. The server enforces no time limit of its
own: clients time out (``RemoteExecutor.timeout_s``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field

from turnrl.serving import (DEFAULT_READ_TIMEOUT_S, DEFAULT_TOKEN_ENV, APIError, HTTPService, JSONReply, server_token,
                            service_app)
from turnrl.tools.execute import ToolResult, ToolUnavailableError, check_call, run_validated, unavailable_result
from turnrl.tools.parsers import ToolCall
from turnrl.tools.tool import Tool, tool, tool_map
from turnrl.tools.executors import get_executor
from turnrl.tools.executors.loop import run_sync

__all__ = ["CallRequest", "CloseSessionRequest", "MAX_BODY_BYTES", "ToolServer", "ToolUnavailable", "load_tools",
           "main"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest request body accepted (413 beyond)."""
ENDPOINTS = "GET /tools, POST /call, POST /close_session, GET /health"
CALL_EXAMPLE = {"name": "calculator", "arguments": {"expression": "1+2"}, "session": "episode-1"}
CLOSE_EXAMPLE = {"session": "episode-1"}


class CallRequest(BaseModel):
    """The body of ``POST /call``: one tool call, e.g.
    ``{"name": "calculator", "arguments": {"expression": "1+2"}, "session": "episode-1"}``."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [CALL_EXAMPLE]})

    name: str = Field(min_length=1, description="The tool to call (one of GET /tools).")
    arguments: dict[str, Any] = Field(default_factory=dict,
                                      description="The tool's arguments, checked against its schema.")
    session: str = Field("", description="The session the call belongs to (a name the client chooses, hard to "
                                         "guess: see the module docstring); calls in one session share state.")


class CloseSessionRequest(BaseModel):
    """The body of ``POST /close_session``, e.g. ``{"session": "episode-1"}``."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [CLOSE_EXAMPLE]})

    session: str = Field(description="The session whose resources to free.")


class ToolUnavailable(ToolUnavailableError):
    """``turnrl.tools.ToolUnavailableError`` raised with the reason alone (the tool is the one
    that raises it): ``raise ToolUnavailable("backend warming up")``.

    Like any ``"unavailable"`` failure, the server answers 503, which ``RemoteExecutor``
    retries with backoff, instead of an error result the model would see.
    """

    def __init__(self, reason: str) -> None:
        super().__init__("", reason)
        self.args = (reason,)

    def __str__(self) -> str:
        return self.reason

    def __reduce__(self):
        return type(self), (self.reason,)


class ToolServer(HTTPService):
    """An HTTP server for a set of tools (see the module docstring for the protocol).

    Usage: ``with ToolServer([calculator]) as server: remote_tools(server.url)``, or
    ``server.start()`` ... ``server.stop()``.

    Args:
        tools: The tools to serve (distinct names).
        host: Interface to bind; the loopback by default.
        port: TCP port; 0 picks a free one (read it from ``url`` after ``start``).
        executor_options: Executor kind -> options for ``get_executor``, used for tools whose
            ``executor`` is not ``"inprocess"`` (e.g. ``{"sandbox": {"limits": {...}}}``).
        token: The bearer token every request but ``GET /health`` must send (else 401);
            required unless ``host`` is loopback. None: no token (loopback only).
        read_timeout_s: Seconds a connection may take to deliver its next whole request
            (idle keep-alive time included); then it is closed (``turnrl.serving.server``).
        max_threads: Calls that run at once; more wait for a thread.

    Raises:
        ValueError: If two tools share a name, there are none, ``host`` is not loopback
            and there is no token, or ``read_timeout_s`` is not positive.
        TypeError: If an item of ``tools`` is not a ``Tool``.
    """

    def __init__(
        self,
        tools: Iterable[Tool],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        executor_options: Mapping[str, Mapping[str, Any]] | None = None,
        token: str | None = None,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        max_threads: int = 256,
    ) -> None:
        tools = list(tools)
        for item in tools:
            if not isinstance(item, Tool):
                raise TypeError(f"ToolServer serves Tool values (see turnrl.tools.tool), got {item!r}")
        if not tools:
            raise ValueError("ToolServer needs at least one tool to serve")
        super().__init__(host, port, "turnrl-tool-server", token=token, read_timeout_s=read_timeout_s,
                         max_threads=max_threads)
        self.tools: dict[str, Tool] = tool_map(tools)
        self.executor_options = {kind: dict(opts) for kind, opts in (executor_options or {}).items()}
        self._sessions: dict[str, set[str]] = {}  # session -> executor kinds (other than inprocess) its calls used
        self._lock = threading.Lock()
        self._counts_lock = threading.Lock()
        self.status_counts: Counter[int] = Counter()
        """HTTP status -> responses sent (e.g. ``status_counts[503]``), for monitoring; every reply
        of the app counts, refusals included (not the 400 of a request that is not HTTP at all)."""

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server.

        Raises:
            RuntimeError: If the server is not started.
        """
        if not self.running:
            raise RuntimeError("ToolServer is not running; call start() (or use it as a context manager) first")
        return super().url

    def stop(self) -> None:
        """Stop serving now: close the port and every open connection (calls in flight get a
        closed connection, which clients see as a failure), and close the sessions' resources.
        Idempotent."""
        super().stop()
        with self._lock:
            sessions, self._sessions = dict(self._sessions), {}
        for session, kinds in sessions.items():
            self._close_on_executors(session, kinds)

    def build_app(self) -> FastAPI:
        """The routes of the protocol on ``turnrl.serving.service_app``."""
        app = service_app(title="tool server", token=self._token, max_body_bytes=MAX_BODY_BYTES,
                          endpoints=ENDPOINTS, logger=log)
        app.add_middleware(_CountStatus, counts=self.status_counts, lock=self._counts_lock)  # outermost: 401s count
        _show_examples(app, {"/call": CALL_EXAMPLE, "/close_session": CLOSE_EXAMPLE})

        @app.get("/tools")
        async def tools() -> JSONReply:
            return JSONReply([t.schema() for t in self.tools.values()])

        @app.post("/call")
        async def call(request: CallRequest) -> JSONReply:  # the tool runs in a worker thread
            return JSONReply(await self.blocking(self.handle_call, request))

        @app.post("/close_session")
        async def close_session(request: CloseSessionRequest) -> JSONReply:
            return JSONReply(await self.blocking(self.handle_close, request))

        return app

    # -- request handling (called from the worker threads) ------------------------------------

    def handle_call(self, request: CallRequest) -> dict:
        """Run one call; the 200 payload ``{"content", "error"}``.

        Raises:
            APIError: For an unknown tool (404 ``unknown_tool``) or an ``"unavailable"`` result
                (503 ``unavailable``).
        """
        call = ToolCall(request.name, request.arguments)
        checked = check_call(call, self.tools)
        if isinstance(checked, ToolResult):
            if checked.error == "unknown_tool":
                raise APIError(404, checked.content, type="unknown_tool", param="name", tools=sorted(self.tools))
            return {"content": checked.content, "error": checked.error}
        result = self._run(checked, call, request.session)
        if result.unavailable:  # not the call's fault, maybe transient: clients retry
            raise APIError(503, result.content, type="unavailable")
        return {"content": result.content, "error": result.error}

    def handle_close(self, request: CloseSessionRequest) -> dict:
        """Close a session (whoever asks: see Sessions in the module docstring); the 200 payload."""
        with self._lock:
            kinds = self._sessions.pop(request.session, set())
        self._close_on_executors(request.session, kinds)
        return {"closed": request.session}

    def _run(self, chosen: Tool, call: ToolCall, session: str) -> ToolResult:
        if chosen.executor == "inprocess":
            return run_validated(chosen, call)

        try:
            executor = get_executor(chosen.executor, **self.executor_options.get(chosen.executor, {}))
        except Exception as e:  # unknown kind, or an executor that cannot start on this host
            return unavailable_result(call, chosen.name, f"it cannot run on this server: {e}")
        with self._lock:
            self._sessions.setdefault(session, set()).add(chosen.executor)
        return run_sync(executor.arun(chosen, call, session))

    def _close_on_executors(self, session: str, kinds: Iterable[str]) -> None:
        if not kinds:
            return

        for kind in kinds:
            try:
                get_executor(kind, **self.executor_options.get(kind, {})).close_session(session)
            except Exception:  # best effort: a failing close must not break the others
                log.warning("closing session %r on the %s executor failed", session, kind, exc_info=True)


class _CountStatus:
    """ASGI middleware: ``counts[status] += 1`` for every reply that starts."""

    def __init__(self, app: Callable, *, counts: Counter[int], lock: threading.Lock) -> None:
        self.app, self.counts, self.lock = app, counts, lock

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                with self.lock:
                    self.counts[message["status"]] += 1
            await send(message)

        await self.app(scope, receive, counted)


def _show_examples(app: FastAPI, examples: Mapping[str, Any]) -> None:
    """Append ``send e.g. <example>`` to the 400 for a body that fails its model, by path."""
    base = app.exception_handlers[RequestValidationError]

    async def invalid(request: Request, e: Exception) -> Any:
        reply = await base(request, e)
        example = examples.get(request.url.path)
        if example is None:
            return reply
        body = json.loads(reply.body)
        body["error"]["message"] += f"; send e.g. {json.dumps(example)}"
        return JSONReply(body, status_code=reply.status_code)

    app.add_exception_handler(RequestValidationError, invalid)


# -- command line ------------------------------------------------------------------------------


def load_tools(spec: str) -> list[Tool]:
    """The tools named by ``"module:attr"``: a ``Tool``, a typed documented function (made a
    tool with ``tool()``), or an iterable of those.

    Raises:
        ValueError: If ``spec`` is not ``module:attr``, the module or attribute does not exist,
            or the attribute holds something else.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"tool spec {spec!r} must be 'module:attr', e.g. 'turnrl.tools.calculator:calculator'")
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"tool spec {spec!r}: cannot import {module_name!r}: {e}") from None
    for part in attr.split("."):
        if not hasattr(value, part):
            raise ValueError(f"tool spec {spec!r}: {module_name!r} has no attribute {attr!r}")
        value = getattr(value, part)
    items = [value] if isinstance(value, Tool) or callable(value) else value
    try:
        items = list(items)
    except TypeError:
        raise ValueError(f"tool spec {spec!r} names a {type(value).__name__}, not a Tool, function or list of them") from None
    tools: list[Tool] = []
    for item in items:
        if isinstance(item, Tool):
            tools.append(item)
        elif callable(item):
            tools.append(tool(item))
        else:
            raise ValueError(f"tool spec {spec!r} holds {item!r}, which is not a Tool or function")
    return tools


def main(argv: list[str] | None = None) -> int:
    """``python -m turnrl.tools.serve SPEC [SPEC ...] [--host H] [--port P] [--token-env VAR] [--read-timeout S]``.

    Prints ``serving NAMES at URL`` on one line once the port is bound, then serves until
    SIGINT or SIGTERM. The bearer token comes from the environment variable ``--token-env``
    names (default ``TURNRL_SERVER_TOKEN``), required when ``--host`` is not loopback.
    Returns 2 on bad arguments (or a missing token), 0 after a clean stop.
    """
    parser = argparse.ArgumentParser(prog="python -m turnrl.tools.serve", description="Serve tools over HTTP.")
    parser.add_argument("specs", nargs="+", metavar="module:attr", help="a Tool, a function or a list of them")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (default 0: a free one, printed)")
    parser.add_argument("--token-env", default=None, metavar="VAR",
                        help="environment variable holding the bearer token clients must send (default "
                             f"{DEFAULT_TOKEN_ENV}, read when set; a token is required unless --host is loopback)")
    parser.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT_S, metavar="SECONDS",
                        help="close a connection that has not sent its next whole request within this many seconds "
                             f"(idle time included; default {DEFAULT_READ_TIMEOUT_S:g})")
    args = parser.parse_args(argv)
    try:
        token = server_token(args.token_env, args.host)
        tools = [t for spec in args.specs for t in load_tools(spec)]
        server = ToolServer(tools, host=args.host, port=args.port, token=token,
                            read_timeout_s=args.read_timeout).start()
    except (ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    print(f"serving {', '.join(server.tools)} at {server.url}", flush=True)
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    from turnrl.tools.serve import main as _main  # the importable module, not this __main__ copy

    raise SystemExit(_main())

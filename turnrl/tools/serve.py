"""Serve tools over HTTP: ``ToolServer`` and ``python -m turnrl.tools.serve module:attr``.

The protocol (JSON over HTTP/1.1, what ``turnrl.tools.executors.remote`` speaks):

- ``GET /tools`` -> 200, the list of ``tool.schema()``.
- ``POST /call`` with ``{"name": str, "arguments": object, "session": str}`` (``arguments``
  and ``session`` may be omitted: ``{}`` and ``""``) -> 200 ``{"content": str, "error":
  null | str}``, where ``error`` is a ``ToolResult.error`` kind (``"bad_arguments"`` when the
  arguments break the tool's schema, ``"exception"`` when the tool raised, ...). A malformed
  body -> 400 ``{"error": "bad_request", "message": ...}`` saying what was wrong; an unknown
  tool -> 404 ``{"error": "unknown_tool", "message": ..., "tools": [valid names]}``; a call
  whose result is ``"unavailable"`` (not the call's fault: the tool raised
  ``ToolUnavailableError``, ``ConnectionError``..., or its executor could not run it; see
  ``turnrl.tools.execute``) -> 503 ``{"error": "unavailable", "message": ...}`` (a transient
  failure: clients retry, then report the call ``"unavailable"``).
- ``POST /close_session`` with ``{"session": str}`` -> 200 ``{"closed": session}``: frees the
  session's resources on the executors its calls used.
- ``GET /health`` -> 200 ``{"status": "ok"}`` (open without a token).
- A server with a ``token`` (the command line reads it from the variable ``--token-env``
  names, default ``TURNRL_SERVER_TOKEN``; required when bound to an address other than
  loopback) answers a request without ``Authorization: Bearer <token>`` with 401
  ``{"error": "unauthorized", "message": ...}`` (``turnrl.http_json``).
- Requests the HTTP layer refuses (``turnrl.http_json``: a request not in whole within
  ``read_timeout_s``, a bad ``Content-Length``, JSON nested too deeply or with an integer of
  thousands of digits, a method an endpoint does not take) get a 4xx ``{"error":
  "bad_request", "message": ...}``; a POST without ``Content-Length`` gets 411.

Plain tools run in the request's thread (``ThreadingHTTPServer``: one thread per
connection) with the same validation and error texts as ``execute_call``. A tool whose
``executor`` is another kind (e.g. a ``sandbox`` code tool) runs on the shared executor of
that kind (``get_executor(kind, **executor_options.get(kind, {}))``), so a server can host
sandboxed code execution for remote clients. The server enforces no time limit of its own:
clients time out (``RemoteExecutor.timeout_s``).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from turnrl.http_json import DEFAULT_READ_TIMEOUT_S, DEFAULT_TOKEN_ENV, HTTPError, JSONHandler, JSONServer, server_token
from turnrl.tools.execute import ToolResult, ToolUnavailableError, check_call, run_validated, unavailable_result
from turnrl.tools.parsers import ToolCall
from turnrl.tools.tool import Tool, tool, tool_map

__all__ = ["MAX_BODY_BYTES", "ToolServer", "ToolUnavailable", "load_tools", "main"]

MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest request body accepted (413 beyond)."""
_CALL_KEYS = ("name", "arguments", "session")


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


class ToolServer(JSONServer):
    """An HTTP server for a set of tools (see the module docstring for the protocol).

    Usage: ``with ToolServer([calculator]) as server: remote_tools(server.url)``, or
    ``server.start()`` ... ``server.stop()``.

    Args:
        tools: The tools to serve (distinct names).
        host: Interface to bind; the loopback by default.
        port: TCP port; 0 picks a free one (read it from ``url`` after ``start``).
        executor_options: Executor kind -> options for ``get_executor``, used for tools whose
            ``executor`` is not ``"inprocess"`` (e.g. ``{"sandbox": {"limits": {...}}}``).
        token: The bearer token every request must send (else 401); required unless ``host``
            is loopback. None: no token (loopback only).
        read_timeout_s: Seconds a connection may take to deliver its next whole request
            (idle keep-alive time included); then it is closed (``turnrl.http_json``).

    Raises:
        ValueError: If two tools share a name, there are none, ``host`` is not loopback
            and there is no token, or ``read_timeout_s`` is not positive.
        TypeError: If an item of ``tools`` is not a ``Tool``.
    """

    poll_interval_s = 0.05

    def __init__(
        self,
        tools: Iterable[Tool],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        executor_options: Mapping[str, Mapping[str, Any]] | None = None,
        token: str | None = None,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    ) -> None:
        tools = list(tools)
        for item in tools:
            if not isinstance(item, Tool):
                raise TypeError(f"ToolServer serves Tool values (see turnrl.tools.tool), got {item!r}")
        if not tools:
            raise ValueError("ToolServer needs at least one tool to serve")
        super().__init__(host, port, _Handler, "turnrl-tool-server", token=token, read_timeout_s=read_timeout_s)
        self.tools: dict[str, Tool] = tool_map(tools)
        self.executor_options = {kind: dict(opts) for kind, opts in (executor_options or {}).items()}
        self._sessions: dict[str, set[str]] = {}  # session -> executor kinds its calls used
        self._lock = threading.Lock()
        self.status_counts: Counter[int] = Counter()
        """HTTP status -> responses sent (e.g. ``status_counts[503]``), for monitoring."""

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server.

        Raises:
            RuntimeError: If the server is not started.
        """
        if not self.running:
            raise RuntimeError("ToolServer is not running; call start() (or use it as a context manager) first")
        return super().url

    def start(self) -> ToolServer:
        """Bind the port and serve in a daemon thread; returns ``self``.

        Raises:
            RuntimeError: If already running.
            OSError: If the address cannot be bound (e.g. the port is taken).
        """
        if self.running:
            raise RuntimeError(f"ToolServer is already running at {self.url}")
        return super().start()

    def stop(self) -> None:
        """Stop serving now: close the port and every open connection (calls in flight get a
        closed connection, which clients see as a failure), and close the sessions' resources.
        Idempotent."""
        super().stop()
        with self._lock:
            sessions, self._sessions = dict(self._sessions), {}
        for session, kinds in sessions.items():
            self._close_on_executors(session, kinds)

    # -- request handling (called from the handler threads) -----------------------------------

    def handle_call(self, body: Any) -> dict:
        """Run the call described by a decoded ``/call`` body; the 200 payload.

        Raises:
            HTTPError: For a malformed body (400), an unknown tool (404) or an ``"unavailable"``
                result (503).
        """
        call, session = _parse_call(body)
        checked = check_call(call, self.tools)
        if isinstance(checked, ToolResult):
            if checked.error == "unknown_tool":
                raise HTTPError(404, "unknown_tool", message=checked.content, tools=sorted(self.tools))
            return {"content": checked.content, "error": checked.error}
        result = self._run(checked, call, session)
        if result.unavailable:  # not the call's fault, maybe transient: clients retry
            raise HTTPError(503, "unavailable", message=result.content)
        return {"content": result.content, "error": result.error}

    def handle_close(self, body: Any) -> dict:
        """Close a session named by a decoded ``/close_session`` body; the 200 payload."""
        if not isinstance(body, dict) or set(body) != {"session"} or not isinstance(body["session"], str):
            raise HTTPError(400, "bad_request", message='the body must be a JSON object {"session": str}')
        session = body["session"]
        with self._lock:
            kinds = self._sessions.pop(session, set())
        self._close_on_executors(session, kinds)
        return {"closed": session}

    def _run(self, chosen: Tool, call: ToolCall, session: str) -> ToolResult:
        if chosen.executor == "inprocess":
            return run_validated(chosen, call)
        from turnrl.tools.executors import get_executor  # lazily: the executors import tools
        from turnrl.tools.executors.loop import run_sync

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
        from turnrl.tools.executors import get_executor

        for kind in kinds:
            try:
                get_executor(kind, **self.executor_options.get(kind, {})).close_session(session)
            except Exception:  # best effort: a failing close must not break the others
                pass

    def _count(self, status: int) -> None:
        with self._lock:
            self.status_counts[status] += 1


def _parse_call(body: Any) -> tuple[ToolCall, str]:
    def bad(message: str) -> HTTPError:
        example = '{"name": "calculator", "arguments": {"expression": "1+2"}, "session": "episode-1"}'
        return HTTPError(400, "bad_request", message=f"{message}; send e.g. {example}")

    if not isinstance(body, dict):
        raise bad(f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(_CALL_KEYS))
    if unknown:
        raise bad(f"unknown keys {unknown}; the keys are {list(_CALL_KEYS)}")
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise bad(f'"name" must be a non-empty string, got {name!r}')
    arguments = body.get("arguments", {})
    if not isinstance(arguments, dict):
        raise bad(f'"arguments" must be a JSON object, got {type(arguments).__name__}')
    session = body.get("session", "")
    if not isinstance(session, str):
        raise bad(f'"session" must be a string, got {type(session).__name__}')
    return ToolCall(name, arguments), session


class _Handler(JSONHandler):
    """One connection of a ``ToolServer`` (HTTP/1.1 keep-alive; a connection idle for
    ``read_timeout_s`` closes). Quiet: one log line per request would flood rollouts."""

    server_version = "turnrl-tool-server"
    max_body_bytes = MAX_BODY_BYTES
    json_server: ToolServer

    def route(self, method: str, path: str) -> Any:
        server, path = self.json_server, path.rstrip("/")
        routes = {"/tools": ("GET", lambda: [t.schema() for t in server.tools.values()]),
                  "/call": ("POST", lambda: server.handle_call(self.read_json())),
                  "/close_session": ("POST", lambda: server.handle_close(self.read_json()))}
        if path not in routes:
            raise self._not_found()
        allowed, handler = routes[path]
        if method != allowed:
            raise HTTPError(405, "bad_request", message=f"{method} is not allowed on {path}; use {allowed}")
        return handler()

    def content_length(self) -> int:
        if self.command == "POST" and "Content-Length" not in self.headers and "Transfer-Encoding" not in self.headers:
            self.close_connection = True
            raise HTTPError(411, "bad_request", message="send a Content-Length header with the JSON body")
        return super().content_length()

    def bad_request(self, status: int, message: str) -> HTTPError:
        return HTTPError(status, "bad_request", message=message)

    def too_large(self, length: int) -> HTTPError:
        return HTTPError(413, "bad_request", message=f"the body has {length} bytes; the limit is {MAX_BODY_BYTES}")

    def internal_error(self, e: Exception) -> HTTPError:
        return HTTPError(500, "internal", message=f"the tool server failed: {type(e).__name__}: {e}")

    def unauthorized(self) -> HTTPError:
        return HTTPError(401, "unauthorized", message=super().unauthorized().error)

    def send_json(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.json_server._count(status)
        super().send_json(status, data, headers)

    def _not_found(self) -> HTTPError:
        return HTTPError(404, "not_found",
                         message=f"no route {self.command} {self.path}; use GET /tools, POST /call or POST /close_session")


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

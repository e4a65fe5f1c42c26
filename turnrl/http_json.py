"""A small base for turnrl's JSON-over-HTTP servers (``EnvServer``, ``ToolServer``, ``PolicyServer``).

``JSONServer`` holds the lifecycle: a ``ThreadingHTTPServer`` (a daemon thread per
connection) serving in a background thread next to any worker threads a server asks for,
``start()``/``stop()``, use as a context manager, and ``url``. ``stop()`` also ends the
keep-alive connections still open, as a dead server would, so clients see it at once.

``JSONHandler`` holds the request side: HTTP/1.1 keep-alive, each request sent to
``route(method, path)``, whose return value is the 200 JSON reply; an ``HTTPError`` it
raises becomes an error reply with that status, any other exception a 500, and every reply
is JSON with a Content-Length. ``read_body()`` is the request body (at most
``max_body_bytes``, 413 beyond); ``read_json()`` that body decoded by ``parse_json``.
Subclasses choose the error bodies (``error_body``, ``bad_request``, ``internal_error``,
``too_large``, ``unauthorized``) and the logger.

What every server answers, whatever its routes:

* ``GET /health`` -> ``{"status": "ok"}`` (a liveness probe, open without a token).
* A request must arrive whole (request line, headers and body) within ``read_timeout_s``
  (default 30 s) of the moment its connection was ready for it (accepted, or the previous
  reply sent); else the connection is closed. So an idle keep-alive connection, a body
  shorter than its ``Content-Length`` or one trickled in byte by byte holds no thread for
  longer than that. A slow body gets 408 where the connection still can carry it.
* Malformed input is a 4xx, never a 5xx, and the server keeps serving: a ``Content-Length``
  that is not one non-negative integer -> 400, a ``Transfer-Encoding`` (chunked bodies) -> 411,
  a body cut short -> 400, a body over ``max_body_bytes`` -> 413; for ``read_json`` a body
  that is not UTF-8 JSON, nests deeper than ``max_json_depth`` levels or holds an integer of
  more than 4300 digits (Python's ``int`` conversion limit) -> 400; a method no endpoint
  takes (PUT, PATCH, OPTIONS, HEAD, any other) -> 405; a malformed request line or header ->
  400 (http.server's own checks).

Bearer tokens, checked here for every server. A server started with a ``token`` answers
every request, except ``GET /health`` (``open_paths``: a liveness probe that reveals
nothing), with 401, ``WWW-Authenticate: Bearer`` and a JSON error body unless it carries
``Authorization: Bearer <token>`` (compared in constant time). Bound to an address other
than loopback (127.0.0.0/8, ::1, ``localhost``) a server refuses to start without one:
anyone who can connect could otherwise run episodes and code on it. The token never comes
from the command line or a config file: the command lines read it from the environment
variable ``--token-env`` names (default ``TURNRL_SERVER_TOKEN``), and the clients
(``RemoteEnv``, the ``remote`` tool executor) from the variable their ``token_env`` names.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["DEFAULT_READ_TIMEOUT_S", "DEFAULT_TOKEN_ENV", "HTTPError", "JSONHandler", "JSONServer", "MAX_JSON_DEPTH",
           "TokenRefusedError", "auth_headers", "check_token", "is_loopback", "parse_json", "refused_message",
           "require_token", "server_token", "token_from_env"]

DEFAULT_TOKEN_ENV = "TURNRL_SERVER_TOKEN"
"""The environment variable servers and clients read the bearer token from unless told another."""
_NEW_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
DEFAULT_READ_TIMEOUT_S = 30.0
"""Seconds a connection may take to deliver its next whole request (``JSONServer.read_timeout_s``)."""
MAX_JSON_DEPTH = 64
"""How deeply a request body's arrays and objects may nest (``parse_json``)."""
_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")
_TOO_MANY_DIGITS = "integer string conversion"
"""In the ValueError of Python's ``int`` for a number of more than ``sys.get_int_max_str_digits()`` digits."""


class TokenRefusedError(RuntimeError):
    """A server answered 401 to this client's bearer token (or to its lack of one).

    Every further request would be refused alike, so callers that otherwise tolerate a
    failing episode (the rollout collector) re-raise it: the run stops with this message.
    """


def is_loopback(host: str) -> bool:
    """True when binding ``host`` serves this machine only: ``localhost``, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # another host name: it may resolve to anything
        return False


def check_token(token: str, source: str = "the token") -> str:
    """``token``, checked to be usable in an ``Authorization: Bearer`` header.

    Args:
        token: The secret.
        source: Where it came from, for the message (e.g. ``"the variable TURNRL_SERVER_TOKEN"``);
            the message never shows the token itself.

    Raises:
        ValueError: If it is empty, or holds whitespace or characters other than printable ASCII.
    """
    if not isinstance(token, str) or not token:
        raise ValueError(f"{source} is empty; make a token with `{_NEW_TOKEN}`")
    if not all("!" <= c <= "~" for c in token):
        raise ValueError(f"{source} holds whitespace or characters other than printable ASCII, which an HTTP "
                         f"header cannot carry (a trailing newline?); make a token with `{_NEW_TOKEN}`")
    return token


def token_from_env(var: str | None) -> str | None:
    """The token held in the environment variable ``var`` (None when ``var`` is None, unset or empty).

    Raises:
        ValueError: If the variable holds something ``check_token`` refuses.
    """
    value = os.environ.get(var, "") if var else ""
    return check_token(value, f"the environment variable {var}") if value else None


def auth_headers(var: str | None) -> dict[str, str]:
    """``{"Authorization": "Bearer <token>"}`` with the token held in ``var``; ``{}`` when it holds none."""
    token = token_from_env(var)
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def refused_message(url: str, var: str | None, sent: bool) -> str:
    """What a client says when the server at ``url`` answered 401.

    Args:
        url: The server.
        var: The variable the client's token came from (None: the client reads none).
        sent: Whether a token was sent.
    """
    if not var:
        return (f"the server at {url} wants a token and none was sent: name the environment variable that holds "
                f"it (token_env, e.g. {DEFAULT_TOKEN_ENV})")
    unset = "" if sent else f" ({var} was unset or empty, so no token was sent)"
    return f"the server at {url} refused the token: set {var} to its token{unset}"


def require_token(host: str, token: str | None, token_env: str = DEFAULT_TOKEN_ENV) -> None:
    """Refuse to serve on a non-loopback ``host`` without a token.

    Raises:
        ValueError: If ``host`` is not loopback and ``token`` is None, saying how to set one.
    """
    if token is None and not is_loopback(host):
        raise ValueError(
            f"refusing to serve on {host!r} without a token: other machines can reach that address, and anyone "
            f"who connects could run episodes and code here. Put a secret in the environment variable {token_env} "
            f"(e.g. `export {token_env}=$({_NEW_TOKEN})`; --token-env VAR names another variable; in Python pass "
            "token=..., or api_key=... to PolicyServer) and give the clients the same variable, or bind 127.0.0.1 "
            "to serve this machine only")


def server_token(token_env: str | None, host: str) -> str | None:
    """The token of a server started from the command line on ``host`` (``--token-env``).

    Args:
        token_env: The variable named on the command line; None: ``DEFAULT_TOKEN_ENV``, whose
            token is used when it holds one.
        host: The interface to bind.

    Raises:
        ValueError: If ``token_env`` names an unset or empty variable, the variable holds a
            malformed token, or ``host`` is not loopback and there is no token.
    """
    var = token_env or DEFAULT_TOKEN_ENV
    token = token_from_env(var)
    if token is None and token_env is not None:
        raise ValueError(f"the environment variable {var} (named by --token-env) is unset or empty; "
                         f"set it to the token clients will send, e.g. `export {var}=$({_NEW_TOKEN})`")
    require_token(host, token, var)
    return token


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value ``raw`` holds, checked to be safe to walk.

    Raises:
        ValueError: If ``raw`` is not UTF-8 JSON, nests arrays and objects deeper than
            ``max_depth`` levels, or holds an integer of more digits than Python converts
            (4300 by default); the message says which.
    """
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(f"the JSON nests deeper than {max_depth} levels of arrays and objects") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, or an integer too long to convert
        if _TOO_MANY_DIGITS in str(e):
            raise ValueError(f"the JSON holds an integer of more than {sys.get_int_max_str_digits()} digits; send "
                             "numbers of an ordinary size") from None
        raise ValueError(f"the body is not valid UTF-8 JSON ({e})") from None
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:  # only arrays and objects are pushed
        item, depth = stack.pop()
        if depth > max_depth:
            raise ValueError(f"the JSON nests deeper than {max_depth} levels of arrays and objects")
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return value


class HTTPError(Exception):
    """A request failure: the status, a message telling the client what to fix, and extra
    fields of the reply (by default the reply is ``{"error": error, **extra}``)."""

    def __init__(self, status: int, error: str, /, **extra: Any) -> None:
        super().__init__(error)
        self.status, self.error, self.extra = status, error, extra


class _HTTPServer(ThreadingHTTPServer):
    """A thread per connection (daemon threads: a slow request never blocks ``stop``)."""

    daemon_threads = True
    request_queue_size = socket.SOMAXCONN  # the listen backlog: a burst of clients connects at once

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that broke (client gone, ``stop``) is not an error worth a traceback."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class JSONServer:
    """Serve ``handler`` requests on ``host:port`` in background threads.

    Subclasses call ``super().__init__`` and may override ``_background`` (more threads to
    run while serving) and ``_on_stop`` (wake those threads so ``stop`` can join them).
    ``_stopping`` is set from the start of ``stop()`` until the next ``start()``.

    Args:
        host: Interface to bind (``127.0.0.1``: this machine only; ``0.0.0.0``: all).
        port: TCP port; 0 picks a free one (``port`` and ``url`` hold the bound one once started).
        handler: The ``JSONHandler`` subclass serving each connection.
        name: Prefix of the serving thread's name (``NAME-PORT``).
        token: When set, requests must send ``Authorization: Bearer <token>`` (else 401);
            required unless ``host`` is loopback.
        read_timeout_s: Seconds a connection may take to deliver its next whole request,
            counted from when it was accepted or its previous reply was sent; then it is closed.

    Raises:
        ValueError: If ``host`` is not loopback and there is no token, the token is not
            printable ASCII without whitespace, or ``read_timeout_s`` is not a positive number.
    """

    poll_interval_s = 0.1
    """How often the serving thread checks for ``stop()``."""

    def __init__(self, host: str, port: int, handler: type[JSONHandler], name: str, *,
                 token: str | None = None, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S) -> None:
        if token is not None:
            check_token(token)
        require_token(host, token)
        if isinstance(read_timeout_s, bool) or not isinstance(read_timeout_s, (int, float)) or not read_timeout_s > 0:
            raise ValueError(f"read_timeout_s must be a positive number of seconds, got {read_timeout_s!r}")
        self.host, self.port = host, port
        self.read_timeout_s = float(read_timeout_s)
        self._token = token
        self._handler, self._name = handler, name
        self._httpd: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._connections: dict[socket.socket, float | None] = {}
        """Open connection -> since when it waits for its next request (None: one is being served)."""
        self._connections_lock = threading.Lock()

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (the bound port once started)."""
        return f"http://{self.host}:{self.port}"

    @property
    def requires_token(self) -> bool:
        """True when requests must carry the bearer token."""
        return self._token is not None

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header value admits a request (constant-time comparison)."""
        if self._token is None:
            return True
        scheme, _, given = (header or "").partition(" ")
        ok = hmac.compare_digest(given.strip().encode("latin-1", "replace"), self._token.encode())
        return ok and scheme.lower() == "bearer"

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._httpd is not None

    def start(self) -> Self:
        """Bind and serve in background threads; returns self.

        Raises:
            RuntimeError: If already started.
            OSError: If the address cannot be bound (e.g. the port is taken).
        """
        if self._httpd is not None:
            raise RuntimeError("the server is already started; stop() it first")
        httpd = _HTTPServer((self.host, self.port), self._handler)
        httpd.json_server = self  # type: ignore[attr-defined]  # read by JSONHandler.setup
        self._httpd, self.port = httpd, httpd.server_address[1]
        self._stopping.clear()
        loops = [(self._name, lambda: httpd.serve_forever(poll_interval=self.poll_interval_s)),
                 (f"{self._name}-reader-timeout", self._drop_late_connections), *self._background()]
        self._threads = [threading.Thread(target=target, name=f"{name}-{self.port}", daemon=True)
                         for name, target in loops]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """Stop serving: close the port and every open connection (requests in flight get a
        closed connection), then join the threads. Idempotent."""
        httpd = self._httpd
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        with self._connections_lock:  # keep-alive connections outlive shutdown(): end them
            connections, self._connections = list(self._connections), {}
        for sock in connections:
            _shut(sock)
        self._on_stop()
        for t in self._threads:
            t.join(timeout=5)
        self._httpd, self._threads = None, []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _background(self) -> list[tuple[str, Callable[[], None]]]:
        """``(thread name prefix, target)`` of the threads to run besides the serving one; none here."""
        return []

    def _on_stop(self) -> None:
        """Called by ``stop()`` once the port is closed, before joining the threads."""

    def _track(self, sock: socket.socket, open_: bool) -> None:
        with self._connections_lock:
            if open_:
                self._connections[sock] = time.monotonic()
            else:
                self._connections.pop(sock, None)

    def _waiting(self, sock: socket.socket, since: float | None) -> None:
        """Mark ``sock`` as waiting for its next request since ``since`` (None: serving one)."""
        with self._connections_lock:
            if sock in self._connections:
                self._connections[sock] = since

    def _drop_late_connections(self) -> None:
        """Close every connection whose next request has not arrived whole within ``read_timeout_s``
        (its blocked read then ends), until ``stop()``."""
        interval = min(1.0, self.read_timeout_s / 4)
        while not self._stopping.wait(interval):
            oldest = time.monotonic() - self.read_timeout_s
            with self._connections_lock:
                late = [sock for sock, since in self._connections.items() if since is not None and since < oldest]
            for sock in late:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    """End a connection from outside its handler (a read blocked on it returns at once)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by its handler


class JSONHandler(BaseHTTPRequestHandler):
    """One connection of a ``JSONServer``: every request goes to ``route``; every reply is JSON.

    Subclasses implement ``route`` and may set ``max_body_bytes``, ``drain_bytes``,
    ``max_json_depth``, ``open_paths`` and ``logger`` and override ``error_body``,
    ``bad_request``, ``internal_error``, ``too_large``, ``unauthorized``, ``content_length``
    and ``send_json``. ``json_server`` is the server being served. The body is read before
    ``route`` is called (``read_body`` returns it); ``GET /health`` never reaches ``route``;
    when the server has a token, a request without it never does either.
    """

    protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connection
    wbufsize = 1 << 16  # headers and body leave in one write (flushed after each request) ...
    disable_nagle_algorithm = True  # ... at once: no 40 ms Nagle / delayed-ACK stall per reply
    max_body_bytes = 1 << 20
    """Largest request body accepted; 413 beyond."""
    drain_bytes = 0
    """A too large body up to this size is read and dropped, so the client can finish sending,
    read the 413 and reuse the connection; a larger one closes the connection."""
    max_json_depth = MAX_JSON_DEPTH
    """How deeply ``read_json`` lets arrays and objects nest (400 beyond)."""
    open_paths: frozenset[str] = frozenset({"/health"})
    """Paths a GET may reach without the token (liveness probes)."""
    logger: logging.Logger | None = None
    """Where requests (debug), 5xx replies (warning) and server bugs go; None: nowhere."""
    json_server: JSONServer
    _body: bytes | None = None

    def setup(self) -> None:
        self.json_server = self.server.json_server  # type: ignore[attr-defined]
        self.timeout = self.json_server.read_timeout_s  # bounds each socket read and write (StreamRequestHandler)
        super().setup()
        self.json_server._track(self.connection, open_=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.json_server._track(self.connection, open_=False)

    def handle_one_request(self) -> None:
        self.json_server._waiting(self.connection, time.monotonic())  # the next request's time starts now
        self._body = None
        try:
            super().handle_one_request()
        except OSError:  # the client, stop() or the read timeout closed the connection
            self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def do_PUT(self) -> None:  # noqa: N802  (routes answer 405 for the methods they do not take)
        self._dispatch("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def do_OPTIONS(self) -> None:  # noqa: N802
        self._dispatch("OPTIONS")

    def do_HEAD(self) -> None:  # noqa: N802  (the reply has headers only: send_json)
        self._dispatch("HEAD")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        if self.logger is not None:
            self.logger.debug("%s %s", self.address_string(), format % args)

    # -------------------------------------------------------------- to override
    def route(self, method: str, path: str) -> Any:
        """The 200 reply to ``method path`` (``path`` without its query); raise ``HTTPError`` to refuse."""
        raise HTTPError(HTTPStatus.NOT_FOUND, f"no endpoint {path!r}")

    def error_body(self, error: HTTPError) -> Any:
        """The reply carrying ``error``."""
        return {"error": error.error, **error.extra}

    def bad_request(self, status: int, message: str) -> HTTPError:
        """The 4xx for a request this base refuses (malformed, too slow, a method no route takes)."""
        return HTTPError(status, message)

    def internal_error(self, e: Exception) -> HTTPError:
        """The 500 for an unexpected exception (a bug in the server; it keeps serving)."""
        return HTTPError(HTTPStatus.INTERNAL_SERVER_ERROR, f"the server failed: {type(e).__name__}: {e}")

    def too_large(self, length: int) -> HTTPError:
        """The 413 for a body of ``length`` bytes."""
        return HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         f"the body has {length} bytes; at most {self.max_body_bytes} are accepted")

    def unauthorized(self) -> HTTPError:
        """The 401 for a request without the right token (the reply adds ``WWW-Authenticate: Bearer``)."""
        return HTTPError(HTTPStatus.UNAUTHORIZED,
                         "missing or wrong token: send 'Authorization: Bearer <token>' with the token the server was "
                         f"started with (the variable its --token-env names, {DEFAULT_TOKEN_ENV} by default)")

    def content_length(self) -> int:
        """The request's Content-Length (none: 0).

        Raises:
            HTTPError: ``bad_request`` 411 for a ``Transfer-Encoding`` (chunked bodies are not
                read), 400 unless the header is one non-negative integer; both close the
                connection, whose next request could not be found.
        """
        if self.headers.get("Transfer-Encoding") is not None:
            self.close_connection = True
            raise self.bad_request(HTTPStatus.LENGTH_REQUIRED, "bodies with a Transfer-Encoding (chunked) are not "
                                                               "accepted; send the body with a Content-Length")
        values = {v.strip() for v in self.headers.get_all("Content-Length") or []}
        if not values:
            return 0
        if len(values) > 1 or not _CONTENT_LENGTH.fullmatch(next(iter(values))):
            self.close_connection = True
            raise self.bad_request(HTTPStatus.BAD_REQUEST, f"Content-Length must be one non-negative integer (the "
                                                           f"body's size in bytes), got {sorted(values)}")
        return int(next(iter(values)))

    def send_json(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        """Send ``data`` (JSON) with ``status`` and extra ``headers`` (for HEAD, the headers only)."""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line or header, an unknown method), as
        JSON; an unknown method is 405 and an unknown HTTP version 400, not 501 / 505."""
        if code == HTTPStatus.NOT_IMPLEMENTED:
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"the method {self.command!r} is not supported"
        elif code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED:
            code, message = HTTPStatus.BAD_REQUEST, f"{message or 'this HTTP version is not supported'}; send HTTP/1.1"
        self.close_connection = True
        self.request_version = self.protocol_version  # a status line even when the request line was unreadable
        error = self.bad_request(code, message or explain or HTTPStatus(code).phrase)
        self.send_json(code, json.dumps(self.error_body(error)).encode())

    # -------------------------------------------------------------- the machinery
    def read_body(self) -> bytes:
        """The request body (read before ``route`` is called)."""
        if self._body is None:
            self._body = self._read_request_body()
        return self._body

    def read_json(self) -> Any:
        """The request body as JSON (``parse_json``; an empty body is None).

        Raises:
            HTTPError: ``bad_request`` 400 saying what is wrong with it.
        """
        raw = self.read_body()
        if not raw.strip():
            return None
        try:
            return parse_json(raw, self.max_json_depth)
        except ValueError as e:
            raise self.bad_request(HTTPStatus.BAD_REQUEST, str(e)) from None

    def _read_request_body(self) -> bytes:
        """Read the body whole (so the connection stays usable when the request fails).

        Raises:
            HTTPError: ``too_large`` beyond ``max_body_bytes``; ``bad_request`` 408 when it does
                not arrive in time, 400 when the connection ends before it does.
        """
        length = self.content_length()
        if length > self.max_body_bytes:
            self._drop_body(length)
            raise self.too_large(length)
        if length == 0:
            return b""
        try:
            data = self.rfile.read(length)
        except OSError:  # the socket's read timeout
            self.close_connection = True
            raise self.bad_request(HTTPStatus.REQUEST_TIMEOUT, f"the body did not arrive within "
                                                               f"{self.json_server.read_timeout_s:g} s") from None
        if len(data) < length:  # the client, or the server's read timeout, ended the connection
            self.close_connection = True
            raise self.bad_request(HTTPStatus.BAD_REQUEST, f"the body ended after {len(data)} of the {length} bytes "
                                                           "its Content-Length announced")
        return data

    def _drop_body(self, length: int | None) -> None:
        """Read and drop a body of ``length`` bytes up to ``max(max_body_bytes, drain_bytes)``;
        a larger one, or one of unknown length (None), stays unread and the connection closes."""
        if length is None or length > max(self.max_body_bytes, self.drain_bytes):
            self.close_connection = True  # the body stays unread: the connection cannot be reused
            return
        try:
            for start in range(0, length, 1 << 16):
                if not self.rfile.read(min(1 << 16, length - start)):
                    raise ConnectionError("the body ended early")
        except OSError:  # cut short or too slow: the connection cannot be reused
            self.close_connection = True

    def _authenticate(self, method: str, path: str) -> None:
        """Raise ``unauthorized()`` unless the request may pass (its body is dropped first, so
        the connection stays usable; a body too large or of unknown length closes it)."""
        if (method == "GET" and path in self.open_paths) or self.json_server.authorized(
                self.headers.get("Authorization")):
            return
        try:
            length: int | None = self.content_length()
        except HTTPError:
            length = None
        self._drop_body(length)
        raise self.unauthorized()

    def _dispatch(self, method: str) -> None:
        path, headers = self.path.split("?", 1)[0], None
        try:
            self._authenticate(method, path)
            self.read_body()
            self.json_server._waiting(self.connection, None)  # the request is in: the route may take its time
            reply = self._health(method) if path == "/health" else self.route(method, path)
            status, data = HTTPStatus.OK, json.dumps(reply).encode()
        except HTTPError as e:
            if e.status == HTTPStatus.UNAUTHORIZED:
                headers = {"WWW-Authenticate": "Bearer"}
            status, data = e.status, json.dumps(self.error_body(e)).encode()
            if status >= 500 and self.logger is not None:
                self.logger.warning("%s %s -> %d: %s", method, self.path, status, e.error)
        except Exception as e:
            error = _input_refused(e)  # input Python itself refuses to take, wherever a route met it
            if error is not None:
                error = self.bad_request(HTTPStatus.BAD_REQUEST, error)
            else:  # a bug in the server itself: report it, keep serving
                if self.logger is not None:
                    self.logger.exception("request %s %s failed", method, self.path)
                error = self.internal_error(e)
            status, data = error.status, json.dumps(self.error_body(error)).encode()
        self.send_json(int(status), data, headers)


    def _health(self, method: str) -> dict:
        if method != "GET":
            raise self.bad_request(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not allowed on /health; use GET")
        return {"status": "ok"}


def _input_refused(e: Exception) -> str | None:
    """What was wrong with the request when ``e`` is Python refusing its input: data nested
    deeper than the recursion limit, or an integer longer than ``int`` converts; else None."""
    if isinstance(e, RecursionError):
        return "the request nests data too deeply; send flatter JSON"
    if isinstance(e, ValueError) and _TOO_MANY_DIGITS in str(e):
        return (f"the request holds an integer of more than {sys.get_int_max_str_digits()} digits; send numbers "
                "of an ordinary size")
    return None

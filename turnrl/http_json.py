"""A small base for turnrl's JSON-over-HTTP servers (``EnvServer``, ``ToolServer``, ``PolicyServer``).

``JSONServer`` holds the lifecycle: a ``ThreadingHTTPServer`` (a daemon thread per
connection) serving in a background thread next to any worker threads a server asks for,
``start()``/``stop()``, use as a context manager, and ``url``. ``stop()`` also ends the
keep-alive connections still open, as a dead server would, so clients see it at once.

``JSONHandler`` holds the request side: HTTP/1.1 keep-alive, each request sent to
``route(method, path)``, whose return value is the 200 JSON reply; an ``HTTPError`` it
raises becomes an error reply with that status, any other exception a 500, and every reply
is JSON with a Content-Length. ``read_body()`` reads a body within ``max_body_bytes``
(413 beyond). Subclasses choose the error bodies (``error_body``, ``internal_error``,
``too_large``, ``unauthorized``) and the logger.

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
import socket
import sys
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["DEFAULT_TOKEN_ENV", "HTTPError", "JSONHandler", "JSONServer", "TokenRefusedError", "auth_headers",
           "check_token", "is_loopback", "refused_message", "require_token", "server_token",
           "token_from_env"]

DEFAULT_TOKEN_ENV = "TURNRL_SERVER_TOKEN"
"""The environment variable servers and clients read the bearer token from unless told another."""
_NEW_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


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


class HTTPError(Exception):
    """A request failure: the status, a message telling the client what to fix, and extra
    fields of the reply (by default the reply is ``{"error": error, **extra}``)."""

    def __init__(self, status: int, error: str, /, **extra: Any) -> None:
        super().__init__(error)
        self.status, self.error, self.extra = status, error, extra


class _HTTPServer(ThreadingHTTPServer):
    """A thread per connection (daemon threads: a slow request never blocks ``stop``)."""

    daemon_threads = True

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

    Raises:
        ValueError: If ``host`` is not loopback and there is no token, or the token is not
            printable ASCII without whitespace.
    """

    poll_interval_s = 0.1
    """How often the serving thread checks for ``stop()``."""

    def __init__(self, host: str, port: int, handler: type[JSONHandler], name: str, *,
                 token: str | None = None) -> None:
        if token is not None:
            check_token(token)
        require_token(host, token)
        self.host, self.port = host, port
        self._token = token
        self._handler, self._name = handler, name
        self._httpd: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
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
                 *self._background()]
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
            connections, self._connections = list(self._connections), set()
        for sock in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its handler
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
                self._connections.add(sock)
            else:
                self._connections.discard(sock)


class JSONHandler(BaseHTTPRequestHandler):
    """One connection of a ``JSONServer``: GET and POST go to ``route``; every reply is JSON.

    Subclasses implement ``route`` and may set ``max_body_bytes``, ``drain_bytes``,
    ``open_paths`` and ``logger`` and override ``error_body``, ``internal_error``,
    ``too_large``, ``unauthorized``, ``content_length`` and ``send_json``. ``json_server`` is
    the server being served. When it has a token, a request without it never reaches ``route``.
    """

    protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connection
    wbufsize = 1 << 16  # headers and body leave in one write (flushed after each request) ...
    disable_nagle_algorithm = True  # ... at once: no 40 ms Nagle / delayed-ACK stall per reply
    max_body_bytes = 1 << 20
    """Largest request body accepted; ``read_body`` answers 413 beyond."""
    drain_bytes = 0
    """A too large body up to this size is read and dropped, so the client can finish sending,
    read the 413 and reuse the connection; a larger one closes the connection."""
    open_paths: frozenset[str] = frozenset({"/health"})
    """Paths a GET may reach without the token (liveness probes)."""
    logger: logging.Logger | None = None
    """Where requests (debug), 5xx replies (warning) and server bugs go; None: nowhere."""
    json_server: JSONServer

    def setup(self) -> None:
        super().setup()
        self.json_server = self.server.json_server  # type: ignore[attr-defined]
        self.json_server._track(self.connection, open_=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.json_server._track(self.connection, open_=False)

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except OSError:  # the client (or stop()) closed the connection
            self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

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
        """The request's Content-Length (none: 0)."""
        return int(self.headers.get("Content-Length") or 0)

    def send_json(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        """Send ``data`` (JSON) with ``status`` and extra ``headers``."""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    # -------------------------------------------------------------- the machinery
    def read_body(self) -> bytes:
        """The request body (read even when the request will fail, so the connection stays usable).

        Raises:
            HTTPError: ``too_large`` when it has more than ``max_body_bytes``.
        """
        length = self.content_length()
        if length > self.max_body_bytes:
            self._drop_body(length)
            raise self.too_large(length)
        return self.rfile.read(length) if length > 0 else b""

    def _drop_body(self, length: int | None) -> None:
        """Read and drop a body of ``length`` bytes up to ``max(max_body_bytes, drain_bytes)``;
        a larger one, or one of unknown length (None), stays unread and the connection closes."""
        if length is None or length > max(self.max_body_bytes, self.drain_bytes):
            self.close_connection = True  # the body stays unread: the connection cannot be reused
            return
        for start in range(0, length, 1 << 16):
            self.rfile.read(min(1 << 16, length - start))

    def _authenticate(self, method: str, path: str) -> None:
        """Raise ``unauthorized()`` unless the request may pass (its body is dropped first, so
        the connection stays usable; a body too large or of unknown length closes it)."""
        if (method == "GET" and path in self.open_paths) or self.json_server.authorized(
                self.headers.get("Authorization")):
            return
        length = self.headers.get("Content-Length", "0")
        self._drop_body(int(length) if length.isdigit() else None)
        raise self.unauthorized()

    def _dispatch(self, method: str) -> None:
        path, headers = self.path.split("?", 1)[0], None
        try:
            self._authenticate(method, path)
            status, data = HTTPStatus.OK, json.dumps(self.route(method, path)).encode()
        except HTTPError as e:
            if e.status == HTTPStatus.UNAUTHORIZED:
                headers = {"WWW-Authenticate": "Bearer"}
            status, data = e.status, json.dumps(self.error_body(e)).encode()
            if status >= 500 and self.logger is not None:
                self.logger.warning("%s %s -> %d: %s", method, self.path, status, e.error)
        except Exception as e:  # a bug in the server itself: report it, keep serving
            if self.logger is not None:
                self.logger.exception("request %s %s failed", method, self.path)
            error = self.internal_error(e)
            status, data = error.status, json.dumps(self.error_body(error)).encode()
        self.send_json(int(status), data, headers)

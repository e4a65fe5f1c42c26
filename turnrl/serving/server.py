"""``HTTPService``: run a server's FastAPI app under uvicorn in background threads.

The lifecycle every turnrl server shares: ``start()`` binds (port 0 picks a free one) and
serves on an event loop of its own thread, next to any worker threads the server asks for;
``stop()`` closes the port and every open connection (requests in flight get a closed
connection, as a dead server would give them) and joins the threads; use it as a context
manager; ``url`` is ``http://HOST:PORT``.

Blocking work (an env step, a sandboxed tool call) runs in a pool of ``max_threads`` worker
threads (``await self.blocking(fn, *args)`` in an ``async def`` route; a plain ``def`` route
runs in anyio's pool of the same size), so it never stalls the event loop; calls beyond that
wait for a thread.

Slow clients (``DeadlineProtocol``, uvicorn's httptools protocol with one more timer): a request must
arrive whole (request line, headers and body) within ``read_timeout_s`` of the moment its
connection was ready for it (accepted, or the previous reply sent); else the connection is
closed. So an idle keep-alive connection, a body shorter than its ``Content-Length`` or one
trickled in byte by byte holds nothing for longer than that. A request that has arrived
takes as long as its route needs. At most ``max_connections`` connections are open at once: a
new one beyond them is answered 503 in the error format and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self

import anyio.to_thread
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from turnrl.serving.errors import error_body
from turnrl.serving.tokens import check_token, require_token

__all__ = ["DEFAULT_MAX_CONNECTIONS", "DEFAULT_READ_TIMEOUT_S", "DeadlineProtocol", "HTTPService"]

DEFAULT_READ_TIMEOUT_S = 30.0
"""Seconds a connection may take to deliver its next whole request (``HTTPService.read_timeout_s``)."""
DEFAULT_MAX_CONNECTIONS = 4096
"""Connections a server holds open at once; one more is answered 503 and closed."""


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a deadline for each whole request, a connection cap
    and protocol errors in the servers' error format.

    The deadline (``config.timeout_keep_alive`` seconds, which ``HTTPService`` sets to its
    ``read_timeout_s``) starts when the connection is made and again when a reply is sent;
    when it passes before the next request is whole, the connection is closed (a route at work
    is never cut). A connection beyond ``max_connections`` gets 503 and is closed. A request
    the parser cannot read (a malformed request line, header or ``Content-Length``) gets 400;
    both replies are JSON in the servers' error format.
    """

    max_connections: int | None = None
    """Connections open at once beyond which a new one gets 503 and is closed (None: no cap)."""
    _deadline: asyncio.TimerHandle | None = None
    _whole = False
    """Whether the request being served has arrived whole (set by the parser's callbacks)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            self._refuse(503, f"the server holds {self.max_connections} connections, its most (--max-connections); "
                              "close idle connections or retry shortly")
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:  # headers and body leave in two writes: no 40 ms Nagle / delayed-ACK stall
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm()

    def on_message_begin(self) -> None:
        self._whole = False
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self._whole = True
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            # the next request's time starts now (unless a pipelined one already began)
            self._whole = self.cycle is not None and not self.cycle.response_complete and self._whole
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.timeout_keep_alive, self._expire)

    def _expire(self) -> None:
        if not self._whole and not self.transport.is_closing():
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "the request is not HTTP/1.1 this server reads (a malformed request line or header; a "
                          "Content-Length must be one non-negative integer, the body's size in bytes); send HTTP/1.1 "
                          "with a Content-Length")

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` in the servers' error format and close the connection."""
        body = json.dumps(error_body(status, message)).encode()
        phrase = {400: b"Bad Request", 503: b"Service Unavailable"}.get(status, b"Error")
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (status, phrase, len(body), body))
        self.transport.close()


class HTTPService:
    """Serve the app ``build_app()`` returns on ``host:port`` in background threads.

    Subclasses implement ``build_app`` (``turnrl.serving.app.service_app`` plus their routes)
    and may override ``_background`` (more threads to run while serving) and ``_on_stop``
    (wake those threads so ``stop`` can join them). ``_stopping`` is set from the start of
    ``stop()`` until the next ``start()``.

    Args:
        host: Interface to bind (``127.0.0.1``: this machine only; ``0.0.0.0``: all).
        port: TCP port; 0 picks a free one (``port`` and ``url`` hold the bound one once started).
        name: Prefix of the serving thread's name (``NAME-PORT``).
        token: When set, requests must send ``Authorization: Bearer <token>`` (else 401);
            required unless ``host`` is loopback.
        read_timeout_s: Seconds a connection may take to deliver its next whole request,
            counted from when it was accepted or its previous reply was sent; then it is closed.
        max_threads: Threads that run blocking routes at once.
        max_connections: Connections open at once; a new one beyond them gets 503 and is
            closed (None: no cap). Idle ones go after ``read_timeout_s``.

    Raises:
        ValueError: If ``host`` is not loopback and there is no token, the token is not
            printable ASCII without whitespace, or ``read_timeout_s`` is not a positive number.
    """

    def __init__(self, host: str, port: int, name: str, *, token: str | None = None,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, max_threads: int = 256,
                 max_connections: int | None = DEFAULT_MAX_CONNECTIONS) -> None:
        if token is not None:
            check_token(token)
        require_token(host, token)
        if isinstance(read_timeout_s, bool) or not isinstance(read_timeout_s, (int, float)) or not read_timeout_s > 0:
            raise ValueError(f"read_timeout_s must be a positive number of seconds, got {read_timeout_s!r}")
        self.host, self.port, self._name = host, port, name
        self.read_timeout_s = float(read_timeout_s)
        self.max_threads = max_threads
        if max_connections is not None and (isinstance(max_connections, bool) or not isinstance(max_connections, int)
                                            or max_connections < 1):
            raise ValueError(f"max_connections must be a positive int or None, got {max_connections!r}")
        self.max_connections = max_connections
        self._token = token
        self._uvicorn: uvicorn.Server | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._failure: BaseException | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---------------------------------------------------------------- to override
    def build_app(self) -> FastAPI:
        """The application to serve (called by each ``start()``)."""
        raise NotImplementedError

    def _background(self) -> list[tuple[str, Callable[[], None]]]:
        """``(thread name prefix, target)`` of the threads to run besides the serving one; none here."""
        return []

    def _on_stop(self) -> None:
        """Called by ``stop()`` once the port is closed, before joining the threads."""

    async def blocking(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        """``fn(*args)`` run in one of the server's ``max_threads`` worker threads (for a route
        that blocks: an env step, a tool call), awaited on the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    # ---------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (the bound port once started)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def requires_token(self) -> bool:
        """True when requests must carry the bearer token."""
        return self._token is not None

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._uvicorn is not None

    def start(self) -> Self:
        """Bind and serve in background threads; returns self once the server accepts connections.

        Raises:
            RuntimeError: If already started, or the server failed to start.
            OSError: If the address cannot be bound (e.g. the port is taken).
        """
        if self._uvicorn is not None:
            raise RuntimeError("the server is already started; stop() it first")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family, backlog=socket.SOMAXCONN)
        self.port = sock.getsockname()[1]
        protocol = type("DeadlineProtocol", (DeadlineProtocol,), {"max_connections": self.max_connections})
        config = uvicorn.Config(self.build_app(), http=protocol, lifespan="off", log_level="error", server_header=False,
                                access_log=False, timeout_keep_alive=self.read_timeout_s,  # type: ignore[arg-type]
                                timeout_graceful_shutdown=1, ws="none")
        server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # the host's, not ours
        self._uvicorn, self._failure, self._loop = server, None, None
        self._pool = ThreadPoolExecutor(self.max_threads, thread_name_prefix=f"{self._name}-worker")
        self._stopping.clear()
        serving = threading.Thread(target=self._serve, args=(server, sock), name=f"{self._name}-{self.port}",
                                   daemon=True)
        serving.start()
        while not server.started:
            if not serving.is_alive():
                self._uvicorn = None
                self._stopping.set()
                raise RuntimeError(f"the server on {self.url} failed to start: {self._failure!r}")
            time.sleep(0.005)
        self._threads = [serving, *(threading.Thread(target=target, name=f"{name}-{self.port}", daemon=True)
                                    for name, target in self._background())]
        for t in self._threads[1:]:
            t.start()
        return self

    def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            anyio.to_thread.current_default_thread_limiter().total_tokens = self.max_threads
            await server.serve(sockets=[sock])

        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 (reported by start(), or logged)
            self._failure = e
            logging.getLogger(__name__).warning("the server on %s stopped: %r", self.url, e)
        finally:
            sock.close()

    def stop(self) -> None:
        """Stop serving: close the port and every open connection (requests in flight get a
        closed connection), then join the threads. Idempotent."""
        server = self._uvicorn
        if server is None:
            return
        self._stopping.set()
        server.should_exit = True
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(_abort_connections, server)
        self._on_stop()
        for t in self._threads:
            t.join(timeout=5)
        if self._pool is not None:  # a call still running keeps its thread; nothing waits for it
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._uvicorn, self._threads = None, []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _abort_connections(server: uvicorn.Server) -> None:
    """End every open connection, idle keep-alive and busy alike (on the server's loop)."""
    for protocol in list(server.server_state.connections):
        transport = getattr(protocol, "transport", None)
        if transport is not None and not transport.is_closing():
            transport.abort()

"""The FastAPI application every turnrl server starts from (``service_app``).

What every server answers, whatever its routes (``Guard``, a pure ASGI middleware in front of
the routes, and the exception handlers here):

* ``GET /health`` -> ``{"status": "ok"}``, open without a token (a liveness probe).
* A bearer token, checked in constant time, on every other request when the server has one:
  401 with ``WWW-Authenticate: Bearer`` without it.
* Framing: more than 100 header fields -> 431; a ``Transfer-Encoding`` (chunked) body ->
  411; a ``Content-Length`` of more than 18 digits -> 400; a body over the server's
  ``max_body_bytes`` -> 413 (the rest of it is dropped, or the connection closes); a
  malformed request line, header or ``Content-Length``, or a method HTTP does not define ->
  400 from the protocol layer (``turnrl.serving.server``), in the same format.
* JSON: a body that is not UTF-8 JSON, nests deeper than 64 levels or holds an integer of
  more than 4300 digits -> 400, before any route sees it; an empty body is ``{}``. A body
  that fails the route's pydantic model -> 400 naming the field (``param``) and the rule.
* 404 for an unknown path (listing the endpoints), 405 for a method a path does not take.
* Any other exception in a route is a 500 with the class and message (logged with its
  traceback); the server keeps serving. Input Python itself refuses (recursion, huge
  integers) is a 400 wherever a route meets it.

Every error reply has the one format of ``turnrl.serving.errors``. Routes return
``JSONReply`` (plain ``json.dumps``; NaN and infinities pass as Python writes them, as the
clients read them) so large replies skip FastAPI's encoder.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from turnrl.serving.errors import APIError, error_body, input_refused, parse_json
from turnrl.serving.tokens import DEFAULT_TOKEN_ENV

__all__ = ["Guard", "JSONReply", "service_app"]

_CONTENT_LENGTH = re.compile(rb"[0-9]{1,18}")
MAX_HEADERS = 100
"""Most header fields a request may carry (431 beyond)."""
_DRAIN_BYTES = 16 << 20
"""A too large body up to this size is read and dropped, so the client can read the 413 and
reuse its connection; a larger one closes the connection unread."""


class JSONReply(JSONResponse):
    """A JSON response written with ``json.dumps`` as it is (no FastAPI encoding pass)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def _error(status: int, message: str, headers: dict[str, str] | None = None, **fields: Any) -> JSONReply:
    return JSONReply(error_body(status, message, **fields), status_code=status, headers=headers)


class Guard:
    """The ASGI middleware in front of every route: token, framing, body size and JSON checks.

    It reads the body whole, checks it with ``parse_json`` and hands the route a body that is
    ``{}`` when the request sent none, with ``Content-Type: application/json`` (so a client
    that sends no content type, as ``curl -d`` does, is read the same).

    Args:
        app: The application behind it.
        token: The bearer token requests must carry (None: none needed).
        max_body_bytes: Largest request body accepted (413 beyond).
        open_paths: Paths a GET reaches without the token.
        title: The server's name, in 500 messages.
        logger: Where server bugs go, with their traceback.
        token_env: The variable servers read their token from, for the 401's message.
    """

    def __init__(self, app: Callable, *, token: str | None, max_body_bytes: int, open_paths: Iterable[str],
                 title: str, logger: logging.Logger, token_env: str = DEFAULT_TOKEN_ENV) -> None:
        self.app, self.token, self.max_body_bytes = app, token, max_body_bytes
        self.open_paths, self.token_env = frozenset(open_paths), token_env
        self.title, self.logger = title, logger

    def authorized(self, header: bytes | None) -> bool:
        """Whether an ``Authorization`` header value admits a request (constant-time comparison)."""
        if self.token is None:
            return True
        scheme, _, given = (header or b"").partition(b" ")
        return hmac.compare_digest(given.strip(), self.token.encode()) and scheme.lower() == b"bearer"

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        method, path = scope["method"], scope["path"]
        if len(headers) > MAX_HEADERS:
            await _error(431, f"the request has {len(headers)} header fields; at most {MAX_HEADERS} are accepted",
                         {"Connection": "close"})(scope, receive, send)
            return
        if scope.get("http_version") not in ("1.0", "1.1"):
            await _error(400, f"HTTP/{scope.get('http_version')} is not served here; send HTTP/1.1",
                         {"Connection": "close"})(scope, receive, send)
            return
        open_path = method == "GET" and path in self.open_paths
        if not open_path and not self.authorized(_header(headers, b"authorization")):
            await _error(401, "missing or wrong token: send 'Authorization: Bearer <token>' with the token the server "
                              f"was started with (the variable its --token-env names, {self.token_env} by default)",
                         {"WWW-Authenticate": "Bearer", **_close_unless_small(headers, self.max_body_bytes)})(
                scope, receive, send)
            return
        if _header(headers, b"transfer-encoding") is not None:
            await _error(411, "bodies with a Transfer-Encoding (chunked) are not accepted; send the body with a "
                              "Content-Length", {"Connection": "close"})(scope, receive, send)
            return
        lengths = {v.strip() for k, v in headers if k == b"content-length"}
        if len(lengths) > 1 or any(not _CONTENT_LENGTH.fullmatch(v) for v in lengths):
            shown = sorted(v.decode("latin-1") for v in lengths)
            await _error(400, f"Content-Length must be one non-negative integer (the body's size in bytes), got "
                              f"{shown}", {"Connection": "close"})(scope, receive, send)
            return
        length = int(next(iter(lengths))) if lengths else 0
        if length > self.max_body_bytes:
            await _error(413, f"the body has {length} bytes; at most {self.max_body_bytes} are accepted",
                         _close_unless_small(headers, _DRAIN_BYTES))(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:  # the client went away mid-body, or sent more than it announced
            await _error(400, "the body did not match its Content-Length", {"Connection": "close"})(
                scope, receive, send)
            return
        if method in ("POST", "PUT", "PATCH") or body.strip():
            if not body.strip():
                body = b"{}"
            try:
                parse_json(body)
            except ValueError as e:
                await _error(400, f"the body of {method} {path} is not JSON this server reads: {e}; send a JSON "
                                  "object")(scope, receive, send)
                return
            kept = [(k, v) for k, v in headers if k not in (b"content-type", b"content-length")]
            scope = {**scope, "headers": [*kept, (b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode())]}
        await self._route(scope, _replay(body, receive), send)

    async def _route(self, scope: dict, receive: Callable, send: Callable) -> None:
        """Run the routes; an exception no handler took is a 400 (input Python refuses) or a
        500 (a bug, logged with its traceback), unless the reply had already begun."""
        started = False

        async def watched(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as e:
            refused = input_refused(e)
            if refused is None:
                self.logger.error("%s %s failed", scope["method"], scope["path"], exc_info=e)
            if started:
                raise
            reply = (_error(400, refused) if refused is not None
                     else _error(500, f"the {self.title} failed: {type(e).__name__}: {e}"))
            await reply(scope, receive, send)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((v for k, v in headers if k == name), None)


def _close_unless_small(headers: list[tuple[bytes, bytes]], limit: int) -> dict[str, str]:
    """``Connection: close`` when the request's unread body is too large (or unknown) to drop."""
    length = _header(headers, b"content-length")
    small = length is None or (_CONTENT_LENGTH.fullmatch(length.strip()) and int(length) <= limit)
    return {} if small else {"Connection": "close"}


async def _read_body(receive: Callable) -> bytes | None:
    """The request body whole; None when the client disconnected before it ended."""
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def _replay(body: bytes, receive: Callable) -> Callable:
    """A ``receive`` that gives ``body`` once, then waits on the real one (for disconnects)."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def service_app(*, title: str, token: str | None, max_body_bytes: int, endpoints: str,
                logger: logging.Logger, open_paths: Iterable[str] = ("/health",),
                token_env: str = DEFAULT_TOKEN_ENV) -> FastAPI:
    """A FastAPI app with ``GET /health``, the one error format and the ``Guard`` in front.

    Args:
        title: The app's name (its OpenAPI title, and the prefix of 500 messages).
        token: The bearer token every request but ``open_paths`` GETs must carry (None: none).
        max_body_bytes: Largest request body accepted.
        endpoints: The endpoints, listed in the 404 for an unknown path.
        logger: Where 5xx replies (warning) and server bugs (with their traceback) go.
        open_paths: Paths a GET reaches without the token.
        token_env: The variable the server read its token from (named in 401 messages).
    """
    app = FastAPI(title=title, docs_url=None, redoc_url=None, default_response_class=JSONReply)
    app.add_middleware(Guard, token=token, max_body_bytes=max_body_bytes, open_paths=open_paths, title=title,
                       logger=logger, token_env=token_env)

    @app.get("/health")
    async def health() -> JSONReply:  # on the event loop: answers while every worker thread is busy
        return JSONReply({"status": "ok"})

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONReply:
        if e.status >= 500:
            logger.warning("%s %s -> %d: %s", request.method, request.url.path, e.status, e.message)
        return JSONReply(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONReply:
        problems = [_problem(error) for error in e.errors()]
        param = problems[0][0] if problems else None
        text = "; ".join(f"{p!r}: {m}" if p else m for p, m in problems[:5])
        route = getattr(request.scope.get("route"), "path", request.url.path)
        return _error(400, f"bad body for {request.method} {route}: {text}", param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONReply:
        if e.status_code == 404:
            message = f"no endpoint {request.url.path!r}; the endpoints are: {endpoints}"
        elif e.status_code == 405:
            allowed = (e.headers or {}).get("Allow", "")
            message = f"{request.method} is not allowed on {request.url.path}; use {allowed}"
        else:
            message = str(e.detail)
        return _error(e.status_code, message, dict(e.headers or {}))

    return app


def _problem(error: dict) -> tuple[str | None, str]:
    """(the field at fault as ``a.b[0]``, what is wrong with it) of a pydantic error."""
    loc = list(error.get("loc", ()))
    where, loc = (loc[0], loc[1:]) if loc and loc[0] in ("body", "path", "query") else ("body", loc)
    value = error.get("input")
    if not loc and where == "body" and error.get("type") in ("model_type", "model_attributes_type", "dict_type"):
        return None, f"the body must be a JSON object, got {_json_type(value)}"
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or None
    shown = error.get("type") != "missing" and value is not None
    got = f" (got {json.dumps(value, default=str)[:80]})" if shown else ""
    return param, f"{error.get('msg', 'invalid')}{got}"


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)

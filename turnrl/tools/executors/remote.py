"""The remote executor: tool calls sent over HTTP to a ``turnrl.tools.serve.ToolServer``.

``remote_tools(url)`` fetches a server's tool list and builds ``Tool`` values that run there
(``executor="remote"``); an env uses them like local tools, with
``executor_options={"remote": {"url": url}}`` (or none: each such tool remembers its server).
``RemoteExecutor`` POSTs each call to ``{url}/call`` with an ``httpx.AsyncClient``, one try
at most ``timeout_s`` seconds, and retries connection errors, timeouts and 5xx answers with
exponential backoff (never 4xx: the same request would be refused again). When every try
failed the result is ``"unavailable"`` (the infrastructure's failure, not the model's: the env
ends the episode with ``ToolUnavailableError``), never an exception.

The server's refusals are ``{"error": {"message", "type", ...}}`` (``turnrl.tools.serve``);
the ``type`` tells the model's mistakes from the setup's: only a 404 of type
``"unknown_tool"`` is the model's unknown tool (an ``"unknown_tool"`` result listing the
server's tools); a 404 of another type (the server has no such endpoint: a wrong URL or path
prefix) is ``"unavailable"``, with a message saying the URL may be wrong.

Tokens: the bearer token is read from the environment variable ``token_env`` names (default
``TURNRL_SERVER_TOKEN``; unset or empty: none is sent) when the executor is made, so env
kwargs and configs hold the variable's name, never the secret. A 401 is no tool failure the
model could act on but a wrong setup that refuses every call alike: it raises
``RemoteToolTokenError`` (a ``turnrl.serving.tokens.TokenRefusedError``, which the rollout
collector lets through to stop the run) saying which variable to set.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args
from urllib.parse import urlsplit

# the token helpers of the light module: turnrl.serving imports FastAPI and uvicorn, which a client does not need
from turnrl.serving.tokens import DEFAULT_TOKEN_ENV, TokenRefusedError, auth_headers, refused_message
from turnrl.tools.execute import ToolError, ToolResult, unavailable_result
from turnrl.tools.executors.base import EXECUTORS, Executor
from turnrl.tools.parsers import ToolCall
from turnrl.tools.tool import Tool

if TYPE_CHECKING:  # httpx is imported on first use: registering the executor stays cheap
    import httpx

__all__ = ["RemoteExecutor", "RemoteFunction", "RemoteToolTokenError", "normalize_url", "remote_tools"]

_ERROR_KINDS = frozenset(kind for kind in get_args(ToolError) if kind is not None)
CLOSE_TIMEOUT_S = 2.0
"""Seconds ``close_session`` waits for the server (it is best effort)."""


def normalize_url(url: str) -> str:
    """``url`` without trailing slashes, checked to be ``http(s)://host[:port][/prefix]``.

    Raises:
        ValueError: If ``url`` is not an http(s) URL with a host.
    """
    if not isinstance(url, str):
        raise ValueError(f"a tool service url must be a string such as 'http://127.0.0.1:8000', got {url!r}")
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"a tool service url must look like 'http://127.0.0.1:8000', got {url!r}")
    return url.rstrip("/")


class RemoteToolTokenError(TokenRefusedError):
    """A tool server refused this client's token (HTTP 401): set the variable ``token_env`` names."""


@dataclass(frozen=True)
class RemoteFunction:
    """The ``fn`` of a tool built by ``remote_tools``: it names where the tool runs and refuses
    to run in-process (the function's code lives on the server)."""

    name: str
    url: str

    @property
    def __name__(self) -> str:  # type: ignore[override]  # like a function's, for messages
        return self.name

    def __call__(self, **arguments: Any) -> Any:
        raise RuntimeError(
            f"tool {self.name!r} runs on the tool service at {self.url} and cannot be called in-process; "
            f"run it through an env (its executor is 'remote') or "
            f"get_executor('remote', url={self.url!r}).arun(tool, call, session)"
        )


def remote_tools(url: str, *, timeout_s: float = 10.0,
                 token_env: str | None = DEFAULT_TOKEN_ENV) -> tuple[Tool, ...]:
    """The tools served at ``url`` (``GET {url}/tools``), as ``Tool`` values with
    ``executor="remote"`` whose schemas are the server's.

    Args:
        url: The server, e.g. ``ToolServer.url`` or ``"http://127.0.0.1:8000"``.
        timeout_s: Seconds to wait for the list.
        token_env: The environment variable holding the server's bearer token (unset, empty
            or None: none is sent). The executor that runs the tools reads its own.

    Returns:
        The tools in the server's order.

    Raises:
        ValueError: If ``url`` is malformed, the variable holds a malformed token, or the
            server's answer is not a list of tool schemas.
        RemoteToolTokenError: If the server refuses the token.
        ConnectionError: If the server does not answer (or answers with another HTTP error).
    """
    import httpx

    base = normalize_url(url)
    headers = auth_headers(token_env)
    try:
        response = httpx.get(f"{base}/tools", timeout=timeout_s, trust_env=False, headers=headers)
        if response.status_code == 401:
            refused = refused_message(base, token_env, bool(headers))
            raise RemoteToolTokenError(f"GET {base}/tools: HTTP 401: {refused}")
        response.raise_for_status()
        payload = response.json()
    except httpx.HTTPStatusError as e:
        raise ConnectionError(f"the tool service at {base} answered GET /tools with HTTP {e.response.status_code}") from None
    except httpx.HTTPError as e:
        raise ConnectionError(
            f"cannot fetch the tool list from {base}/tools ({type(e).__name__}: {e}); is a server running "
            f"there (python -m turnrl.tools.serve module:attr --port PORT)?"
        ) from None
    except ValueError:
        raise ValueError(f"the tool service at {base} answered GET /tools with something that is not JSON") from None
    if not isinstance(payload, list):
        raise ValueError(f"GET {base}/tools must return a JSON list of tool schemas, got {type(payload).__name__}")
    return tuple(_tool_from_schema(schema, base) for schema in payload)


def _tool_from_schema(schema: Any, base: str) -> Tool:
    function = schema.get("function") if isinstance(schema, dict) else None
    if (
        not isinstance(function, dict)
        or not isinstance(function.get("name"), str)
        or not isinstance(function.get("description", ""), str)
        or not isinstance(function.get("parameters"), dict)
    ):
        raise ValueError(
            f"{base}/tools holds {schema!r}, which is not a tool schema "
            '{"type": "function", "function": {"name": str, "description": str, "parameters": object}}'
        )
    name = function["name"]
    return Tool(
        name=name,
        description=function.get("description", ""),
        parameters=function["parameters"],
        fn=RemoteFunction(name, base),
        executor="remote",
    )


@EXECUTORS.register("remote")
class RemoteExecutor(Executor):
    """Runs tool calls on a tool server over HTTP (see the module docstring).

    Each try is one ``POST {url}/call`` of ``{"name", "arguments", "session"}``. Connection
    errors, timeouts and 5xx answers are tried again after ``backoff_s``, ``2 * backoff_s``,
    ``4 * backoff_s``, ... seconds, at most ``retries`` times; a 4xx answer is final. A try that
    timed out may still have run on the server, so a retried call can run twice: serve tools
    whose repeats are harmless, or pass ``retries=0``. When all tries failed the result is
    ``"unavailable"``, with a text saying the tool service did not answer and the last problem;
    so is an answer that is not a result, a 404 that is not an unknown tool (no such endpoint:
    the URL may be wrong), and a tool with no server to go to. A 404 of type ``"unknown_tool"``
    gives an ``"unknown_tool"`` result with the server's list of names; another 4xx answer is
    the call's failure (``"exception"``). A 401 raises ``RemoteToolTokenError`` (see the module
    docstring).
    A call therefore takes at most about
    ``(retries + 1) * timeout_s + backoff_s * (2 ** retries - 1)`` seconds.

    The ``httpx.AsyncClient`` (a keep-alive pool of up to ``max_concurrency`` connections) is
    bound to the event loop it was made on; a call on another loop gets its own client.

    Args:
        url: The server (``ToolServer.url``). None: each tool's own server, which tools from
            ``remote_tools`` carry in their ``fn``.
        timeout_s: Seconds one try may take.
        retries: Tries after the first one (0: no retry).
        backoff_s: Seconds before the first retry; doubled for each next one.
        max_concurrency: Calls in flight at once, over all sessions.
        token_env: The environment variable holding the servers' bearer token, read here
            (unset, empty or None: none is sent).

    Raises:
        ValueError: If ``url`` is malformed, a number is out of range, or the variable holds
            a malformed token.
    """

    kind = "remote"

    def __init__(
        self,
        url: str | None = None,
        *,
        timeout_s: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        max_concurrency: int = 8,
        token_env: str | None = DEFAULT_TOKEN_ENV,
    ) -> None:
        super().__init__(max_concurrency=max_concurrency, timeout_s=timeout_s)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0 (tries after the first), got {retries!r}")
        if isinstance(backoff_s, bool) or not isinstance(backoff_s, (int, float)) or backoff_s < 0:
            raise ValueError(f"backoff_s must be a number of seconds >= 0, got {backoff_s!r}")
        self.url = None if url is None else normalize_url(url)
        self.retries = retries
        self.backoff_s = float(backoff_s)
        self.token_env = token_env
        self._headers = {"Content-Type": "application/json", **auth_headers(token_env)}
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._sessions: dict[str, set[str]] = {}  # session -> server urls its calls went to
        self._lock = threading.Lock()

    def url_for(self, tool: Tool) -> str | None:
        """The server that runs ``tool``: ``self.url``, else the tool's own (``RemoteFunction``)."""
        if self.url is not None:
            return self.url
        return tool.fn.url if isinstance(tool.fn, RemoteFunction) else None

    async def arun(self, tool: Tool, call: ToolCall, session: str) -> ToolResult:
        url = self.url_for(tool)
        if url is None:
            return unavailable_result(call, tool.name, "it has no tool service to run on; give the executor a url "
                                      "(executor_options={'remote': {'url': ...}}) or build the tool with remote_tools(url)")
        with self._lock:
            self._sessions.setdefault(session, set()).add(url)
        import httpx

        try:
            body = json.dumps({"name": call.name, "arguments": call.arguments, "session": session}).encode()
        except (TypeError, ValueError) as e:
            return ToolResult(call, f"Error: the arguments of tool {tool.name!r} are not JSON: {e}", "exception")
        async with self.slot():
            client = self._client()
            problem = ""
            for attempt in range(self.retries + 1):
                if attempt:
                    await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
                try:
                    response = await asyncio.wait_for(
                        client.post(f"{url}/call", content=body, headers=self._headers, timeout=self.timeout_s),
                        self.timeout_s,
                    )
                except (httpx.TimeoutException, asyncio.TimeoutError):
                    problem = f"no answer within {self.timeout_s} s"
                    continue
                except httpx.TransportError as e:
                    problem = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                    continue
                except httpx.HTTPError as e:  # an answer that cannot be read: the same again would not be
                    return unavailable_result(call, tool.name, f"the tool service at {url} sent an answer that "
                                                               f"cannot be read ({type(e).__name__}: {e})")
                if response.status_code == 401:
                    sent = "Authorization" in self._headers
                    raise RemoteToolTokenError(f"tool {tool.name!r}: POST {url}/call: HTTP 401: "
                                               f"{refused_message(url, self.token_env, sent)}")
                if response.status_code >= 500:
                    problem = f"HTTP {response.status_code}: {_server_message(response)}"
                    continue
                return _decode(response, call, url)
        tries = self.retries + 1
        return unavailable_result(call, tool.name, f"the tool service at {url} did not answer after {tries} "
                                                   f"{'try' if tries == 1 else 'tries'} (last problem: {problem})")

    def close_session(self, session: str) -> None:
        """Ask the servers the calls of the session went to to free its resources (best effort:
        waits at most ``CLOSE_TIMEOUT_S`` per server and ignores failures)."""
        with self._lock:
            urls = self._sessions.pop(session, set())
        if not urls:
            return
        import httpx

        for url in sorted(urls):
            try:
                httpx.post(f"{url}/close_session", json={"session": session}, headers=self._headers,
                           timeout=min(self.timeout_s, CLOSE_TIMEOUT_S), trust_env=False)
            except httpx.HTTPError:
                pass

    def close(self) -> None:
        """Close the HTTP clients (those whose loop still runs are closed on it)."""
        with self._lock:
            clients, self._clients = dict(self._clients), {}
            self._sessions.clear()
        for loop, client in clients.items():
            if loop.is_closed():
                continue  # its sockets went with the loop
            try:
                if loop.is_running():
                    future = asyncio.run_coroutine_threadsafe(client.aclose(), loop)
                    if _running_loop() is not loop:
                        future.result(timeout=CLOSE_TIMEOUT_S)
                else:
                    loop.run_until_complete(client.aclose())
            except Exception:  # best effort at shutdown
                pass

    def _client(self) -> httpx.AsyncClient:
        import httpx

        loop = asyncio.get_running_loop()
        with self._lock:
            for old in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[old]
            client = self._clients.get(loop)
            if client is None:
                limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
                client = httpx.AsyncClient(limits=limits, trust_env=False)
                self._clients[loop] = client
            return client


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _server_error(response: httpx.Response) -> tuple[str | None, str]:
    """The ``type`` and ``message`` of an error reply ``{"error": {"message", "type", ...}}``
    (type None, and the start of the body as the message, for a reply of another shape)."""
    try:
        payload = response.json()
    except ValueError:
        return None, response.text[:200] or response.reason_phrase
    error = payload.get("error") if isinstance(payload, Mapping) else None
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        kind = error.get("type")
        return (kind if isinstance(kind, str) else None), error["message"]
    return None, str(payload)[:200]


def _server_message(response: httpx.Response) -> str:
    """The message of an error reply (see ``_server_error``)."""
    return _server_error(response)[1]


def _decode(response: httpx.Response, call: ToolCall, url: str) -> ToolResult:
    """The result of a final (non-5xx) answer."""
    if response.status_code == 404:
        kind, message = _server_error(response)
        if kind != "unknown_tool":  # no such endpoint: the setup's failure, not the model's
            return unavailable_result(call, call.name, f"the server at {url} answered POST /call with HTTP 404 "
                                                       f"({message}); the URL may be wrong: it must be the tool "
                                                       "server's root, e.g. http://127.0.0.1:8000")
        if not message.startswith("Error:"):
            message = f"Error: the tool service at {url} does not know tool {call.name!r}: {message}"
        return ToolResult(call, message, "unknown_tool")
    if response.status_code != 200:
        return ToolResult(
            call,
            f"Error: the tool service at {url} refused the call (HTTP {response.status_code}: "
            f"{_server_message(response)}).",
            "exception",
        )
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if (
        not isinstance(payload, Mapping)
        or not isinstance(payload.get("content"), str)
        or not (payload.get("error") is None or payload.get("error") in _ERROR_KINDS)
    ):
        return unavailable_result(call, call.name, f"the tool service at {url} sent an answer that is not "
                                  '{"content": str, "error": null or an error kind}; the call may not have run')
    return ToolResult(call, payload["content"], payload["error"])

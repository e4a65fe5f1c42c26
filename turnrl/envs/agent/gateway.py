"""The agent gateway: an OpenAI-compatible chat endpoint that agent programs call, answered by
the trainer's rollout backend one turn at a time.

An ``AgentEnv`` episode opens a *session*: a random key, and its own base URL
(``{gateway}/s/{key}/v1``). The agent program calls ``POST {base_url}/chat/completions``
(``/v1/chat/completions`` with ``Authorization: Bearer {key}`` reaches the same session); the
gateway checks the body (the same request model as ``turnrl serve-policy``:
``turnrl.policies.server.ChatCompletionRequest``), turns it into a ``Call`` (its messages and
tools as the chat template reads them) and puts it on the session's queue. The episode's env
hands the call to the rollout collector as an observation; the collector samples the turn with
the run's policy (in one batch with every other live episode's turn) and steps the env with the
text, which answers the call (``Call.answer``): ``content`` and structured ``tool_calls`` read
by the model family's tool parser, ``usage`` counted as vLLM does, as one JSON reply or, with
``stream: true``, as server-sent events (the whole reply at once: a role chunk, the content,
one chunk per tool call, the finish reason, the usage chunk with ``include_usage``,
``[DONE]``).

What a client chooses: the messages, the tools (``tool_choice`` ``auto`` or ``none``), ``stop``
strings (the reply's text ends before the first one), ``parallel_tool_calls`` and
``stream``/``stream_options``. The sampling settings are the run's (``agent.temperature``,
``agent.max_new_tokens``...): a client's ``temperature``, ``top_p``, ``seed``, ``max_tokens``
and ``model`` are read, checked and not used, since the trainer learns from turns sampled at its
own settings. Refused with a 400 that says so: ``n`` other than 1 (one reply per call is
recorded) and ``logprobs`` (the trainer records them; the agent does not need them).

Every failure is the client's to read: an unknown key is 401, a session whose episode has
ended (a turn or context limit, a deadline, the run's end) answers 410 to its calls, waiting
ones included, so the agent program stops.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import secrets
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from turnrl.policies.openai_chat import SSE_DONE, reply_message, sse, template_messages, template_tools
from turnrl.policies.server import ChatCompletionRequest
from turnrl.serving import APIError, HTTPService, JSONReply, service_app

__all__ = ["AgentGateway", "Call", "Reply", "Session", "shared_gateway"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 << 20
"""Largest request body the gateway reads (a long agent history with tool results)."""
_ENDPOINTS = ("GET /health, GET /v1/models, POST /v1/chat/completions (Authorization: Bearer KEY), "
              "GET /s/KEY/v1/models, POST /s/KEY/v1/chat/completions")
_SSE_HEADERS = {"Cache-Control": "no-cache"}


@dataclass(frozen=True)
class Reply:
    """The answer to one call: the sampled turn's text as the agent reads it.

    Attributes:
        content: the reply's text outside its tool calls (None when empty and there are calls).
        tool_calls: ``[{"id", "type": "function", "function": {"name", "arguments": JSON text}}]``.
        finish_reason: ``"tool_calls"``, ``"stop"`` or ``"length"``.
        prompt_tokens / completion_tokens: the turn's prompt (its segment so far) and sampled ids.
    """

    content: str | None
    tool_calls: list[dict]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int

    def message(self) -> dict:
        """The reply's ``message`` object."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


@dataclass
class Call:
    """One chat completion an agent program asked for, waiting for its turn to be sampled.

    Attributes:
        messages: the request's messages as the chat template reads them
            (``turnrl.policies.openai_chat.template_messages``: ``content`` a string, assistant
            ``tool_calls`` with ``arguments`` as dicts).
        tools: the request's tools as the chat template reads them (``[]`` for none).
        tools_on: whether the reply is read for tool calls (tools given, ``tool_choice`` not
            ``"none"``).
        parallel: ``parallel_tool_calls`` (False: only the first call of a reply is returned).
        stop: stop strings; the reply's text ends before the first one it holds.
        future: resolved with the ``Reply`` (or an ``APIError``) by the env.
    """

    messages: list[dict]
    tools: list[dict]
    tools_on: bool
    parallel: bool = True
    stop: tuple[str, ...] = ()
    future: Future = field(default_factory=Future)

    def answer(self, text: str, parser: str | None, prompt_tokens: int, completion_tokens: int,
               finish_reason: str = "stop") -> Reply:
        """Answer the call with a sampled turn's ``text`` (read for tool calls by ``parser`` when
        ``tools_on``); returns the reply sent."""
        for s in self.stop:
            at = text.find(s)
            if at != -1:
                text, finish_reason = text[:at], "stop"
        content, calls = reply_message(text, parser if self.tools_on else None, self.parallel)
        reply = Reply(content, calls, "tool_calls" if calls else finish_reason, prompt_tokens, completion_tokens)
        if not self.future.done():
            self.future.set_result(reply)
        return reply

    def refuse(self, status: int, message: str) -> None:
        """Answer the call with an error (``status``, ``message``)."""
        if not self.future.done():
            self.future.set_exception(APIError(status, message))


class Session:
    """One agent run's place on the gateway: its key, the calls it sent that wait for a turn,
    and whether it has ended. Thread-safe: the gateway's handlers submit, the env takes."""

    def __init__(self, gateway: AgentGateway, key: str) -> None:
        self.gateway, self.key = gateway, key
        self.calls: queue.Queue = queue.Queue()  # Calls, the program's end, why it ended
        self.ended: str | None = None  # why, once ended
        self._lock = threading.Lock()
        self._waiting: list[Call] = []

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of this session (``.../s/KEY/v1``)."""
        return f"{self.gateway.url}/s/{self.key}/v1"

    def submit(self, call: Call) -> None:
        with self._lock:
            if self.ended is not None:
                call.refuse(410, self.ended)
                return
            self._waiting.append(call)
        self.calls.put(call)

    def take(self, timeout: float) -> Any:
        """The oldest call not answered yet, waiting up to ``timeout`` seconds (None: none came);
        once the session has ended, why (a ``str``). The env also puts the program's end here."""
        try:
            call = self.calls.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        with self._lock:
            if call in self._waiting:
                self._waiting.remove(call)
        return call

    def end(self, why: str) -> None:
        """End the session: every call waiting, and any sent later, is answered 410 ``why``."""
        with self._lock:
            self.ended = self.ended or why
            waiting, self._waiting = self._waiting, []
        for call in waiting:
            call.refuse(410, self.ended)
        self.calls.put(self.ended)  # wakes a take() waiting meanwhile
        self.gateway.forget(self.key)


class AgentGateway(HTTPService):
    """The gateway's server (see the module docstring); ``open()`` makes a session.

    Args:
        host / port: where it listens (loopback: agent programs run on this machine; a session
            key is a secret only the episode's program is given).
        model_name: the model ``GET /v1/models`` lists (requests may name any model).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, model_name: str = "turnrl-policy") -> None:
        super().__init__(host, port, "agent-gateway", read_timeout_s=600.0)
        self.model_name = model_name
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self) -> Session:
        """A new session with a fresh key."""
        with self._lock:
            session = Session(self, secrets.token_urlsafe(24))
            self._sessions[session.key] = session
        return session

    def forget(self, key: str) -> None:
        with self._lock:
            self._sessions.pop(key, None)

    def _session(self, key: str | None) -> Session:
        with self._lock:
            session = self._sessions.get(key or "")
        if session is None:
            raise APIError(401, "unknown or ended agent session key: use the base URL (or the API key) the "
                                "episode gave the agent program, while its episode runs")
        return session

    def build_app(self) -> FastAPI:
        app = service_app(title="agent gateway", token=None, max_body_bytes=MAX_BODY_BYTES, endpoints=_ENDPOINTS,
                          logger=log)

        def models() -> JSONReply:
            return JSONReply({"object": "list", "data": [
                {"id": self.model_name, "object": "model", "created": 0, "owned_by": "turnrl"}]})

        @app.get("/v1/models")
        async def models_by_key(request: Request) -> JSONReply:
            self._session(_bearer(request))
            return models()

        @app.get("/s/{key}/v1/models")
        async def models_by_path(key: str) -> JSONReply:
            self._session(key)
            return models()

        @app.post("/v1/chat/completions")
        async def chat_by_key(body: ChatCompletionRequest, request: Request) -> Response:
            return await self._chat(self._session(_bearer(request)), body)

        @app.post("/s/{key}/v1/chat/completions")
        async def chat_by_path(key: str, body: ChatCompletionRequest) -> Response:
            return await self._chat(self._session(key), body)

        return app

    async def _chat(self, session: Session, body: ChatCompletionRequest) -> Response:
        call = _call(body)
        session.submit(call)
        reply: Reply = await asyncio.wrap_future(call.future)
        if not body.stream:
            return JSONReply({"id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion",
                              "created": int(time.time()), "model": body.model or self.model_name,
                              "choices": [{"index": 0, "message": reply.message(), "logprobs": None,
                                           "finish_reason": reply.finish_reason}],
                              "usage": reply.usage()})
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_chunks(reply, body.model or self.model_name, include_usage),
                                 media_type="text/event-stream", headers=_SSE_HEADERS)


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    return header[7:].strip() if header[:7].lower() == "bearer " else None


def _call(body: ChatCompletionRequest) -> Call:
    """The call a checked request makes (400 for what the gateway does not do)."""
    if body.n != 1:
        raise APIError(400, f"n={body.n}: the gateway answers each call with one reply (the turn the trainer "
                            "records); send n=1 or leave it out", param="n")
    if body.logprobs or body.top_logprobs:
        raise APIError(400, "logprobs are not returned to agent programs (the trainer records every sampled "
                            "token's logprob itself); leave logprobs and top_logprobs out", param="logprobs")
    tools = template_tools(body.tools) or []
    return Call(template_messages(body.messages), tools, bool(tools) and body.tool_choice != "none",
                body.parallel_tool_calls, body.stop_strings())


async def _chunks(reply: Reply, model: str, include_usage: bool) -> AsyncIterator[bytes]:
    """The ``chat.completion.chunk`` events of a whole reply."""
    head = {"id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        body = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return sse(body)

    yield chunk({"role": "assistant", "content": ""})
    if reply.content:
        yield chunk({"content": reply.content})
    for k, tool_call in enumerate(reply.tool_calls):
        yield chunk({"tool_calls": [{"index": k, **tool_call}]})
    yield chunk({}, reply.finish_reason)
    if include_usage:
        yield sse({**head, "choices": [], "usage": reply.usage()})
    yield SSE_DONE


_shared: AgentGateway | None = None
_shared_lock = threading.Lock()


def shared_gateway() -> AgentGateway:
    """The process's gateway on loopback, started on first use (every ``AgentEnv`` of the
    process opens its sessions there)."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.running:
            _shared = AgentGateway().start()
        return _shared


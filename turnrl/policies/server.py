"""``PolicyServer``: an OpenAI-compatible HTTP server sampling from a transformers model through
``TransformersPolicy``, and ``spawn_policy_server`` to run one in a subprocess.

Run it as ``python -m turnrl serve-policy --path CHECKPOINT --port 8001`` and point
``OpenAIPolicy`` (or anything that speaks the OpenAI API) at it. It is a FastAPI app under
uvicorn, like the env and tool servers (``turnrl.serving``). Each request runs on a thread of
a pool of ``max(1024, 4 x max_batch)`` threads (a request beyond that waits for one), where it
is checked, queued and waits for its rows; each request's rows (its prompts, ``n`` times each)
go into one queue, and a batching thread gathers what arrives within ``batch_window_s`` into
``TransformersPolicy.generate`` calls of at most ``max_batch`` rows with equal sampling
parameters. So concurrent requests (one prompt from each of many clients, as ``OpenAIPolicy``
sends them) share generate calls.

The batcher is fair between requests: each call takes rows round robin from every waiting
request with the call's parameters (one row of each in turn), and the requests take turns to
choose those parameters. So a request that arrives while a large one is being sampled gets
rows into one of the next few calls (at most one call per waiting request of other
parameters), instead of waiting for the large one to finish. A single request is sampled in
its own order, ``max_batch`` rows a call.

Sampling uses one generator seeded with ``seed``; the draws a request gets depend on what it
was batched with, so results are reproducible for a fixed sequence of one-at-a-time requests.

Request bodies are read into pydantic models with OpenAI's field names (``CompletionRequest``,
``ChatCompletionRequest``, ``CollectiveRPCRequest``): types are strict (an integer field takes
no ``2.0``, ``true`` or ``"2"``, a number field no ``true`` or ``"0.7"``, a flag only true or
false), a field sent as ``null`` counts as absent (it takes its default), and fields the server
does not know are ignored, as vLLM does.

Limits (each a constructor argument and a ``serve-policy`` flag; a request over one gets 400
saying the limit and what to send instead):

* ``max_tokens`` in ``[1, max_tokens_limit]`` (``--max-tokens-limit``, default 4096), and
  with the prompt within the model's context (``max_model_len``);
* ``n`` in ``[1, max_n]`` (``--max-n``, default 64);
* per request, at most ``max_request_rows`` rows, prompts x ``n`` (``--max-request-rows``,
  default 1024), and at most ``max_request_tokens`` tokens to generate, rows x ``max_tokens``
  (``--max-request-tokens``, default 1048576): a larger job is sent as several requests (the
  error says how many prompts fit in one);
* ``temperature`` 0 (greedy) or within ``[MIN_TEMPERATURE, MAX_TEMPERATURE]`` = [0.01, 100]
  (below 0.01 sampling is greedy in all but float32 rounding: send 0);
* prompt token ids within the vocabulary; text free of lone UTF-16 surrogates (which have no
  UTF-8 encoding).

Endpoints (JSON in, JSON out):

* ``GET /v1/models`` -> ``{"object": "list", "data": [{"id": NAME, "object": "model",
  "owned_by": "turnrl", "max_model_len": N}]}``.
* ``POST /v1/completions``: ``prompt`` (required) is a string, a list of token ids, or a list
  of either (a batch). Honoured: ``model``, ``max_tokens`` (default 16, or ``max_tokens_limit``
  when lower), ``temperature`` (default 1; 0 means greedy, whose logprobs are at temperature 1),
  ``n``, ``add_special_tokens`` (text prompts; default true, as in vLLM), ``logprobs`` (0 or 1:
  the sampled token's logprob; ``top_logprobs`` holds only the sampled token),
  ``stop_token_ids`` (only the end-of-turn id, which always stops; ``ignore_eos`` only with
  it, where it changes nothing), ``skip_special_tokens``
  (text only), and vLLM's ``return_tokens_as_token_ids`` (``tokens`` are ``"token_id:N"``)
  and ``return_token_ids`` (each choice carries ``token_ids`` and ``prompt_token_ids``).
  Each choice is ``{"index", "text", "logprobs": {"tokens", "token_logprobs",
  "top_logprobs", "text_offset"} | null, "finish_reason": "stop"|"length", "stop_reason"}``;
  ``stop_reason`` is the end-of-turn id when a turn stopped at it with ``ignore_eos`` (so
  through ``stop_token_ids``), else null, as in vLLM; ``token_ids`` end with the end-of-turn id
  when it was sampled (the text never holds it). Unlike vLLM's, ``top_logprobs`` holds only the
  sampled token (vLLM adds the ``logprobs`` most likely ones). Choices of a batch are ordered
  prompt by prompt, ``n`` per prompt.
* ``POST /v1/chat/completions``: ``messages`` (``{"role": str, "content": str}`` each; other
  keys of a message are ignored) rendered with the tokenizer's chat template (generation prompt
  added); ``max_tokens`` (or ``max_completion_tokens``), ``temperature``, ``n``. Replies with
  text only: ``{"choices": [{"index", "message": {"role": "assistant", "content"},
  "finish_reason", "logprobs": null}], "usage"}``.
* ``GET /health`` -> ``{"status": "ok"}``; ``GET /stats`` -> request, batch and token counts.
* Weight pushes, as vLLM's dev-mode endpoints (``OpenAIPolicy.load_weights_from_path``):
  ``POST /collective_rpc`` with ``{"method": "reload_weights", "kwargs": {"weights_path":
  FOLDER}}`` copies every tensor of FOLDER's ``*.safetensors`` into the served model (names
  and shapes are checked against it first: a mismatch is 400 and changes nothing; a tied
  ``lm_head.weight`` may be absent) between two generate batches, and answers ``{"results":
  [null]}``; ``POST /reset_prefix_cache`` -> ``{"success": true}`` (this server caches no KV).
  Unlike vLLM's, they need the API key when the server has one.

With an API key (a bearer token: ``serve-policy`` reads it from the variable ``--token-env``
or its alias ``--api-key-env`` names, default ``TURNRL_SERVER_TOKEN``; required when bound to
an address other than loopback), every endpoint but ``GET /health`` needs ``Authorization:
Bearer <key>``; point ``OpenAIPolicy(api_key_env=VAR)`` at the same variable.

Sampling knobs the server cannot honour are refused, never ignored: ``top_p`` other than 1,
``top_k`` other than -1/0, ``min_p``/penalties away from neutral, ``stop`` strings, ``seed``,
``echo``, ``stream``, ``logprobs`` > 1, ``suffix``, tools. Errors are OpenAI-style
``{"error": {"message", "type", "code", "param"}}``, ``param`` naming the field at fault (a
path where it is nested: ``messages[0].content``, ``stop_token_ids[1]``): 400 a bad body (the
message says which field and how to fix it, or which limit a request is over and how to split
it), 401 a missing or wrong API key (when the server has one), 404 an unknown path or model,
405 a wrong method, 411 a chunked body, 413 a body over ``MAX_BODY_BYTES``, 500 a failure
while generating (the server keeps running). Malformed input of any kind is a 4xx, never a 5xx.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, WrapValidator, field_validator, \
    model_validator
from pydantic_core import PydanticCustomError

from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.sampling import Generation, SamplingParams
from turnrl.serving import APIError, HTTPService, JSONReply, service_app

__all__ = ["ChatCompletionRequest", "CollectiveRPCRequest", "CompletionRequest", "DEFAULT_MAX_N",
           "DEFAULT_MAX_REQUEST_ROWS", "DEFAULT_MAX_REQUEST_TOKENS", "DEFAULT_MAX_TOKENS_LIMIT", "MAX_BODY_BYTES",
           "MAX_TEMPERATURE", "MIN_TEMPERATURE", "PolicyServer", "SpawnedPolicyServer", "spawn_policy_server"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 << 20
"""Largest request body accepted (8 MiB); larger ones get 413."""
DEFAULT_MAX_TOKENS_LIMIT = 4096
"""Default largest ``max_tokens`` of a request (``--max-tokens-limit``)."""
DEFAULT_MAX_N = 64
"""Default largest ``n`` of a request (``--max-n``)."""
DEFAULT_MAX_REQUEST_ROWS = 1024
"""Default most rows (prompts x ``n``) of one request (``--max-request-rows``)."""
DEFAULT_MAX_REQUEST_TOKENS = 1 << 20
"""Default most tokens one request may ask to generate, rows x ``max_tokens`` (``--max-request-tokens``)."""
_MIN_THREADS = 1024
"""Threads that serve requests at once, at least (``max(_MIN_THREADS, 4 x max_batch)``): a request
holds one while it waits for its rows, so this bounds the requests that can share a generate call."""

# The temperatures a request may ask for besides 0 (greedy), and why.
#
# The sampler computes log_softmax(logits / T) in float32 (TransformersPolicy upcasts the logits;
# float32 reaches 3.4e38 with a 24-bit significand), T itself rounded to float32:
# * Overflow: T under 1.4e-45 (float32's smallest) rounds to 0, and logits / 0 is +-inf; the
#   softmax then takes inf - inf = NaN (1e-300 did this). Any T with |logit| / T > 3.4e38
#   overflows alike.
# * Long before that, precision: a logprob is l_i/T - logsumexp(l/T), a difference of numbers of
#   size |l|/T, each carrying a rounding error up to |l|/T * 2^-24. Logits of language models stay
#   within a few hundred, so |l| <= 1e3 is generous: at T = 1e-2, |l|/T <= 1e5 and the error is
#   under 0.01 nats; each halving of T doubles it while the sampled token no longer changes
#   (a gap of one logit is already e^-100 at T = 1e-2). Below 1e-2 sampling is greedy in all but
#   rounding noise, so it is refused with "send 0". (vLLM raises any T below 1e-2 to 1e-2 for the
#   same reason; this server refuses instead, since the logprobs it returns must be those at the
#   temperature the learner scores them with.)
# * The upper bound is a sanity bound, not a numeric one (float32 takes T up to 3.4e38; beyond
#   that T is inf and every scaled logit 0: uniform). Above 100 the logits' usual spread of tens
#   shrinks below one, so sampling is close to uniform over the vocabulary: such a value is
#   almost surely a mistake (a percentage, a wrong field).
MIN_TEMPERATURE = 1e-2
"""Smallest temperature other than 0 (greedy) a request may ask for (see the comment above)."""
MAX_TEMPERATURE = 100.0
"""Largest temperature a request may ask for."""
_SHOWN = 100
"""Characters of a refused value quoted in an error message."""
_ENDPOINTS = ("GET /v1/models, POST /v1/completions, POST /v1/chat/completions, GET /health, GET /stats, "
              "POST /collective_rpc, POST /reset_prefix_cache")
_SERVING_LINE = re.compile(r"serving policy at (http://\S+)")


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def _show(value: Any) -> str:
    """``repr(value)``, cut to ``_SHOWN`` characters (a refused value may be megabytes)."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


# ------------------------------------------------------------ request bodies
# What a body must be, on its own; what depends on the server (the model's name, the --max-*
# limits, the vocabulary, the context, the end-of-turn ids, tokenizing) is checked by the routes.
# A refusal here is a 400 whose message names the field and quotes the value after MESSAGE, and whose
# param is the field's path (turnrl.serving.app).

def _must(message: str, ok: Callable[[Any], bool] = lambda value: True) -> WrapValidator:
    """A field's check: its type (pydantic's), then ``ok``; either failing is one error, ``message``."""
    def check(value: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            value = handler(value)
        except ValidationError:
            raise PydanticCustomError("invalid_value", message) from None
        if not ok(value):
            raise PydanticCustomError("invalid_value", message)
        return value

    return WrapValidator(check)


_Ids = Annotated[list[int], Field(min_length=1)]
_Prompt = Annotated[str | _Ids | Annotated[list[str], Field(min_length=1)] | Annotated[list[_Ids], Field(min_length=1)],
                    _must("must be a string, a non-empty list of token ids, or a non-empty list of either (a batch)")]
_Temperature = Annotated[float, _must(
    f"must be a number >= 0, either 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}] (below "
    f"{MIN_TEMPERATURE:g} sampling is greedy but for float32 rounding: send 0)",
    lambda t: t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE)]
_Logprobs = Annotated[int, _must("must be an integer in [0, 1] (the server returns the sampled token's logprob only)",
                                 lambda k: k in (0, 1))]

# Sampling options the server cannot honour: name -> (the values that are fine, why the others are refused)
_NEUTRAL: dict[str, tuple[tuple, str]] = {
    "top_p": ((1,), "nucleus sampling is not implemented, the full distribution is sampled"),
    "top_k": ((-1, 0), "top-k sampling is not implemented, the full distribution is sampled"),
    "min_p": ((0,), "min-p sampling is not implemented"),
    "presence_penalty": ((0,), "penalties are not implemented"),
    "frequency_penalty": ((0,), "penalties are not implemented"),
    "repetition_penalty": ((1,), "penalties are not implemented"),
    "seed": ((), "per-request seeds are not supported, the server samples from one generator seeded at start "
                 "(--seed)"),
    "echo": ((False,), "echo is not supported"),
    "stream": ((False,), "streaming is not supported"),
    "suffix": (("",), "suffix is not supported"),
    "best_of": ((1,), "best_of is not supported"),
    "logit_bias": (({},), "logit_bias is not supported"),
    "tools": (([],), "tools are not rendered by this server (put tool schemas in the messages)"),
    "response_format": ((), "structured output is not supported"),
    "stop": (("", []), "stop strings are not supported (generation stops at the end-of-turn id)"),
}
_NOT_CHAT = ("logprobs are not served on /v1/chat/completions (use /v1/completions with token-id prompts for "
             "token-exact ids and logprobs)")
_NEUTRAL_CHAT: dict[str, tuple[tuple, str]] = {"logprobs": ((False,), _NOT_CHAT), "top_logprobs": ((), _NOT_CHAT)}


def _neutral(table: dict[str, tuple[tuple, str]], name: str, value: Any) -> Any:
    """``value`` of the refused option ``name`` when it is neutral (as good as absent); else a refusal."""
    fine, why = table[name]
    if value in fine and isinstance(value, bool) == any(isinstance(f, bool) for f in fine):
        return value
    send = " or ".join(json.dumps(f) for f in fine)
    raise PydanticCustomError("unsupported", f"{why}: {'send ' + send + ' or ' if fine else ''}leave it out")


class _Body(BaseModel):
    """What every request body shares: strict types, ``null`` as absent, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class _SamplingBody(_Body):
    """The fields both generation endpoints read."""

    model: str | None = None
    max_tokens: int | None = None
    n: int = 1
    temperature: _Temperature = 1.0
    # refused unless neutral (_NEUTRAL): declared so that a value the server would not honour is never ignored
    top_p: Any = None
    top_k: Any = None
    min_p: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    seed: Any = None
    echo: Any = None
    stream: Any = None
    suffix: Any = None
    best_of: Any = None
    logit_bias: Any = None
    tools: Any = None
    response_format: Any = None
    stop: Any = None

    @field_validator(*_NEUTRAL)
    @classmethod
    def _refused(cls, value: Any, info: ValidationInfo) -> Any:
        return _neutral(_NEUTRAL, info.field_name, value)


class CompletionRequest(_SamplingBody):
    """The body of ``POST /v1/completions`` (see the module docstring)."""

    prompt: _Prompt
    logprobs: _Logprobs | None = None
    add_special_tokens: bool = True
    skip_special_tokens: bool = True
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False

    def prompts(self) -> list[str | list[int]]:
        """``prompt`` as a batch: a list of prompts, each a string or a list of token ids."""
        one = isinstance(self.prompt, str) or isinstance(self.prompt[0], int)
        return [self.prompt] if one else list(self.prompt)  # type: ignore[list-item]


class ChatMessage(_Body):
    """One message of ``ChatCompletionRequest.messages``; its other keys are ignored."""

    role: str
    content: str


class ChatCompletionRequest(_SamplingBody):
    """The body of ``POST /v1/chat/completions`` (see the module docstring)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = None
    logprobs: Any = None  # refused unless false
    top_logprobs: Any = None  # refused

    @field_validator(*_NEUTRAL_CHAT)
    @classmethod
    def _no_logprobs(cls, value: Any, info: ValidationInfo) -> Any:
        return _neutral(_NEUTRAL_CHAT, info.field_name, value)


class ReloadWeightsKwargs(_Body):
    """``CollectiveRPCRequest.kwargs``: the folder of ``*.safetensors`` to load."""

    model_config = ConfigDict(strict=True, extra="forbid")
    weights_path: Annotated[str, _must("must be a non-empty path to a folder of *.safetensors files", bool)]


class CollectiveRPCRequest(_Body):
    """The body of ``POST /collective_rpc``: vLLM's, of which only ``reload_weights`` is served."""

    method: Literal["reload_weights"]
    kwargs: ReloadWeightsKwargs


class _Request:
    """One request's rows (``prompts[i]``, each once) for the batcher: how many were handed to a
    generate call, their results, and ``done`` once every row has its result (or one failed)."""

    def __init__(self, prompts: list[list[int]], params: SamplingParams) -> None:
        self.prompts, self.params = prompts, params
        self.taken = 0  # rows handed to a generate call so far, in order
        self.left = len(prompts)  # rows without a result yet
        self.results: list[Generation | None] = [None] * len(prompts)
        self.error: BaseException | None = None
        self.done = threading.Event()

    @property
    def waiting(self) -> bool:
        """True while rows are left to hand to a generate call."""
        return self.error is None and self.taken < len(self.prompts)

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.done.set()


class PolicyServer(HTTPService):
    """Serve ``model`` over an OpenAI-compatible HTTP API (see the module docstring).

    Use as a context manager, or ``start()`` then ``stop()``.

    Args:
        model: a causal LM (moved to nothing: it runs where it is, in eval mode).
        tokenizer: its tokenizer (with a chat template for ``/v1/chat/completions``).
        host: interface to bind (``127.0.0.1``: this machine only; ``0.0.0.0``: all).
        port: TCP port; 0 picks a free one (read ``url`` after ``start()``).
        model_name: the name served at ``/v1/models``; requests naming another model get 404.
        max_batch: most rows in one ``generate`` call.
        batch_window_s: how long the batcher waits for more rows after the first arrives.
        seed: seed of the sampling generator.
        api_key: when set, requests (but ``GET /health``) must send ``Authorization: Bearer
            <api_key>`` (else 401); required unless ``host`` is loopback.
        max_tokens_limit: largest ``max_tokens`` a request may ask for.
        max_n: largest ``n`` a request may ask for.
        max_request_rows: most rows (prompts x ``n``) in one request.
        max_request_tokens: most tokens one request may ask to generate (rows x ``max_tokens``).

    Raises:
        ValueError: On out-of-range arguments, or a non-loopback ``host`` without an API key.
    """

    def __init__(self, model, tokenizer, host: str = "127.0.0.1", port: int = 0, *, model_name: str = "turnrl-policy",
                 max_batch: int = 64, batch_window_s: float = 0.005, seed: int = 0, api_key: str | None = None,
                 max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT, max_n: int = DEFAULT_MAX_N,
                 max_request_rows: int = DEFAULT_MAX_REQUEST_ROWS,
                 max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS) -> None:
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535] (0 picks a free port), got {port!r}")
        for name, value in (("max_batch", max_batch), ("max_tokens_limit", max_tokens_limit), ("max_n", max_n),
                            ("max_request_rows", max_request_rows), ("max_request_tokens", max_request_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(batch_window_s, bool) or not isinstance(batch_window_s, (int, float)) or \
                not 0 <= batch_window_s < math.inf:
            raise ValueError(f"batch_window_s must be a finite number of seconds >= 0, got {batch_window_s!r}")
        if not isinstance(model_name, str) or not model_name:
            raise ValueError(f"model_name must be a non-empty string, got {model_name!r}")
        self.model, self.tokenizer = model, tokenizer
        self.policy = TransformersPolicy(model, tokenizer, seed=seed)
        super().__init__(host, port, "policy-server", token=api_key or None,
                         max_threads=max(_MIN_THREADS, 4 * max_batch))
        self.model_name = model_name
        self.max_batch, self.batch_window_s = max_batch, float(batch_window_s)
        self.max_tokens_limit, self.max_n = max_tokens_limit, max_n
        self.max_request_rows, self.max_request_tokens = max_request_rows, max_request_tokens
        self.vocab_size = _vocab_size(model, tokenizer)
        self.max_model_len = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._batching = threading.Event()  # set while the batcher runs
        self._chose_last: _Request | None = None  # the request that chose the last call's parameters
        self._stats = {"requests": 0, "rows": 0, "batches": 0, "generated_tokens": 0, "in_flight": 0}
        self._lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()
        self._weights_lock = threading.Lock()  # generate batches and weight reloads, one at a time

    # --------------------------------------------------------------- running
    def _background(self) -> list[tuple[str, Callable[[], None]]]:
        self._batching.set()
        return [("policy-batcher", self._batch_loop)]

    def _on_stop(self) -> None:
        self._queue.put(None)  # ends the batcher; rows still queued fail with 500

    # --------------------------------------------------------------- serving
    def build_app(self) -> FastAPI:
        """The endpoints (see the module docstring) on ``turnrl.serving``'s app, which adds ``GET
        /health``, the API key check and the refusals of malformed requests."""
        app = service_app(title="policy server", token=self._token, max_body_bytes=MAX_BODY_BYTES,
                          endpoints=_ENDPOINTS, logger=log)

        @app.get("/v1/models")
        async def models() -> JSONReply:
            return JSONReply(self.models())

        @app.get("/stats")
        async def stats() -> JSONReply:
            return JSONReply(self.stats())

        @app.post("/v1/completions")
        async def completions(body: CompletionRequest) -> JSONReply:  # waits for its rows in a worker thread
            return JSONReply(await self.blocking(self.completions, body))

        @app.post("/v1/chat/completions")
        async def chat_completions(body: ChatCompletionRequest) -> JSONReply:  # waits for its rows in a worker thread
            return JSONReply(await self.blocking(self.chat_completions, body))

        @app.post("/collective_rpc")
        async def collective_rpc(body: CollectiveRPCRequest) -> JSONReply:  # waits for its rows in a worker thread
            return JSONReply(await self.blocking(self.collective_rpc, body))

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache() -> JSONReply:
            return JSONReply({"success": True})  # this server caches no KV

        return app

    def stats(self) -> dict:
        """Counts so far: requests, rows sampled, generate batches, generated tokens, rows in flight."""
        with self._lock:
            return dict(self._stats)

    # -------------------------------------------------------------- batching
    def sample(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Queue ``prompts`` (one request) for the batcher and wait for their generations (in order)."""
        request = _Request([list(p) for p in prompts], params)
        with self._lock:
            self._stats["in_flight"] += len(prompts)
        try:
            if not self._batching.is_set():
                request.fail(RuntimeError("the server is not running"))
            else:
                self._queue.put(request)
            while not request.done.wait(0.5):
                if not self._batching.is_set():  # stopped meanwhile: nothing will answer
                    request.fail(RuntimeError("the server is stopping"))
        finally:
            with self._lock:
                self._stats["in_flight"] -= len(prompts)
        if request.error is not None:
            raise APIError(500, f"generation failed: {type(request.error).__name__}: {request.error}")
        return request.results  # type: ignore[return-value]

    def _batch_loop(self) -> None:
        active: list[_Request] = []  # requests with rows to hand out, in turn order
        try:
            while True:
                if not active:
                    first = self._queue.get()
                    if first is None:
                        return
                    active.append(first)
                deadline = time.monotonic() + self.batch_window_s
                while True:  # gather what arrives within the window
                    left = deadline - time.monotonic()
                    try:
                        request = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if request is None:
                        for r in active:
                            r.fail(RuntimeError("the server is stopping"))
                        return
                    active.append(request)
                rows = self._next_rows(active)
                active = [r for r in active if r.waiting]
                if rows:
                    self._run(rows)
        finally:
            self._batching.clear()
            self._chose_last = None
            while True:  # whatever is still queued will not be sampled
                try:
                    request = self._queue.get_nowait()
                except queue.Empty:
                    break
                if request is not None:
                    request.fail(RuntimeError("the server is stopping"))

    def _next_rows(self, active: list[_Request]) -> list[tuple[_Request, int]]:
        """The next generate call's rows, ``(request, row)``, taken from ``active`` (the waiting
        requests in turn order, changed in place).

        The request whose turn it is chooses the sampling parameters; up to ``max_batch`` rows
        are then taken round robin, one at a time, from every waiting request with those
        parameters, in turn order. The request that chose goes to the back of the turn order
        before the next call (behind any request that arrived meanwhile), so a waiting request
        chooses within as many calls as there are requests of other parameters ahead of it, and
        one of the same parameters shares the very next call.
        """
        active[:] = [r for r in active if r.waiting]
        if len(active) > 1 and active[0] is self._chose_last:
            active.append(active.pop(0))
        if not active:
            return []
        params = active[0].params
        same = [r for r in active if r.params == params]
        rows: list[tuple[_Request, int]] = []
        while len(rows) < self.max_batch and any(r.waiting for r in same):
            for r in same:
                if r.waiting and len(rows) < self.max_batch:
                    rows.append((r, r.taken))
                    r.taken += 1
        self._chose_last = active[0]
        return rows

    def _run(self, rows: list[tuple[_Request, int]]) -> None:
        params = rows[0][0].params
        try:
            with self._weights_lock:
                generations = self.policy.generate([r.prompts[i] for r, i in rows], params)
        except Exception as e:  # a failing batch fails its requests, not the server
            log.exception("generate failed on a batch of %d", len(rows))
            for r, _ in rows:
                r.fail(e)
            return
        with self._lock:
            self._stats["batches"] += 1
            self._stats["rows"] += len(rows)
            self._stats["generated_tokens"] += sum(len(g.token_ids) for g in generations)
        for (r, i), gen in zip(rows, generations):
            r.results[i] = gen
            r.left -= 1
            if r.left == 0:
                r.done.set()

    # -------------------------------------------------------------- endpoints
    def models(self) -> dict:
        """The ``GET /v1/models`` reply."""
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "turnrl", "max_model_len": self.max_model_len}]}

    def completions(self, request: CompletionRequest) -> dict:
        """``POST /v1/completions`` (see the module docstring)."""
        self._check_model(request.model)
        params, n = self._sampling(request, "max_tokens")
        stop_ids = request.stop_token_ids
        if stop_ids is not None:
            ends = tuple(getattr(self.policy, "stop_ids", (self.policy.eos_id,)))
            if any(i not in ends for i in stop_ids):
                raise _bad(f"stop_token_ids may only hold end-of-turn ids {list(ends)} (which always stop), got "
                           f"{_show(stop_ids)}", "stop_token_ids")
        ignore_eos = request.ignore_eos
        if ignore_eos and not stop_ids:  # with stop_token_ids=[eos] it changes nothing
            raise _bad("ignore_eos=true is only supported together with stop_token_ids=[end-of-turn id]: "
                       "generation always stops at the end-of-turn id", "ignore_eos")
        raw_prompts = request.prompts()
        self._check_budget(len(raw_prompts), n, params, "prompts")
        prompts = self._prompts(raw_prompts, request.add_special_tokens)
        self._check_lengths(prompts, params)
        generations = self.sample([p for p in prompts for _ in range(n)], params)
        choices = []
        skip_special, as_ids = request.skip_special_tokens, request.return_tokens_as_token_ids
        for index, gen in enumerate(generations):
            prompt = prompts[index // n]
            choice: dict[str, Any] = {
                "index": index, "text": self.tokenizer.decode(self._body(gen), skip_special_tokens=skip_special),
                "logprobs": None if request.logprobs is None else self._logprobs(gen, as_ids),
                "finish_reason": gen.finish_reason,
                # vLLM names the stop token that ended the turn, unless it stopped at the model's own eos
                "stop_reason": gen.token_ids[-1] if gen.finish_reason == "stop" and ignore_eos else None,
            }
            if request.return_token_ids:
                choice["token_ids"], choice["prompt_token_ids"] = list(gen.token_ids), list(prompt)
            choices.append(choice)
        return self._reply("cmpl", "text_completion", choices, prompts, n, generations)

    def chat_completions(self, request: ChatCompletionRequest) -> dict:
        """``POST /v1/chat/completions`` (text only; see the module docstring)."""
        self._check_model(request.model)
        for i, m in enumerate(request.messages):
            _check_text(m.role, f"messages[{i}].role", "messages")
            _check_text(m.content, f"messages[{i}].content", "messages")
        key = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
        params, n = self._sampling(request, key)
        self._check_budget(1, n, params, "conversations")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise _bad("the served tokenizer has no chat template; use /v1/completions", "messages")
        try:
            messages = [{"role": m.role, "content": m.content} for m in request.messages]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # the template rejected the conversation (e.g. a role it does not know)
            raise _bad(f"the chat template cannot render these messages: {type(e).__name__}: {e}", "messages") from e
        prompt = self._encode(text, where="the rendered messages", param="messages")
        self._check_lengths([prompt], params)
        generations = self.sample([prompt] * n, params)
        choices = [{"index": i, "message": {"role": "assistant",
                                            "content": self.tokenizer.decode(self._body(g), skip_special_tokens=True)},
                    "finish_reason": g.finish_reason, "logprobs": None} for i, g in enumerate(generations)]
        return self._reply("chatcmpl", "chat.completion", choices, [prompt], n, generations)

    def collective_rpc(self, request: CollectiveRPCRequest) -> dict:
        """``POST /collective_rpc``: only ``reload_weights`` (see the module docstring)."""
        self.reload_weights(request.kwargs.weights_path)
        return {"results": [None]}

    def reload_weights(self, path: str) -> None:
        """Copy every tensor of folder ``path``'s ``*.safetensors`` into the served model.

        All names, shapes and values are checked first, so a bad folder changes nothing. Runs
        between two generate batches.

        Raises:
            APIError: 400 when the folder has no safetensors, cannot be read, or its tensors do
                not fit the model or hold NaN or inf.
        """
        import torch
        from safetensors.torch import load_file

        try:
            _check_text(path, "weights_path", "kwargs")
            folder = os.path.abspath(os.path.expanduser(path))
            files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")) if os.path.isdir(folder) else []
        except (OSError, ValueError) as e:  # unreadable, or a name the file system cannot hold (a NUL byte)
            raise _bad(f"weights_path {_show(path)} cannot be listed ({type(e).__name__}: {e})", "kwargs") from e
        if not files:
            raise _bad(f"weights_path {_show(path)} is not a folder holding *.safetensors files (on the server's "
                       "file system)", "kwargs")
        loaded: dict[str, torch.Tensor] = {}
        for file in files:
            try:
                loaded.update(load_file(os.path.join(folder, file)))
            except Exception as e:  # a truncated or foreign file
                raise _bad(f"cannot read {os.path.join(folder, file)!r}: {type(e).__name__}: {e}", "kwargs") from e
        params = self.model.state_dict()
        unknown = sorted(set(loaded) - set(params))
        wrong = [n for n in loaded if n in params and tuple(loaded[n].shape) != tuple(params[n].shape)]
        covered = {params[n].data_ptr() for n in loaded if n in params}
        missing = sorted(n for n in params if n not in loaded and params[n].data_ptr() not in covered)
        not_finite = sorted(n for n, t in loaded.items()
                            if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()))
        if unknown or wrong or missing or not_finite:
            detail = "; ".join(f"{what}: {names[:3]}" for what, names in
                               (("unknown", unknown), ("other shape", wrong), ("missing", missing),
                                ("NaN or inf values", not_finite)) if names)
            raise _bad(f"the weights in {_show(path)} do not fit the served model ({detail}); push a finite "
                       "checkpoint of the same architecture", "kwargs")
        with self._weights_lock, torch.no_grad():
            for name, tensor in loaded.items():
                params[name].copy_(tensor)
        log.info("reloaded %d tensors from %s", len(loaded), folder)

    # --------------------------------------------------------------- helpers
    def _reply(self, prefix: str, kind: str, choices: list, prompts: list, n: int, gens: list[Generation]) -> dict:
        with self._lock:
            self._stats["requests"] += 1
        prompt_tokens = sum(len(p) for p in prompts) * n
        completion_tokens = sum(len(g.token_ids) for g in gens)
        return {"id": f"{prefix}-{secrets.token_hex(12)}", "object": kind, "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

    def _body(self, gen: Generation) -> list[int]:
        ids = gen.token_ids
        ends = getattr(self.policy, "stop_ids", (self.policy.eos_id,))
        return ids[:-1] if gen.finish_reason == "stop" and ids and ids[-1] in ends else ids

    def _logprobs(self, gen: Generation, as_ids: bool) -> dict:
        tokens = [f"token_id:{i}" if as_ids else self.tokenizer.decode([i], skip_special_tokens=False)
                  for i in gen.token_ids]
        offsets, pos = [], 0
        for i in gen.token_ids:  # offsets from per-token decodes (approximate inside multi-byte characters)
            offsets.append(pos)
            pos += len(self.tokenizer.decode([i], skip_special_tokens=False))
        return {"tokens": tokens, "token_logprobs": list(gen.logprobs),
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, gen.logprobs)], "text_offset": offsets}

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"the model {_show(model)} is not served here; this server serves "
                                f"{self.model_name!r} (GET /v1/models)", param="model")

    def _prompts(self, prompts: list[str | list[int]], special: bool) -> list[list[int]]:
        """Each prompt of ``CompletionRequest.prompts()`` as token ids (text encoded, ids checked)."""
        where = (lambda i: "prompt") if len(prompts) == 1 else (lambda i: f"prompt[{i}]")
        return [self._encode(p, special, where(i)) if isinstance(p, str) else self._check_ids(p, where(i))
                for i, p in enumerate(prompts)]

    def _encode(self, text: str, special: bool = False, where: str = "prompt", param: str = "prompt") -> list[int]:
        _check_text(text, where, param)
        try:
            with self._tokenizer_lock:  # a fast tokenizer's settings are shared state: one caller at a time
                ids = self.tokenizer(text, add_special_tokens=special)["input_ids"]
        except Exception as e:  # text the tokenizer refuses
            raise _bad(f"{where} cannot be tokenized: {type(e).__name__}: {e}", param) from e
        if not ids:
            raise _bad(f"{where} is an empty string; send at least one token", param)
        return ids

    def _check_ids(self, ids: list[int], where: str) -> list[int]:
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise _bad(f"{where} holds token ids outside the vocabulary [0, {self.vocab_size}): {_show(bad[:5])}",
                       "prompt")
        return [int(t) for t in ids]

    def _sampling(self, request: _SamplingBody, max_key: str) -> tuple[SamplingParams, int]:
        """The request's sampling parameters and ``n``, within this server's limits (``max_key``:
        the field that holds ``max_tokens``)."""
        max_tokens = getattr(request, max_key)
        _check_limit(max_tokens, max_key, self.max_tokens_limit, "the upper bound is this server's --max-tokens-limit")
        _check_limit(request.n, "n", self.max_n, "the upper bound is this server's --max-n; send further requests "
                                                 "for more samples")
        greedy = request.temperature == 0
        params = SamplingParams(max_new_tokens=min(16, self.max_tokens_limit) if max_tokens is None else max_tokens,
                                temperature=1.0 if greedy else request.temperature, greedy=greedy)
        return params, request.n

    def _check_budget(self, count: int, n: int, params: SamplingParams, what: str) -> None:
        """Refuse a request of ``count`` prompts (``what``: their plural) x ``n`` rows over the
        per-request limits, saying how to split it."""
        rows, max_tokens = count * n, params.max_new_tokens
        tokens = rows * max_tokens
        if rows <= self.max_request_rows and tokens <= self.max_request_tokens:
            return

        def noun(k: int) -> str:
            return f"{k} {what if k != 1 else what[:-1]}"

        fits = min(self.max_request_rows // n, self.max_request_tokens // (n * max_tokens))
        if fits >= 1:
            split = (f"split it into requests of at most {noun(fits)} each (at n={n}, max_tokens={max_tokens}): "
                     f"{-(-count // fits)} requests here")
        elif max_tokens > self.max_request_tokens:
            split = f"lower max_tokens to at most {self.max_request_tokens}"
        else:  # n is the trouble: fewer samples a request, the rest in further requests
            most_n = min(self.max_request_rows, self.max_request_tokens // max_tokens)
            shorter = (f" (or max_tokens to at most {self.max_request_tokens // n})"
                       if n <= self.max_request_rows else "")
            split = (f"one {what[:-1]} at n={n} and max_tokens={max_tokens} is already over: lower n to at most "
                     f"{most_n}{shorter} and ask for the other samples in further requests")
        raise _bad(f"this request asks for {rows} rows ({noun(count)} x n={n}) of up to max_tokens={max_tokens} "
                   f"tokens, {tokens} tokens in all; this server takes at most {self.max_request_rows} rows and "
                   f"{self.max_request_tokens} tokens (rows x max_tokens) per request (serve-policy "
                   f"--max-request-rows, --max-request-tokens): {split}", "n" if count == 1 else "prompt")

    def _check_lengths(self, prompts: list[list[int]], params: SamplingParams) -> None:
        if self.max_model_len is None:
            return
        longest = max(len(p) for p in prompts)
        if longest + params.max_new_tokens > self.max_model_len:
            raise _bad(f"a prompt of {longest} tokens plus max_tokens={params.max_new_tokens} exceeds the model's "
                       f"context of {self.max_model_len} tokens; shorten the prompt or lower max_tokens", "max_tokens")


def _vocab_size(model, tokenizer) -> int:
    """Token ids a prompt may hold: the tokenizer's, and no more than the model embeds."""
    size = len(tokenizer)
    try:
        size = min(size, int(model.get_input_embeddings().num_embeddings))
    except (AttributeError, NotImplementedError, TypeError):  # a model without a plain embedding table
        pass
    return size


def _check_text(text: str, where: str, param: str) -> None:
    """Refuse text without a UTF-8 encoding (JSON's ``\\ud800`` escapes decode to lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _bad(f"{where} holds {_show(text[e.start:e.end])} at character {e.start}, a lone UTF-16 surrogate "
                   "that no text can hold; send valid Unicode", param) from None


def _check_limit(value: int | None, name: str, high: int, note: str) -> None:
    """Refuse an integer field ``name`` outside ``[1, high]`` (None: absent, fine)."""
    if value is not None and not 1 <= value <= high:
        raise _bad(f"'{name}' must be an integer in [1, {high}], got {_show(value)} ({note})", name)


# --------------------------------------------------------------- subprocess
@dataclass
class SpawnedPolicyServer:
    """A ``turnrl serve-policy`` subprocess: its ``url`` and ``process``; ``stop()`` ends it."""

    url: str
    process: subprocess.Popen

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s`` (idempotent)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> SpawnedPolicyServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spawn_policy_server(path: str, args: Sequence[str] = (), *, timeout_s: float = 120.0,
                        env: dict | None = None) -> SpawnedPolicyServer:
    """Start ``python -m turnrl serve-policy --path PATH [ARGS]`` and wait until it listens.

    Args:
        path: the checkpoint (``save_pretrained`` folder of a model and its tokenizer).
        args: further ``serve-policy`` arguments, e.g. ``["--port", "8001", "--threads", "1"]``.
        timeout_s: seconds to wait for the ``serving policy at URL`` line.
        env: the subprocess's environment (default: this one's).

    Raises:
        RuntimeError: If the server exits or stays silent, with what it printed.
    """
    command = [sys.executable, "-m", "turnrl", "serve-policy", "--path", str(path), *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ) if env is None else env)
    lines: list[str] = []
    found: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            match = _SERVING_LINE.search(line)
            if match and not found:
                found.append(match.group(1))
        process.stdout.close()  # drained until exit, so the server never blocks on a full pipe

    reader = threading.Thread(target=read, name="policy-server-stdout", daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    while not found and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not found:
        if process.poll() is None:
            process.kill()
        process.wait()
        raise RuntimeError(f"`{' '.join(command)}` did not start serving within {timeout_s:g} s "
                           f"(exit code {process.returncode}); it printed:\n{''.join(lines)[-3000:]}")
    return SpawnedPolicyServer(found[0], process)

"""``PolicyServer``: an OpenAI-compatible HTTP server sampling from a transformers model through
``TransformersPolicy``, and ``spawn_policy_server`` to run one in a subprocess.

Run it as ``python -m turnrl serve-policy --path CHECKPOINT --port 8001`` and point
``OpenAIPolicy``, the official ``openai`` client or a tool-using agent built on it at it. It
is a FastAPI app under uvicorn, like the env and tool servers (``turnrl.serving``). Each
request runs on a thread of a pool of ``max(1024, 4 x max_batch)`` threads (a request beyond
that waits for one), where it is checked, queued and waits for its rows (a streamed request
holds no thread while it is sampled); each request's rows (its prompts, ``n`` times each) go
into one queue, and a batching thread gathers what arrives within ``batch_window_s`` into
``TransformersPolicy.generate`` calls of at most ``max_batch`` rows with equal sampling
parameters. So concurrent requests (one prompt from each of many clients, as ``OpenAIPolicy``
sends them) share generate calls.

The batcher is fair between requests: each call takes rows round robin from every waiting
request with the call's parameters (one row of each in turn), and the requests take turns to
choose those parameters. So a request that arrives while a large one is being sampled gets
rows into one of the next few calls (at most one call per waiting request of other
parameters), instead of waiting for the large one to finish. A single request is sampled in
its own order, ``max_batch`` rows a call.

Seeds: a request without ``seed`` draws from the server's generator (seeded with ``seed`` at
start); its draws depend on what it was batched with, so results are reproducible for a fixed
sequence of one-at-a-time requests. A request with ``seed`` is sampled in generate calls of
its own (never shared with another request), from a generator seeded with it and with the
model's prefix cache emptied first: the same request gives the same tokens and logprobs
whatever else the server is serving (so seeded requests cost other clients their cached
prefixes, and share no batch).

Request bodies are read into pydantic models with OpenAI's field names (``CompletionRequest``,
``ChatCompletionRequest``, ``CollectiveRPCRequest``; the chat parts in
``turnrl.policies.openai_chat``): types are strict (an integer field takes no ``2.0``,
``true`` or ``"2"``, a number field no ``true`` or ``"0.7"``, a flag only true or false), a
field sent as ``null`` counts as absent (it takes its default), and fields the server does not
know are ignored, as vLLM does.

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
* ``top_p`` in (0, 1]; ``top_logprobs`` in [0, 20]; ``stop`` at most 4 non-empty strings;
  ``seed`` a 64-bit integer;
* prompt token ids within the vocabulary; text (prompts, messages, tools, stop strings) free
  of lone UTF-16 surrogates (which have no UTF-8 encoding).

Sampling knobs both generation endpoints honour:

* ``temperature`` (default 1; 0 means greedy, whose logprobs are at temperature 1);
* ``top_p`` (default 1): nucleus sampling on the tempered distribution, the smallest set of most
  likely tokens whose probability reaches ``top_p``, renormalised; a sampled token's logprob is
  its log-probability under that renormalised distribution (vLLM's processed logprobs). Ignored
  when greedy; 1 samples the whole distribution as without it;
* ``seed`` (above);
* ``stop``: a string or a list of up to 4: the reply ends before the first one it holds (that
  string is not in the text, as vLLM), ``finish_reason`` ``"stop"`` and ``stop_reason`` the
  string. Rows are checked as they are sampled (on the decoded text) and stop there, so a long
  reply does not run on; its tokens up to the one that completed the string count in ``usage``;
* ``stream`` and ``stream_options.include_usage`` (below).

``usage`` is counted as vLLM counts it: ``prompt_tokens`` the (rendered) prompt's tokens once
per prompt, whatever ``n``; ``completion_tokens`` every sampled token, end-of-turn tokens
included.

Endpoints (JSON in, JSON out, or server-sent events with ``stream``):

* ``GET /v1/models`` -> ``{"object": "list", "data": [{"id": NAME, "object": "model",
  "owned_by": "turnrl", "max_model_len": N}]}``.
* ``POST /v1/completions``: ``prompt`` (required) is a string, a list of token ids, or a list
  of either (a batch). Honoured besides the knobs above: ``model``, ``max_tokens`` (default 16,
  or ``max_tokens_limit`` when lower), ``n``, ``add_special_tokens`` (text prompts; default
  true, as in vLLM), ``logprobs`` (0 or 1: the sampled token's logprob; ``top_logprobs`` holds
  only the sampled token), ``stop_token_ids`` (only the end-of-turn id, which always stops;
  ``ignore_eos`` only with it, where it changes nothing), ``skip_special_tokens`` (text only),
  and vLLM's ``return_tokens_as_token_ids`` (``tokens`` are ``"token_id:N"``) and
  ``return_token_ids`` (each choice carries ``token_ids`` and ``prompt_token_ids``). Each
  choice is ``{"index", "text", "logprobs": {"tokens", "token_logprobs", "top_logprobs",
  "text_offset"} | null, "finish_reason": "stop"|"length", "stop_reason"}``; ``stop_reason``
  is the stop string that ended the text, or the end-of-turn id when a turn stopped at it with
  ``ignore_eos`` (so through ``stop_token_ids``), else null, as in vLLM; ``token_ids`` end with
  the end-of-turn id when it was sampled (the text never holds it). Unlike vLLM's,
  ``top_logprobs`` holds only the sampled token (vLLM adds the ``logprobs`` most likely ones).
  Choices of a batch are ordered prompt by prompt, ``n`` per prompt. ``tools`` are refused
  here (they are rendered on the chat endpoint).
* ``POST /v1/chat/completions``: ``messages`` as the ``openai`` client sends them, rendered with
  the tokenizer's chat template (``apply_chat_template(messages, tools=..., tokenize=False,
  add_generation_prompt=True)``, as vLLM renders them):

  - ``{"role", "content"}`` with ``content`` a string or a list of text parts
    (``[{"type": "text", "text": ...}]``, joined by newlines; other part types are refused);
    ``name`` passes to the template;
  - assistant messages may carry ``tool_calls`` (``[{"id", "type": "function", "function":
    {"name", "arguments"}}]``) with ``content`` null or absent (rendered as ``""``); their
    ``arguments``, JSON text, are parsed into objects before the template sees them (Hugging
    Face templates expect dicts; text that is not a JSON object is a 400 naming
    ``messages[i].tool_calls[j].function.arguments``); ``reasoning_content`` (or
    ``reasoning``) passes to templates that render thinking;
  - ``tool`` messages with ``tool_call_id`` and ``content`` (the call's result).

  ``tools``: ``[{"type": "function", "function": {"name", "description", "parameters"}}]``,
  given to the template; ``tool_choice`` ``"auto"`` (the default with tools) or ``"none"``
  (tools are still rendered, calls are not read); ``"required"`` or a named function is
  refused (sampling is not constrained to a call); ``parallel_tool_calls`` false keeps the
  first call only. ``max_tokens`` (or ``max_completion_tokens``; default: the rest of the
  context, at most ``max_tokens_limit``, as vLLM), ``n``, ``logprobs`` and ``top_logprobs``,
  ``skip_special_tokens`` (default true), ``return_token_ids`` (vLLM's: each choice's
  ``token_ids`` and the rendered prompt's ``prompt_token_ids``).

  Reply: ``{"choices": [{"index", "message": {"role": "assistant", "content", "tool_calls"?},
  "finish_reason", "stop_reason", "logprobs"}], "usage"}``. With ``tools`` (and
  ``tool_choice`` not ``"none"``) the reply's text is decoded with its special tokens (call
  markers are special tokens in many tokenizers; as vLLM's hermes parser asks) and read by the
  tool-call parser (``--tool-parser``; ``auto``: the one of the chat format detected from the
  chat template, as the trainer's ``agent.tool_parser=auto``): when it reads well-formed calls,
  ``message.tool_calls`` is ``[{"id": "call_<random>", "type": "function", "function":
  {"name", "arguments": JSON text}}]``, ``content`` the parser's text outside them (null when
  empty) and ``finish_reason`` ``"tool_calls"``; otherwise (no calls, malformed markup, or no
  ``tools``) ``content`` is the text. ``logprobs`` (with ``logprobs: true``):
  ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}, ...]}]}``, one entry per sampled token (the end-of-turn token included, as vLLM),
  the logprob the sampler drew it with (at the request's temperature and ``top_p``, as the
  learner scores it at that temperature), ``top_logprobs`` the ``top_logprobs`` most likely
  tokens of that distribution, most likely first (fewer where ``top_p`` leaves fewer).
* ``GET /health`` -> ``{"status": "ok"}``; ``GET /stats`` -> request, batch and token counts.
* Weight pushes, as vLLM's dev-mode endpoints (``OpenAIPolicy.load_weights_from_path``):
  ``POST /collective_rpc`` with ``{"method": "reload_weights", "kwargs": {"weights_path":
  FOLDER}}`` copies every tensor of FOLDER's ``*.safetensors`` into the served model (names
  and shapes are checked against it first: a mismatch is 400 and changes nothing; a tied
  ``lm_head.weight`` may be absent) between two generate batches, and answers ``{"results":
  [null]}``. ``{"method": "turnrl_pull_weights", "kwargs": {"url", "token", "sha256",
  "size"}}`` fetches a push from the trainer over HTTP (``OpenAIPolicy.load_weights_from_url``,
  ``turnrl.policies.weight_push``: no file system shared), checks its size and hash, then
  loads it as above; ``turnrl_load_folder`` (``{"path"}``) loads a folder. These two answer as
  turnrl's vLLM worker extension does: ``{"results": [{"ok": true, "tensors", "bytes",
  "seconds"}]}``, or ``{"results": [{"ok": false, "error"}]}`` with the weights unchanged.
  ``POST /reset_prefix_cache`` empties the model's prefix cache (the keys and
  values ``TransformersPolicy`` keeps of earlier replies) -> ``{"success": true}``.
  Unlike vLLM's, they need the API key when the server has one.

Streaming (``stream: true`` on either generation endpoint): the reply is ``text/event-stream``,
one ``data: {json}`` event per chunk and a last ``data: [DONE]``. Tokens are sent as they are
sampled (the sampler calls back per token), a chunk per token with the text it makes safe to
send: text that may still turn into a stop string (the last ``len(longest stop) - 1``
characters) or, in a chat reply with tools, into a tool call (from the parser's first marker
on, a tail that may start one, and trailing whitespace) waits for the tokens after it or the
end of the reply. Chat chunks (``chat.completion.chunk``): per choice a first chunk with
``delta: {"role": "assistant", "content": ""}``, then ``delta.content`` pieces (with
``logprobs``, each token's entry in its chunk), then the tool calls, one chunk per call with
``delta.tool_calls: [{"index", "id", "type", "function": {"name", "arguments"}}]``: unlike
vLLM, which streams a call's arguments piece by piece, a call is sent whole once the reply is
complete. Then a chunk with ``finish_reason``. Completion chunks (``text_completion``) carry
``text`` pieces, with ``logprobs`` each token's ``tokens``/``token_logprobs``/``top_logprobs``/
``text_offset``, with ``return_token_ids`` its ``token_ids`` (and ``prompt_token_ids`` first).
The concatenated pieces are the text, content and tool calls the same request gets without
``stream``. With ``stream_options: {"include_usage": true}`` a last chunk with empty
``choices`` holds ``usage``. A failure while sampling is a last ``data: {"error": {...}}``
event before ``[DONE]``. A client that closes the stream ends its request's rows.

With an API key (a bearer token: ``serve-policy`` reads it from the variable ``--token-env``
or its alias ``--api-key-env`` names, default ``TURNRL_SERVER_TOKEN``; required when bound to
an address other than loopback), every endpoint but ``GET /health`` needs ``Authorization:
Bearer <key>``; point ``OpenAIPolicy(api_key_env=VAR)`` at the same variable.

Sampling knobs the server cannot honour are refused, never ignored: ``top_k`` other than
-1/0, ``min_p``/penalties away from neutral, ``echo``, ``logprobs`` > 1 on
``/v1/completions``, ``suffix``, ``best_of``, ``logit_bias``, ``response_format``,
``tool_choice`` ``"required"`` or named. Errors are OpenAI-style ``{"error": {"message",
"type", "code", "param"}}``, ``param`` naming the field at fault (a path where it is nested:
``messages[0].content``, ``messages[1].tool_calls[0].function.arguments``,
``stop_token_ids[1]``): 400 a bad body (the message says which field and how to fix it, or
which limit a request is over and how to split it), 401 a missing or wrong API key (when the
server has one), 404 an unknown path or model, 405 a wrong method, 411 a chunked body, 413 a
body over ``MAX_BODY_BYTES``, 500 a failure while generating (the server keeps running).
Malformed input of any kind is a 4xx, never a 5xx.
"""

from __future__ import annotations

import asyncio
import dataclasses
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
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Response
from fastapi.responses import StreamingResponse
from pydantic import ValidationError, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.openai_chat import ChatMessage, ChatStream, ChoiceText, CompletionStream, EventChannel, \
    StopStrings, StreamOptions, TokenStrings, ToolParam, final_text, reply_message, template_messages, \
    template_tools, tool_parser_for, usage, CALL_MARKERS, SSE_DONE, sse
from turnrl.policies.openai_chat import StrictBody as _Body
from turnrl.policies.openai_chat import bad as _bad
from turnrl.policies.openai_chat import check_text as _check_text
from turnrl.policies.openai_chat import must as _must
from turnrl.policies.openai_chat import show as _show
from turnrl.policies.sampling import MAX_TOP_LOGPROBS, Generation, SamplingParams
from turnrl.serving.vllm_worker import fetch
from turnrl.serving import APIError, HTTPService, JSONReply, error_body, service_app

__all__ = ["ChatCompletionRequest", "ChatMessage", "CollectiveRPCRequest", "CompletionRequest", "DEFAULT_MAX_N",
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
_ENDPOINTS = ("GET /v1/models, POST /v1/completions, POST /v1/chat/completions, GET /health, GET /stats, "
              "POST /collective_rpc, POST /reset_prefix_cache")
_SERVING_LINE = re.compile(r"serving policy at (http://\S+)")
_SSE_HEADERS = {"Cache-Control": "no-cache"}


# ------------------------------------------------------------ request bodies
# What a body must be, on its own; what depends on the server (the model's name, the --max-*
# limits, the vocabulary, the context, the end-of-turn ids, tokenizing) is checked by the routes.
# A refusal here is a 400 whose message names the field and quotes the value after MESSAGE, and whose
# param is the field's path (turnrl.serving.app).

_Ids = Annotated[list[int], Field(min_length=1)]
_Prompt = Annotated[str | _Ids | Annotated[list[str], Field(min_length=1)] | Annotated[list[_Ids], Field(min_length=1)],
                    _must("must be a string, a non-empty list of token ids, or a non-empty list of either (a batch)")]
_Temperature = Annotated[float, _must(
    f"must be a number >= 0, either 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}] (below "
    f"{MIN_TEMPERATURE:g} sampling is greedy but for float32 rounding: send 0)",
    lambda t: t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE)]
_Logprobs = Annotated[int, _must("must be an integer in [0, 1] (the server returns the sampled token's logprob only)",
                                 lambda k: k in (0, 1))]

_TopP = Annotated[float, _must("must be a number in (0, 1]: nucleus sampling draws from the most likely tokens whose "
                               "probability sums to top_p (1: all of them)", lambda p: 0 < p <= 1)]
_Seed = Annotated[int, _must(f"must be an integer in [{-(1 << 63)}, {(1 << 64) - 1}]",
                             lambda seed: -(1 << 63) <= seed < (1 << 64))]
_TopLogprobs = Annotated[int, _must(f"must be an integer in [0, {MAX_TOP_LOGPROBS}]",
                                    lambda k: 0 <= k <= MAX_TOP_LOGPROBS)]

# Sampling options the server cannot honour: name -> (the values that are fine, why the others are refused)
_NEUTRAL: dict[str, tuple[tuple, str]] = {
    "top_k": ((-1, 0), "top-k sampling is not implemented, the full distribution is sampled"),
    "min_p": ((0,), "min-p sampling is not implemented"),
    "presence_penalty": ((0,), "penalties are not implemented"),
    "frequency_penalty": ((0,), "penalties are not implemented"),
    "repetition_penalty": ((1,), "penalties are not implemented"),
    "echo": ((False,), "echo is not supported"),
    "suffix": (("",), "suffix is not supported"),
    "best_of": ((1,), "best_of is not supported"),
    "logit_bias": (({},), "logit_bias is not supported"),
    "response_format": ((), "structured output is not supported"),
}
_NEUTRAL_COMPLETIONS: dict[str, tuple[tuple, str]] = {
    "tools": (([],), "tools are rendered on /v1/chat/completions only (a completion prompt is text or token ids "
                     "as sent)")}


def _neutral(table: dict[str, tuple[tuple, str]], name: str, value: Any) -> Any:
    """``value`` of the refused option ``name`` when it is neutral (as good as absent); else a refusal."""
    fine, why = table[name]
    if value in fine and isinstance(value, bool) == any(isinstance(f, bool) for f in fine):
        return value
    send = " or ".join(json.dumps(f) for f in fine)
    raise PydanticCustomError("unsupported", f"{why}: {'send ' + send + ' or ' if fine else ''}leave it out")


class _SamplingBody(_Body):
    """The fields both generation endpoints read."""

    model: str | None = None
    max_tokens: int | None = None
    n: int = 1
    temperature: _Temperature = 1.0
    top_p: _TopP = 1.0
    seed: _Seed | None = None
    stop: StopStrings | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # refused unless neutral (_NEUTRAL): declared so that a value the server would not honour is never ignored
    top_k: Any = None
    min_p: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    echo: Any = None
    suffix: Any = None
    best_of: Any = None
    logit_bias: Any = None
    response_format: Any = None

    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple of strings (empty: none)."""
        if not self.stop:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

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
    tools: Any = None  # refused (_NEUTRAL_COMPLETIONS)

    @field_validator(*_NEUTRAL_COMPLETIONS)
    @classmethod
    def _no_tools(cls, value: Any, info: ValidationInfo) -> Any:
        return _neutral(_NEUTRAL_COMPLETIONS, info.field_name, value)

    def prompts(self) -> list[str | list[int]]:
        """``prompt`` as a batch: a list of prompts, each a string or a list of token ids."""
        one = isinstance(self.prompt, str) or isinstance(self.prompt[0], int)
        return [self.prompt] if one else list(self.prompt)  # type: ignore[list-item]


class ChatCompletionRequest(_SamplingBody):
    """The body of ``POST /v1/chat/completions`` (see the module docstring)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: _TopLogprobs | None = None
    tools: list[ToolParam] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    skip_special_tokens: bool = True
    return_token_ids: bool = False

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: Any) -> str:
        if isinstance(value, str) and value in ("auto", "none"):
            return value
        if value == "required" or isinstance(value, dict):
            raise PydanticCustomError("unsupported", "'required' and a named function are not supported (this server "
                                                     "does not constrain sampling to a call): send \"auto\" or "
                                                     "\"none\", or leave it out")
        raise PydanticCustomError("invalid_value", 'must be "auto" or "none" (the model may call a tool, or not)')


class ReloadWeightsKwargs(_Body):
    """``CollectiveRPCRequest.kwargs``: the folder of ``*.safetensors`` to load."""

    model_config = ConfigDict(strict=True, extra="forbid")
    weights_path: Annotated[str, _must("must be a non-empty path to a folder of *.safetensors files", bool)]


class CollectiveRPCRequest(_Body):
    """The body of ``POST /collective_rpc``: vLLM's, with ``reload_weights`` and turnrl's two
    weight-push methods (``turnrl.serving.vllm_worker``); each method's ``kwargs`` are checked by
    ``PolicyServer.collective_rpc``."""

    method: Literal["reload_weights", "turnrl_pull_weights", "turnrl_load_folder"]
    kwargs: dict[str, str]


Watch = Callable[[int, int, float, "list[tuple[int, float]] | None"], bool]
"""A request's per-token callback: ``watch(row, token_id, logprob, top)`` for each token of its
row ``row`` as it is sampled (``TransformersPolicy.generate``'s ``on_token``, with the request's
own row index); a true return ends that row's turn."""


class _Request:
    """One request's rows (``prompts[i]``, each once) for the batcher: how many were handed to a
    generate call, their results, and ``done`` once every row has its result (or one failed).

    ``generator``: a seeded request's own (its rows run in generate calls of their own);
    ``watch``: its per-token callback (streaming, stop strings), or None; ``events``: a
    streamed request's channel, which gets ``("token", row, id, logprob, top, text)`` from the
    watch, ``("done", row, generation)`` per row and ``("error", exception)``."""

    def __init__(self, prompts: list[list[int]], params: SamplingParams, *, generator=None,
                 watch: Watch | None = None, events: EventChannel | None = None) -> None:
        self.prompts, self.params = prompts, params
        self.generator, self.watch, self.events = generator, watch, events
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
            if self.events is not None:
                self.events.post(("error", error))
        self.done.set()

    def finish(self, row: int, gen: Generation) -> None:
        """Row ``row``'s generation is ``gen``."""
        self.results[row] = gen
        self.left -= 1
        if self.events is not None and self.error is None:
            self.events.post(("done", row, gen))
        if self.left == 0:
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
        tool_parser: the parser of tool calls in replies to requests with ``tools``: a name of
            ``turnrl.tools.PARSERS``, or ``"auto"``: the one of the chat format detected from the
            tokenizer's chat template (as the trainer's ``agent.tool_parser=auto``; none when no
            format matches: requests with tools then get 400).

    Raises:
        ValueError: On out-of-range arguments, an unknown ``tool_parser``, or a non-loopback
            ``host`` without an API key.
    """

    def __init__(self, model, tokenizer, host: str = "127.0.0.1", port: int = 0, *, model_name: str = "turnrl-policy",
                 max_batch: int = 64, batch_window_s: float = 0.005, seed: int = 0, api_key: str | None = None,
                 max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT, max_n: int = DEFAULT_MAX_N,
                 max_request_rows: int = DEFAULT_MAX_REQUEST_ROWS,
                 max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS, tool_parser: str = "auto") -> None:
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
        self.tool_parser = tool_parser_for(tokenizer, tool_parser)
        self.model, self.tokenizer = model, tokenizer
        self.tokens = TokenStrings(tokenizer)
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
        async def completions(body: CompletionRequest) -> Response:  # waits for its rows in a worker thread
            if body.stream:  # checked and queued in a worker thread; its events are written from here
                chunks = await self.blocking(self.completions_stream, body, asyncio.get_running_loop())
                return StreamingResponse(chunks, media_type="text/event-stream", headers=_SSE_HEADERS)
            return JSONReply(await self.blocking(self.completions, body))

        @app.post("/v1/chat/completions")
        async def chat_completions(body: ChatCompletionRequest) -> Response:  # waits for its rows in a worker thread
            if body.stream:
                chunks = await self.blocking(self.chat_stream, body, asyncio.get_running_loop())
                return StreamingResponse(chunks, media_type="text/event-stream", headers=_SSE_HEADERS)
            return JSONReply(await self.blocking(self.chat_completions, body))

        @app.post("/collective_rpc")
        async def collective_rpc(body: CollectiveRPCRequest) -> JSONReply:  # waits for its rows in a worker thread
            return JSONReply(await self.blocking(self.collective_rpc, body))

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache() -> JSONReply:
            await self.blocking(self.reset_prefix_cache)
            return JSONReply({"success": True})

        return app

    def stats(self) -> dict:
        """Counts so far: requests, rows sampled, generate batches, generated tokens, rows in flight."""
        with self._lock:
            return dict(self._stats)

    # -------------------------------------------------------------- batching
    def sample(self, prompts: list[list[int]], params: SamplingParams, *, seed: int | None = None,
               watch: Watch | None = None) -> list[Generation]:
        """Queue ``prompts`` (one request) for the batcher and wait for their generations (in
        order). ``seed``: the request's own (its rows then run in generate calls of their own,
        from a generator seeded with it); ``watch``: a per-token callback (``Watch``)."""
        request = _Request([list(p) for p in prompts], params, generator=self._generator(seed), watch=watch)
        with self._lock:
            self._stats["in_flight"] += len(prompts)
        try:
            self._submit(request)
            while not request.done.wait(0.5):
                if not self._batching.is_set():  # stopped meanwhile: nothing will answer
                    request.fail(RuntimeError("the server is stopping"))
        finally:
            with self._lock:
                self._stats["in_flight"] -= len(prompts)
        if request.error is not None:
            raise APIError(500, f"generation failed: {type(request.error).__name__}: {request.error}")
        return request.results  # type: ignore[return-value]

    def _submit(self, request: _Request) -> None:
        """Hand ``request`` to the batcher (or fail it when the server is not running)."""
        if not self._batching.is_set():
            request.fail(RuntimeError("the server is not running"))
        else:
            self._queue.put(request)

    def _generator(self, seed: int | None):
        """A generator seeded with a request's ``seed`` (None: none; the server's is used)."""
        if seed is None:
            return None
        import torch

        return torch.Generator(device=self.policy.device).manual_seed(seed)

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
        one of the same parameters shares the very next call. A seeded request (one with a
        ``generator`` of its own) shares no call: when it chooses, the call holds its rows only,
        and it never joins another's.
        """
        active[:] = [r for r in active if r.waiting]
        if len(active) > 1 and active[0] is self._chose_last:
            active.append(active.pop(0))
        if not active:
            return []
        params = active[0].params
        same = [active[0]] if active[0].generator is not None else [
            r for r in active if r.params == params and r.generator is None]
        rows: list[tuple[_Request, int]] = []
        while len(rows) < self.max_batch and any(r.waiting for r in same):
            for r in same:
                if r.waiting and len(rows) < self.max_batch:
                    rows.append((r, r.taken))
                    r.taken += 1
        self._chose_last = active[0]
        return rows

    def _run(self, rows: list[tuple[_Request, int]]) -> None:
        first = rows[0][0]
        extras: dict[str, Any] = {}  # only what the call needs: a plain call is generate(prompts, params)
        on_token = _on_token(rows)
        if on_token is not None:
            extras["on_token"] = on_token
        if first.generator is not None:
            extras["generator"] = first.generator
        try:
            with self._weights_lock:
                if first.generator is not None:  # a seeded call: no cached prefix of other requests changes its figures
                    self.policy.clear_cache()
                generations = self.policy.generate([r.prompts[i] for r, i in rows], first.params, **extras)
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
            r.finish(i, gen)

    # -------------------------------------------------------------- endpoints
    def models(self) -> dict:
        """The ``GET /v1/models`` reply."""
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "turnrl", "max_model_len": self.max_model_len}]}

    def completions(self, request: CompletionRequest) -> dict:
        """``POST /v1/completions`` without ``stream`` (see the module docstring)."""
        prompts, params, n, ignore_eos = self._completion_setup(request)
        rows = [p for p in prompts for _ in range(n)]
        skip, stop = request.skip_special_tokens, request.stop_strings()
        texts = [self._choice_text(skip, stop) for _ in rows] if stop else None
        generations = self.sample(rows, params, **self._extras(request.seed, texts))
        choices = []
        as_ids = request.return_tokens_as_token_ids
        for index, gen in enumerate(generations):
            text, stop_hit = final_text(self.tokenizer, self._body(gen), skip, stop)
            choice: dict[str, Any] = {
                "index": index, "text": text,
                "logprobs": None if request.logprobs is None else self._logprobs(gen, as_ids),
                "finish_reason": gen.finish_reason,
                # vLLM names the stop string, or the stop token that ended the turn unless it was the model's own eos
                "stop_reason": stop_hit if stop_hit is not None else (
                    gen.token_ids[-1] if gen.finish_reason == "stop" and ignore_eos else None),
            }
            if request.return_token_ids:
                choice["token_ids"], choice["prompt_token_ids"] = list(gen.token_ids), list(rows[index])
            choices.append(choice)
        return self._reply("cmpl", "text_completion", choices, sum(len(p) for p in prompts), generations)

    def completions_stream(self, request: CompletionRequest, loop: asyncio.AbstractEventLoop) -> AsyncIterator[bytes]:
        """``POST /v1/completions`` with ``stream``: the request is checked and queued here, and
        its events (``CompletionStream``) come from the returned iterator, which runs on
        ``loop``."""
        prompts, params, n, ignore_eos = self._completion_setup(request)
        rows = [p for p in prompts for _ in range(n)]
        skip, stop = request.skip_special_tokens, request.stop_strings()
        texts = [self._choice_text(skip, stop) for _ in rows]
        stream = CompletionStream(model=self.model_name, n=len(rows), prompt_tokens=sum(len(p) for p in prompts),
                                  include_usage=_include_usage(request), tokens=self.tokens, texts=texts,
                                  logprobs=request.logprobs is not None, as_ids=request.return_tokens_as_token_ids,
                                  prompts=rows if request.return_token_ids else None, skip_special=skip,
                                  stop_reason_ids=ignore_eos)
        return self._stream(rows, params, request.seed, texts, stream, loop)

    def _completion_setup(self, request: CompletionRequest) -> tuple[list[list[int]], SamplingParams, int, bool]:
        """``(prompts, params, n, ignore_eos)`` of a checked ``/v1/completions`` request."""
        self._check_model(request.model)
        params, n = self._sampling(request, "max_tokens")
        stop_ids = request.stop_token_ids
        if stop_ids is not None:
            ends = self._end_ids
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
        return prompts, params, n, ignore_eos

    def chat_completions(self, request: ChatCompletionRequest) -> dict:
        """``POST /v1/chat/completions`` without ``stream`` (see the module docstring)."""
        chat = self._chat_setup(request)
        texts = [self._choice_text(chat.skip, chat.stop) for _ in range(chat.n)] if chat.stop else None
        generations = self.sample([chat.prompt] * chat.n, chat.params, **self._extras(request.seed, texts))
        choices = []
        for index, gen in enumerate(generations):
            text, stop_reason = final_text(self.tokenizer, self._body(gen), chat.skip, chat.stop)
            content, calls = reply_message(text, chat.parser, request.parallel_tool_calls)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            logprobs = None
            if request.logprobs:
                logprobs = self.tokens.chat_logprobs(gen.token_ids, gen.logprobs, gen.top_logprobs,
                                                     chat.params.top_logprobs)
            choices.append({"index": index, "message": message, "logprobs": logprobs,
                            "finish_reason": "tool_calls" if calls else gen.finish_reason, "stop_reason": stop_reason})
            if request.return_token_ids:
                choices[-1]["token_ids"] = list(gen.token_ids)
        reply = self._reply("chatcmpl", "chat.completion", choices, len(chat.prompt), generations)
        if request.return_token_ids:
            reply["prompt_token_ids"] = list(chat.prompt)
        return reply

    def chat_stream(self, request: ChatCompletionRequest, loop: asyncio.AbstractEventLoop) -> AsyncIterator[bytes]:
        """``POST /v1/chat/completions`` with ``stream``: the request is checked, rendered and
        queued here, and its events (``ChatStream``) come from the returned iterator, which runs
        on ``loop``."""
        chat = self._chat_setup(request)
        markers = None if chat.parser is None else CALL_MARKERS.get(chat.parser, ())
        texts = [self._choice_text(chat.skip, chat.stop, markers) for _ in range(chat.n)]
        stream = ChatStream(model=self.model_name, n=chat.n, prompt_tokens=len(chat.prompt),
                            include_usage=_include_usage(request), tokens=self.tokens, texts=texts,
                            parser=chat.parser, parallel=request.parallel_tool_calls, logprobs=request.logprobs,
                            top_logprobs=chat.params.top_logprobs, skip_special=chat.skip,
                            prompt_ids=list(chat.prompt) if request.return_token_ids else None)
        return self._stream([chat.prompt] * chat.n, chat.params, request.seed, texts, stream, loop)

    def _chat_setup(self, request: ChatCompletionRequest) -> _Chat:
        """A checked chat request, rendered (see ``_Chat``)."""
        self._check_model(request.model)
        key = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
        if request.top_logprobs and not request.logprobs:
            raise _bad("top_logprobs needs logprobs: true (the alternatives come with each sampled token's logprob)",
                       "top_logprobs")
        messages = template_messages(request.messages)
        tools = template_tools(request.tools)
        if request.tool_choice is not None and request.tool_choice != "none" and tools is None:
            raise _bad(f"tool_choice {request.tool_choice!r} needs tools: send tools or leave tool_choice out",
                       "tool_choice")
        parser = self.tool_parser if tools is not None and request.tool_choice != "none" else None
        if tools is not None and request.tool_choice != "none" and parser is None:
            raise _bad("this server reads no tool calls: no chat format matches its tokenizer's chat template; start "
                       "it with --tool-parser NAME, or send tool_choice: \"none\"", "tools")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise _bad("the served tokenizer has no chat template; use /v1/completions", "messages")
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # the template rejected the conversation (e.g. a role it does not know)
            raise _bad(f"the chat template cannot render these messages: {type(e).__name__}: {e}", "messages") from e
        if not isinstance(text, str):
            raise _bad(f"the chat template rendered {type(text).__name__}, not text", "messages")
        prompt = self._encode(text, where="the rendered messages", param="messages")
        # max_tokens absent: the rest of the context (as vLLM), at most --max-tokens-limit
        room = self.max_tokens_limit if self.max_model_len is None else self.max_model_len - len(prompt)
        params, n = self._sampling(request, key, default_max=room)
        self._check_budget(1, n, params, "conversations")
        self._check_lengths([prompt], params)
        top_logprobs = (request.top_logprobs or 0) if request.logprobs else 0
        if top_logprobs:
            params = dataclasses.replace(params, top_logprobs=top_logprobs)
        # a reply with tools is decoded with its special tokens: call markers are special tokens in many tokenizers
        skip = request.skip_special_tokens and parser is None
        return _Chat(prompt, params, n, parser, skip, request.stop_strings())

    def _choice_text(self, skip: bool, stop: tuple[str, ...], markers: tuple[str, ...] | None = None) -> ChoiceText:
        return ChoiceText(self.tokenizer, skip_special=skip, end_ids=self._end_ids, stop=stop, markers=markers)

    @staticmethod
    def _extras(seed: int | None, texts: list[ChoiceText] | None) -> dict:
        """``sample``'s keyword arguments for a request's seed and stop strings (none when unset)."""
        extras: dict[str, Any] = {}
        if seed is not None:
            extras["seed"] = seed
        if texts is not None:
            extras["watch"] = lambda row, token_id, logprob, top: texts[row].add(token_id)
        return extras

    def _stream(self, rows: list[list[int]], params: SamplingParams, seed: int | None, texts: list[ChoiceText],
                stream: ChatStream | CompletionStream, loop: asyncio.AbstractEventLoop) -> AsyncIterator[bytes]:
        """Queue a streamed request's ``rows`` and return the iterator of its reply's events."""
        events = EventChannel(loop)

        def watch(row: int, token_id: int, logprob: float, top: list | None) -> bool:
            if events.closed:  # the client went away: end the row
                return True
            stop = texts[row].add(token_id)
            events.post(("token", row, token_id, logprob, top, texts[row].take()))
            return stop

        request = _Request([list(p) for p in rows], params, generator=self._generator(seed), watch=watch,
                           events=events)
        with self._lock:
            self._stats["in_flight"] += len(rows)
        self._submit(request)
        return self._events(request, events, stream)

    async def _events(self, request: _Request, events: EventChannel,
                      stream: ChatStream | CompletionStream) -> AsyncIterator[bytes]:
        """The server-sent events of a streamed request, as its rows' tokens arrive."""
        left = len(request.prompts)
        try:
            for chunk in stream.start():
                yield chunk
            while left:
                event = await events.get()
                if event[0] == "token":
                    chunks = stream.token(*event[1:])
                elif event[0] == "done":
                    left -= 1
                    chunks = stream.done(event[1], event[2], self._body(event[2]))
                else:
                    raise event[1]
                for chunk in chunks:
                    yield chunk
            with self._lock:
                self._stats["requests"] += 1
            for chunk in stream.end():
                yield chunk
        except Exception as e:  # the reply has begun: the error goes in the stream, as vLLM's
            if e is not request.error:
                log.exception("a streamed reply failed")
            yield sse(error_body(500, f"generation failed: {type(e).__name__}: {e}"))
            yield SSE_DONE
        finally:
            events.closed = True
            if left:  # the client went away (or it failed): rows not sampled yet are not sampled
                request.fail(RuntimeError("the stream was closed"))
            with self._lock:
                self._stats["in_flight"] -= len(request.prompts)

    def reset_prefix_cache(self) -> None:
        """``POST /reset_prefix_cache``: empty the model's prefix cache, between two generate batches."""
        with self._weights_lock:
            self.policy.clear_cache()

    def collective_rpc(self, request: CollectiveRPCRequest) -> dict:
        """``POST /collective_rpc`` (see the module docstring): ``reload_weights`` raises a 400 on
        a bad folder; ``turnrl_pull_weights`` (fetch a push over HTTP) and ``turnrl_load_folder``
        answer a failure as ``{"results": [{"ok": false, "error"}]}``, as turnrl's vLLM worker
        extension does, and keep the served weights."""
        kwargs = request.kwargs
        if request.method == "reload_weights":
            try:
                weights = ReloadWeightsKwargs.model_validate(kwargs)
            except ValidationError as e:
                problem = e.errors()[0]
                where = ".".join(str(p) for p in problem.get("loc", ())) or "kwargs"
                raise _bad(f"kwargs.{where}: {problem.get('msg')} (reload_weights takes kwargs "
                           "{'weights_path': FOLDER})", "kwargs") from None
            self.reload_weights(weights.weights_path)
            return {"results": [None]}
        started = time.perf_counter()
        wanted = {"turnrl_pull_weights": ({"url"}, {"url", "token", "sha256", "size"}),
                  "turnrl_load_folder": ({"path"}, {"path"})}[request.method]
        if not wanted[0] <= set(kwargs) <= wanted[1]:
            raise _bad(f"{request.method} takes kwargs {sorted(wanted[1])} (required: {sorted(wanted[0])}), got "
                       f"{sorted(kwargs)}", "kwargs")
        try:
            if request.method == "turnrl_load_folder":
                size = sum(os.path.getsize(os.path.join(kwargs["path"], f)) for f in os.listdir(kwargs["path"])
                           if f.endswith(".safetensors")) if os.path.isdir(kwargs["path"]) else 0
                self.reload_weights(kwargs["path"])
                loaded = None
            else:
                loaded, size = self._fetch_push(kwargs["url"], kwargs.get("token", ""), kwargs.get("sha256", ""),
                                                kwargs.get("size", ""))
                self._load_state(loaded, kwargs["url"])
        except APIError as e:
            return {"results": [{"ok": False, "error": e.message}]}
        except Exception as e:  # noqa: BLE001 - a fetch that failed: answered, the server keeps its weights
            return {"results": [{"ok": False, "error": f"{type(e).__name__}: {e}"}]}
        tensors = len(loaded) if loaded is not None else None
        return {"results": [{"ok": True, "tensors": tensors, "bytes": size, "seconds": time.perf_counter() - started}]}

    @staticmethod
    def _fetch_push(url: str, token: str, sha256: str, size: str) -> tuple[dict, int]:
        """A push's tensors fetched from the trainer (``turnrl.policies.weight_push``), with its
        size and hash checked; raises ``APIError`` 400 on a mismatch or unreadable bytes."""
        import hashlib

        from safetensors.torch import load as load_safetensors

        data = fetch(url, token, int(size) if size else None)
        if sha256 and hashlib.sha256(data).hexdigest() != sha256:
            raise _bad(f"the bytes fetched from {url} do not hash to the sha256 sent ({sha256[:16]}...): the transfer "
                       "was corrupted or the push replaced meanwhile; push again", "kwargs")
        try:
            return load_safetensors(bytes(data)), len(data)
        except Exception as e:  # not safetensors
            raise _bad(f"the bytes fetched from {url} are not a safetensors file: {type(e).__name__}: {e}",
                       "kwargs") from e

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
        self._load_state(loaded, path)
        log.info("reloaded %d tensors from %s", len(loaded), folder)

    def _load_state(self, loaded: dict, source: str) -> None:
        """Copy ``loaded`` (``{name: tensor}``) into the served model between two generate
        batches, after checking every name, shape and value (a misfit changes nothing: 400)."""
        import torch

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
            raise _bad(f"the weights in {_show(source)} do not fit the served model ({detail}); push a finite "
                       "checkpoint of the same architecture", "kwargs")
        with self._weights_lock, torch.no_grad():
            for name, tensor in loaded.items():
                params[name].copy_(tensor)

    # --------------------------------------------------------------- helpers
    def _reply(self, prefix: str, kind: str, choices: list, prompt_tokens: int, gens: list[Generation]) -> dict:
        with self._lock:
            self._stats["requests"] += 1
        return {"id": f"{prefix}-{secrets.token_hex(12)}", "object": kind, "created": int(time.time()),
                "model": self.model_name, "choices": choices, "usage": usage(prompt_tokens, gens)}

    @property
    def _end_ids(self) -> tuple[int, ...]:
        """The ids that end a turn (never part of a reply's text)."""
        return tuple(getattr(self.policy, "stop_ids", (self.policy.eos_id,)))

    def _body(self, gen: Generation) -> list[int]:
        """A generation's ids without its end-of-turn id."""
        ids = gen.token_ids
        return ids[:-1] if gen.finish_reason == "stop" and ids and ids[-1] in self._end_ids else ids

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

    def _sampling(self, request: _SamplingBody, max_key: str, default_max: int = 16) -> tuple[SamplingParams, int]:
        """The request's sampling parameters and ``n``, within this server's limits (``max_key``:
        the field that holds ``max_tokens``; ``default_max``: its default, capped by the limit)."""
        max_tokens = getattr(request, max_key)
        _check_limit(max_tokens, max_key, self.max_tokens_limit, "the upper bound is this server's --max-tokens-limit")
        _check_limit(request.n, "n", self.max_n, "the upper bound is this server's --max-n; send further requests "
                                                 "for more samples")
        if request.stream_options is not None and not request.stream:
            raise _bad("stream_options is only read with stream: true", "stream_options")
        for i, s in enumerate(request.stop_strings()):
            _check_text(s, "stop" if isinstance(request.stop, str) else f"stop[{i}]", "stop")
        greedy = request.temperature == 0
        if max_tokens is None:
            max_tokens = max(1, min(default_max, self.max_tokens_limit))
        params = SamplingParams(max_new_tokens=max_tokens, temperature=1.0 if greedy else request.temperature, greedy=greedy,
                         top_p=1.0 if greedy else request.top_p)
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


@dataclass(frozen=True)
class _Chat:
    """A checked, rendered chat request: its prompt's ids, sampling parameters, ``n``, the tool
    parser of its reply (None: text only), whether its text skips special tokens, its stop strings."""

    prompt: list[int]
    params: SamplingParams
    n: int
    parser: str | None
    skip: bool
    stop: tuple[str, ...]


def _include_usage(request: _SamplingBody) -> bool:
    return request.stream_options is not None and request.stream_options.include_usage


def _on_token(rows: list[tuple[_Request, int]]):
    """The ``on_token`` of a generate call of ``rows``: each row's request's ``watch`` (None when
    no request has one: plain sampling). A watch that raises fails its request and ends its row,
    not the call."""
    if all(r.watch is None for r, _ in rows):
        return None

    def on_token(b: int, token_id: int, logprob: float, top: list | None) -> bool:
        r, i = rows[b]
        if r.watch is None:
            return False
        if r.error is not None:
            return True
        try:
            return bool(r.watch(i, token_id, logprob, top))
        except Exception as e:  # a bug in one request's reply must not end the others'
            log.exception("a request's per-token callback failed")
            r.fail(e)
            return True

    return on_token


def _vocab_size(model, tokenizer) -> int:
    """Token ids a prompt may hold: the tokenizer's, and no more than the model embeds."""
    size = len(tokenizer)
    try:
        size = min(size, int(model.get_input_embeddings().num_embeddings))
    except (AttributeError, NotImplementedError, TypeError):  # a model without a plain embedding table
        pass
    return size


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

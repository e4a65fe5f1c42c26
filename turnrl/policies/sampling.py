"""Sampling parameters and the result of one generation, shared by every policy backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MAX_TOP_LOGPROBS = 20
"""Most alternatives ``SamplingParams.top_logprobs`` may ask for (OpenAI's bound)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one assistant turn.

    Logprobs are reported under the temperature-scaled distribution
    ``softmax(logits / temperature)``; the learner scores tokens the same way.
    """

    max_new_tokens: int = 48  # hard cap on tokens in one assistant turn
    temperature: float = 1.0  # sampling temperature (>0); ignored when greedy
    greedy: bool = False  # argmax decoding (evaluation); logprobs then use temperature 1
    # nucleus sampling (served requests): draw from the smallest set of most likely ids whose
    # tempered probability reaches top_p, renormalised; logprobs are those of the renormalised
    # distribution (vLLM's processed logprobs). 1 (the default) samples the whole distribution
    # on the unchanged code path; ignored when greedy. Backends other than TransformersPolicy
    # ignore it (the trainer never sets it: the learner scores the whole distribution).
    top_p: float = 1.0
    # per sampled token, also report the top_logprobs most likely ids and their logprobs under
    # the distribution sampled from (Generation.top_logprobs); 0 (the default) computes none
    top_logprobs: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}; use greedy=True for argmax")
        if not 0.0 < self.top_p <= 1.0:  # NaN fails too
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")


@dataclass
class Generation:
    """One sampled assistant turn.

    Attributes:
        token_ids: ``[L]`` sampled ids, ending with the end-of-turn id when it stopped.
        logprobs: ``[L]`` the sampler's logprob of each id.
        finish_reason: ``"stop"`` (end-of-turn sampled, or the caller's ``on_token`` ended the
            turn) or ``"length"`` (hit max_new_tokens).
        exact: True when ``token_ids`` are the sampler's own ids and ``logprobs`` its own
            logprobs (trainable). False for text re-tokenized on the client (e.g. a chat API
            that returns only text): such a turn is for evaluation only, and its logprobs are NaN.
        top_logprobs: with ``SamplingParams.top_logprobs = k > 0``, ``[L]`` lists of the ``k``
            most likely ``(token_id, logprob)`` at each step, most likely first (ids the
            distribution gives probability 0, outside a ``top_p`` nucleus, left out); else None.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    exact: bool = True
    top_logprobs: list[list[tuple[int, float]]] | None = None

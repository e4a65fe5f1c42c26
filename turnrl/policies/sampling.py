"""Sampling parameters and the result of one generation, shared by every policy backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one assistant turn.

    Logprobs are reported under the temperature-scaled distribution
    ``softmax(logits / temperature)``; the learner scores tokens the same way.
    """

    max_new_tokens: int = 48  # hard cap on tokens in one assistant turn
    temperature: float = 1.0  # sampling temperature (>0); ignored when greedy
    greedy: bool = False  # argmax decoding (evaluation); logprobs then use temperature 1

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}; use greedy=True for argmax")


@dataclass
class Generation:
    """One sampled assistant turn.

    Attributes:
        token_ids: ``[L]`` sampled ids, ending with the end-of-turn id when it stopped.
        logprobs: ``[L]`` the sampler's logprob of each id.
        finish_reason: ``"stop"`` (end-of-turn sampled) or ``"length"`` (hit max_new_tokens).
        exact: True when ``token_ids`` are the sampler's own ids and ``logprobs`` its own
            logprobs (trainable). False for text re-tokenized on the client (e.g. a chat API
            that returns only text): such a turn is for evaluation only, and its logprobs are NaN.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    exact: bool = True

"""``Tally``: the figures one ``Learner.update`` gathers, reduced once into its metrics.

Each micro-batch adds its sums to its minibatch's tally; a minibatch whose loss and gradient are
finite is merged into the pass's; the last pass's sums become the metrics. The ratio extremes
and the sampler/learner mismatch carry over from pass to pass (``next_pass``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from turnrl.algorithms.losses.importance import logprob_mismatch

__all__ = ["Tally"]

_SUMS = ("pg_loss", "entropy", "kl", "clipped", "dual_clipped", "approx_kl", "ratio", "tokens", "value_loss",
         "value_clipped", "mismatch_abs", "mismatch_kl", "mismatch_tokens")
"""Fields summed over tokens, minibatches and processes."""


@dataclass
class Tally:
    """Sums over the sampled tokens trained on (``tokens`` of them), and extremes.

    ``pg_loss`` and ``value_loss`` are sums of each minibatch's aggregated loss; the other sums
    are over tokens (``clipped``, ``approx_kl``, ``ratio`` as the policy loss's stats give them).
    ``mismatch_*`` measure the sampler's logprobs against the learner's over ``mismatch_tokens``.
    """

    pg_loss: float = 0.0
    entropy: float = 0.0
    kl: float = 0.0
    clipped: float = 0.0
    dual_clipped: float = 0.0
    approx_kl: float = 0.0
    ratio: float = 0.0
    tokens: float = 0.0
    value_loss: float = 0.0
    value_clipped: float = 0.0
    mismatch_abs: float = 0.0
    mismatch_kl: float = 0.0
    mismatch_tokens: float = 0.0
    ratio_max: float = 0.0
    ratio_min: float = math.inf
    mismatch_max: float = 0.0
    counted: int = field(default=0)
    """Minibatches merged into this tally (the finite ones of the pass)."""

    def add_stats(self, stats: dict, ratio_max: float, ratio_min: float) -> None:
        """Add a policy loss's token sums (``clipped``, ``approx_kl``...) and ratio extremes."""
        for k, v in stats.items():
            setattr(self, k, getattr(self, k) + float(v))
        self.ratio_max, self.ratio_min = max(self.ratio_max, ratio_max), min(self.ratio_min, ratio_min)

    def add_mismatch(self, learner_lp: torch.Tensor, sampler_lp: torch.Tensor, mask: torch.Tensor) -> None:
        """Add the sampler/learner logprob mismatch over ``mask``'s tokens."""
        stats = logprob_mismatch(learner_lp, sampler_lp, mask)
        self.mismatch_abs += float(stats["mismatch_abs"])
        self.mismatch_kl += float(stats["mismatch_kl"])
        self.mismatch_max = max(self.mismatch_max, float(stats["mismatch_max"]))
        self.mismatch_tokens += float(mask.sum())

    def merge(self, part: Tally) -> None:
        """Add a finite minibatch's tally to the pass's."""
        for k in _SUMS:
            setattr(self, k, getattr(self, k) + getattr(part, k))
        self.ratio_max, self.ratio_min = max(self.ratio_max, part.ratio_max), min(self.ratio_min, part.ratio_min)
        self.mismatch_max = max(self.mismatch_max, part.mismatch_max)
        self.counted += 1

    def next_pass(self) -> Tally:
        """The next pass's empty tally, keeping what carries over: ratio extremes and mismatch."""
        return Tally(ratio_max=self.ratio_max, ratio_min=self.ratio_min, mismatch_abs=self.mismatch_abs,
                     mismatch_kl=self.mismatch_kl, mismatch_tokens=self.mismatch_tokens,
                     mismatch_max=self.mismatch_max)

    def reduced(self, reduce: Callable[..., torch.Tensor], device: torch.device) -> Tally:
        """Of the global batch: sums summed over processes, extremes their max / min."""
        sums = reduce(torch.tensor([getattr(self, k) for k in _SUMS], device=device)).tolist()
        return dataclasses.replace(
            self, **dict(zip(_SUMS, sums)),
            ratio_max=float(reduce(torch.tensor(self.ratio_max, device=device), "max")),
            ratio_min=float(reduce(torch.tensor(self.ratio_min, device=device), "min")),
            mismatch_max=float(reduce(torch.tensor(self.mismatch_max, device=device), "max")))

    def metrics(self) -> dict[str, float]:
        """``pg_loss`` (mean over minibatches), per-token means of ``entropy``, ``kl``,
        ``clip_frac``, ``dual_clipped``, ``approx_kl``, ``ratio``, the ratio extremes (0 when no
        token was trained on) and the mismatch figures (per measured token, and the largest)."""
        tokens, minibatches, measured = max(self.tokens, 1.0), max(self.counted, 1), max(self.mismatch_tokens, 1.0)
        out = {"entropy": self.entropy / tokens, "kl": self.kl / tokens, "dual_clipped": self.dual_clipped / tokens,
               "approx_kl": self.approx_kl / tokens, "ratio": self.ratio / tokens, "pg_loss": self.pg_loss / minibatches,
               "clip_frac": self.clipped / tokens, "mismatch_abs": self.mismatch_abs / measured,
               "mismatch_kl": self.mismatch_kl / measured, "mismatch_max": self.mismatch_max,
               "ratio_max": self.ratio_max, "ratio_min": 0.0 if self.ratio_min == math.inf else self.ratio_min}
        return out

    def value_metrics(self) -> dict[str, float]:
        """``value_loss`` (mean over minibatches) and ``value_clip_frac`` (per token)."""
        return {"value_loss": self.value_loss / max(self.counted, 1),
                "value_clip_frac": self.value_clipped / max(self.tokens, 1.0)}

"""Rollout/learner logprob mismatch: its measurement and the importance corrections for it.

The sampler (vLLM, a batched KV-cache loop, another precision) and the learner's forward
pass do not give bit-identical logprobs for the same tokens, and asynchronous rollouts sample
from older weights, so "on-policy" data is off-policy. With ``r_t = pi_l / pi_s`` the ratio of
the learner's to the sampler's probability of a sampled token, ``rho = prod_t r_t`` its row's
product (over the sampled tokens) and ``g = exp(mean_t log r_t)`` its geometric mean, each
correction (``algorithm.tis``) gives every sampled token a weight that multiplies its loss and
carries no gradient:

=================  ==========================================================  ================================
``tis``            weight of token ``t``                                       from
=================  ==========================================================  ================================
``none``           1
``token``          ``min(r_t, cap)``                                           TIS (Yao et al., 2025), token
``sequence``       ``min(rho, cap)``                                           TIS, sequence
``icepop``         ``r_t`` if ``floor <= r_t <= cap``, else 0                  IcePop (Ling team, 2025):
                                                                               ``M(k; alpha, beta)``, 0.5 and 5
``mis_token``      ``r_t`` if ``r_t <= cap``, else 0                           masked IS (MIS), token
``mis_sequence``   ``rho`` if ``rho <= cap``, else 0                           masked IS, sequence (Liu et
                                                                               al., 2025)
``geo_mask``       1 if ``1 - band <= g <= 1 + band``, else 0 (the whole row)  geometric sequence masking
                                                                               (SkyRL; band 0.01)
=================  ==========================================================  ================================

Truncation (TIS) keeps every token and bounds its weight; masking (IcePop, MIS, geometric)
drops the tokens (or rows) whose ratio says the sampler and the learner disagree too much, and
keeps the others' ratios as they are (the geometric mask keeps weight 1). A dropped token
still counts in the loss aggregation's denominator, as in the papers' implementations.
"""

from __future__ import annotations

import torch

CORRECTIONS = ("none", "token", "sequence", "icepop", "mis_token", "mis_sequence", "geo_mask")
"""The values of ``algorithm.tis`` (see the module docstring)."""
LEVELS = CORRECTIONS
_SEQUENCE = ("sequence", "mis_sequence", "geo_mask")
_MAX_LOG_RATIO = 20.0
"""Log ratios are clamped to this before ``exp`` (a stale row cannot overflow its weight)."""


def logprob_mismatch(learner_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
    """Sums over sampled tokens, for the caller to divide by the token count.

    Returns:
        ``mismatch_abs``: sum of ``|log pi_l - log pi_s|``; ``mismatch_kl``: sum of the k3
        estimate of KL(pi_s || pi_l) under the sampler's tokens; ``mismatch_max``: the largest
        absolute difference (not a sum).
    """
    d = ((learner_logprobs - sampler_logprobs) * mask).clamp(-20.0, 20.0)
    return {
        "mismatch_abs": d.abs().sum(),
        "mismatch_kl": ((torch.expm1(d) - d) * mask).sum(),
        "mismatch_max": d.abs().max() if d.numel() else d.new_tensor(0.0),
    }


def check_correction(level: str, cap: float, floor: float = 0.5, band: float = 0.01) -> None:
    """Raise ValueError naming the setting when ``level`` and its bounds are not usable."""
    if level not in CORRECTIONS:
        raise ValueError(f"the importance correction (tis) must be one of {CORRECTIONS}, got {level!r}")
    if not cap > 0:
        raise ValueError(f"the importance cap (tis_cap) must be > 0, got {cap}")
    if level == "icepop" and not 0 <= floor < cap:
        raise ValueError(f"IcePop keeps ratios in [tis_floor, tis_cap]: tis_floor must be in [0, tis_cap), got "
                         f"{floor} with tis_cap={cap} (the paper's bounds: 0.5 and 5)")
    if level == "geo_mask" and not 0 < band < 1:
        raise ValueError(f"geometric masking keeps rows whose geometric-mean ratio is within 1 +- tis_band: tis_band "
                         f"must be in (0, 1), got {band} (SkyRL's: 0.01)")


def truncated_is_weights(learner_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                         level: str = "token", cap: float = 2.0, floor: float = 0.5, band: float = 0.01
                         ) -> torch.Tensor:
    """Per-token weights ``[N, T]`` of the correction ``level`` (0 off the mask, no gradient).

    Args:
        learner_logprobs / sampler_logprobs: ``[N, T]``.
        mask: ``[N, T]`` loss mask.
        level: one of ``CORRECTIONS`` (see the module docstring).
        cap: TIS's truncation, MIS's and IcePop's upper bound, > 0.
        floor: IcePop's lower bound, in ``[0, cap)``.
        band: the geometric mask's half-width around 1, in ``(0, 1)``.
    """
    check_correction(level, cap, floor, band)
    with torch.no_grad():
        if level == "none":
            return mask.clone()
        log_ratio = (learner_logprobs - sampler_logprobs) * mask
        if level in _SEQUENCE:
            total = log_ratio.sum(dim=1, keepdim=True)
            if level == "geo_mask":
                mean = total / mask.sum(dim=1, keepdim=True).clamp(min=1)
                keep = (mean.exp() >= 1 - band) & (mean.exp() <= 1 + band)
                return keep.to(mask.dtype).expand_as(mask) * mask
            log_ratio = total.expand_as(mask)
        ratio = log_ratio.clamp(max=_MAX_LOG_RATIO).exp()
        if level in ("token", "sequence"):
            return ratio.clamp(max=cap) * mask
        keep = ratio <= cap
        if level == "icepop":
            keep &= ratio >= floor
        return torch.where(keep, ratio, torch.zeros_like(ratio)) * mask

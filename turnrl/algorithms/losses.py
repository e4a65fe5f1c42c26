"""Policy-gradient losses over masked tokens.

All functions take ``[N, T]`` tensors. ``weights`` are per-token loss weights from a loss
aggregation mode (``turnrl.algorithms.aggregation``), 0 off the loss mask and computed on
the whole batch (e.g. token-mean: ``mask / global token count``), so the summed gradient of
micro-batches equals the gradient of the full batch.
"""

from __future__ import annotations

import torch

from turnrl.registry import Registry

KL_ESTIMATORS: Registry = Registry("KL estimator")


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip surrogate, aggregated by ``weights``.

    ``loss_t = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))``,
    ``r_t = exp(logprob_t - old_logprob_t)`` (log-ratio clamped to [-20, 20]).

    Returns:
        ``(loss, stats)`` where loss is ``sum(loss_t * weights)`` and stats hold sums over
        tokens with nonzero weight (``clipped``, ``approx_kl``, ``ratio``) for the caller
        to normalise by the token count.
    """
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = (per_token * weights).sum()
    with torch.no_grad():
        mask = (weights != 0).float()
        stats = {
            "clipped": ((clipped > unclipped).float() * mask).sum(),
            "approx_kl": (0.5 * log_ratio**2 * mask).sum(),
            "ratio": (ratio * mask).sum(),
        }
    return loss, stats


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``log pi - log pi_ref`` per token (unbiased, high variance, can be negative)."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3: ``exp(d) - d - 1`` with ``d = log pi_ref - log pi``; >= 0, unbiased
    for KL(pi || pi_ref) under samples from pi. ``d`` is clamped to [-20, 20]."""
    d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return torch.expm1(d) - d  # expm1 keeps it >= 0 in float32 when d is tiny

"""Policy-gradient losses over masked tokens.

All functions take ``[N, T]`` tensors. ``weights`` are per-token loss weights from a loss
aggregation mode (``turnrl.algorithms.losses.aggregation``), 0 off the loss mask and computed on
the whole batch (e.g. token-mean: ``mask / global token count``), so the summed gradient of
micro-batches equals the gradient of the full batch.
"""

from __future__ import annotations

import torch

from turnrl.algorithms.shapes import same_shape
from turnrl.registry import Registry

KL_ESTIMATORS: Registry = Registry("KL estimator")


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    log_ratio_clip: float = 20.0,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip surrogate, aggregated by ``weights``.

    ``loss_t = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))`` with
    ``r_t = exp(logprob_t - old_logprob_t)``; the log-ratio is clamped to
    ``[-log_ratio_clip, log_ratio_clip]`` so one stale token cannot overflow the ratio.
    ``clip_high > clip_low`` is DAPO's clip-higher (room for low-probability tokens to grow).

    Dual-clip (Ye et al., 2020): for ``A_t < 0`` the loss is also capped at ``-A_t * c``
    (``c = dual_clip > 1``), so a token whose ratio has grown far above 1 under a negative
    advantage does not produce an unbounded update.

    ``is_weights`` (``[N, T]``, no gradient) multiply each token's loss: the truncated
    importance-sampling correction for a sampler whose logprobs differ from the learner's.

    Returns:
        ``(loss, stats)`` where loss is ``sum(loss_t * is_t * weights)`` and stats hold sums
        over tokens with nonzero weight (``clipped``, ``dual_clipped``, ``approx_kl``,
        ``ratio``) for the caller to normalise by the token count, plus ``ratio_max`` and
        ``ratio_min`` over those tokens.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (e.g. 3.0) or None, got {dual_clip}")
    same_shape("ppo_clip_loss", logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, weights=weights,
               is_weights=is_weights)
    log_ratio = (logprobs - old_logprobs).clamp(-log_ratio_clip, log_ratio_clip)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(per_token, dtype=torch.bool)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (per_token > cap)
        per_token = torch.where(dual, cap, per_token)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = (per_token * weights).sum()
    with torch.no_grad():
        mask = (weights != 0).float()
        on = mask.bool()
        stats = {
            "clipped": ((clipped > unclipped).float() * mask).sum(),
            "dual_clipped": (dual.float() * mask).sum(),
            "approx_kl": (0.5 * log_ratio**2 * mask).sum(),
            "ratio": (ratio * mask).sum(),
            "ratio_max": ratio[on].max() if on.any() else ratio.new_tensor(1.0),
            "ratio_min": ratio[on].min() if on.any() else ratio.new_tensor(1.0),
        }
    return loss, stats


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``log pi - log pi_ref`` per token (unbiased, high variance, can be negative)."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``0.5 * (log pi - log pi_ref)^2`` per token: >= 0, biased, low variance; its gradient
    is that of the reverse KL to first order (the estimator GRPO-style losses often use)."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3: ``exp(d) - d - 1`` with ``d = log pi_ref - log pi``; >= 0, unbiased
    for KL(pi || pi_ref) under samples from pi. ``d`` is clamped to [-20, 20]."""
    d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return torch.expm1(d) - d  # expm1 keeps it >= 0 in float32 when d is tiny

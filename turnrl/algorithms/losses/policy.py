"""Policy losses: a registry of pure functions with one signature, chosen by
``LossConfig.policy_loss``.

Every loss is ``fn(logprobs, old_logprobs, advantages, weights, *, <settings>, is_weights=None)
-> (loss, stats)``:

- ``logprobs`` ``[N, T]`` (with gradient), ``old_logprobs`` ``[N, T]`` (the sampler's, or the
  learner's under TIS), ``advantages`` ``[N, T]``, 0 off the loss mask;
- ``weights`` ``[N, T]``: the loss aggregation's per-token weights
  (``turnrl.algorithms.losses.aggregation``), nonzero exactly on the loss mask: **the loss mask is
  ``weights != 0``** (what ``ppo_clip_loss`` already counts its statistics over). A loss that
  needs a row's tokens (GSPO's sequence ratio) reads them there, so the signature stays one;
- ``is_weights`` ``[N, T]`` or None: truncated importance-sampling weights (``algorithm.tis``),
  no gradient; each loss says what it does with them;
- the settings are keyword arguments named after ``LossConfig`` fields, with that field's
  default (``policy_loss_settings`` reads them from a config, so the learner passes each loss
  its own settings without knowing which loss it has).

``loss`` is ``sum(per_token_loss * weights)``: the sum over micro-batches of rows is the loss
of the whole minibatch. ``stats`` has the keys of ``ppo_clip_loss``: sums over the masked
tokens of ``clipped``, ``dual_clipped``, ``approx_kl`` (``0.5 * (logprob - old_logprob)^2``)
and ``ratio``, for the caller to divide by the token count, and ``ratio_max``/``ratio_min``
over those tokens.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from turnrl.algorithms.config import LossConfig
from turnrl.algorithms.losses.token_losses import ppo_clip_loss
from turnrl.algorithms.shapes import same_shape
from turnrl.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")

# PPO-clip (with clip-higher, dual-clip and TIS): the default
POLICY_LOSSES.register("ppo_clip")(ppo_clip_loss)

TENSORS = ("logprobs", "old_logprobs", "advantages", "weights", "is_weights")
"""The parameters every policy loss takes that are not settings."""


def policy_loss_settings(fn: Callable, cfg: LossConfig) -> dict:
    """The settings of the policy loss ``fn`` read from ``cfg``: ``{name: cfg.<name>}`` for each
    parameter of ``fn`` that is not one of ``TENSORS``.

    Raises:
        TypeError: If ``fn`` has a setting that is no ``LossConfig`` field (a loss registered
            with a keyword the config cannot set: rename it after a field or add the field).
    """
    names = [p for p in inspect.signature(fn).parameters if p not in TENSORS]
    unknown = [p for p in names if not hasattr(cfg, p)]
    if unknown:
        raise TypeError(f"policy loss {fn.__name__} has settings {unknown} that are no LossConfig fields; "
                        "name each setting after a field of turnrl.algorithms.config.LossConfig (or add one)")
    return {p: getattr(cfg, p) for p in names}


def _stats(log_ratio: torch.Tensor, ratio: torch.Tensor, clipped: torch.Tensor,
           mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """``ppo_clip_loss``'s statistics (no dual clip): sums over ``mask`` of the ``clipped``
    flags, ``0.5 * log_ratio^2`` and ``ratio``; extremes of ``ratio`` over ``mask``."""
    on = mask.bool()
    return {
        "clipped": (clipped.float() * mask).sum(),
        "dual_clipped": torch.zeros((), dtype=mask.dtype, device=mask.device),
        "approx_kl": (0.5 * log_ratio**2 * mask).sum(),
        "ratio": (ratio * mask).sum(),
        "ratio_max": ratio[on].max() if on.any() else ratio.new_tensor(1.0),
        "ratio_min": ratio[on].min() if on.any() else ratio.new_tensor(1.0),
    }


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    gspo_clip_low: float = 3e-4,
    gspo_clip_high: float = 4e-4,
    log_ratio_clip: float = 20.0,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO, Group Sequence Policy Optimization (Zheng et al. 2025, arXiv 2507.18071), in its
    GSPO-token form.

    The importance ratio is one per trajectory: the geometric mean of its token ratios over
    its sampled tokens (all its turns), ``s_i = exp(mean_{t in y_i} (logprob_t -
    old_logprob_t))``, length-normalised so that trajectories of any length share one clip
    range. The log of ``s_i`` is clamped to ``[-log_ratio_clip, log_ratio_clip]``.

    Our advantages are per token (turn-level estimators give each turn its own), so this is
    the paper's GSPO-token: ``s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]`` (equal to ``s_i`` in
    value; its gradient is ``s_i * grad log pi(y_t)``) and

        ``loss_{i,t} = -min(s_{i,t} A_{i,t}, clip(s_{i,t}, 1 - gspo_clip_low, 1 + gspo_clip_high) A_{i,t})``.

    With an advantage constant over each trajectory (``grpo``, ``rloo``, ...) and
    ``seq-mean-token-mean`` aggregation this is GSPO exactly: value and gradient of
    ``mean_i -min(s_i A_i, clip(s_i) A_i)`` (the paper's eq. 5; the gradient of ``s_i`` is
    ``s_i`` times the mean of its tokens' ``grad log pi``). The clip acts on the sequence
    ratio, so a clipped trajectory loses the gradient of all its tokens (of one sign of
    advantage) at once. At ratio 1 the gradient is REINFORCE's, ``-A_{i,t} grad log pi(y_t)``
    per token, weighted by ``weights``.

    ``is_weights`` (``[N, T]``, no gradient) multiply each token's loss, as in ``ppo_clip_loss``.

    Returns:
        ``(loss, stats)``, loss ``sum(loss_{i,t} * is_{i,t} * weights)``; in ``stats``,
        ``clipped`` counts the tokens whose loss takes the clipped branch (their sequence
        ratio is outside the clip range on the side of their advantage's sign: they get no
        gradient, PPO's clip fraction), ``ratio``, ``ratio_max`` and ``ratio_min`` are of the
        sequence ratio ``s_i`` (on each of its tokens), ``approx_kl`` of the token log-ratios,
        ``dual_clipped`` is 0.
    """
    same_shape("gspo_loss", logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, weights=weights,
               is_weights=is_weights)
    mask = (weights != 0).to(logprobs.dtype)
    token_log_ratio = (logprobs - old_logprobs) * mask
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    seq_log_ratio = (token_log_ratio.sum(dim=1, keepdim=True) / lengths).clamp(-log_ratio_clip, log_ratio_clip)
    # GSPO-token: the value of s_i on every token, the gradient of each token's own log pi
    ratio = torch.exp(seq_log_ratio.detach() + logprobs - logprobs.detach())
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - gspo_clip_low, 1.0 + gspo_clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = (per_token * weights).sum()
    with torch.no_grad():
        stats = _stats(token_log_ratio, ratio.detach(), clipped > unclipped, mask)
    return loss, stats


@POLICY_LOSSES.register("cispo")
def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    cispo_clip_low: float = 1.0,
    cispo_clip_high: float = 0.28,
    log_ratio_clip: float = 20.0,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO, Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585, eq. 4).

    ``loss_t = -sg(clip(r_t, 1 - cispo_clip_low, 1 + cispo_clip_high)) * A_t * logprob_t``
    with ``r_t = exp(logprob_t - old_logprob_t)`` (log-ratio clamped to
    ``[-log_ratio_clip, log_ratio_clip]``). The importance weight is clipped and detached,
    and every token keeps the gradient ``-clip(r_t) A_t grad log pi(y_t)``: unlike PPO's clip,
    which zeroes the gradient of a token whose ratio left the range, nothing is dropped. At
    ratio 1 the gradient is REINFORCE's, ``-A_t grad log pi(y_t)``. The paper aggregates by
    token-mean over the batch (``1 / sum_i |o_i|``).

    Defaults: the paper sets no effective lower bound ("setting eps_low^IS to a large value")
    and tunes only the upper one, without publishing it. ``cispo_clip_low = 1.0`` puts the
    lower bound at 0 (a ratio is never below it: no lower bound); ``cispo_clip_high = 0.28``
    (weights capped at 1.28) is the default of Trinity-RFT's CISPO loss.

    ``is_weights`` (``[N, T]``, no gradient) multiply each token's loss, on top of the
    clipped weight (the sampler-mismatch correction times CISPO's own staleness weight).

    Returns:
        ``(loss, stats)``, loss ``sum(loss_t * is_t * weights)``; ``clipped`` counts the
        tokens whose weight the clip changed (``r_t`` outside the range: their gradient is
        scaled down, not dropped), ``ratio``/``ratio_max``/``ratio_min`` are of ``r_t``,
        ``dual_clipped`` is 0. The loss value carries ``logprob_t`` (it is not PPO's
        surrogate, which is ``-A_t`` at ratio 1); only its gradient is comparable.
    """
    same_shape("cispo_loss", logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, weights=weights,
               is_weights=is_weights)
    mask = (weights != 0).to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs).detach().clamp(-log_ratio_clip, log_ratio_clip)
    ratio = log_ratio.exp()
    is_weight = ratio.clamp(1.0 - cispo_clip_low, 1.0 + cispo_clip_high)  # no gradient: log_ratio is detached
    per_token = -is_weight * advantages * logprobs
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = (per_token * weights).sum()
    with torch.no_grad():
        stats = _stats(log_ratio, ratio, is_weight != ratio, mask)
    return loss, stats

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
- ``turn_index`` ``[N, T]``: the turn of each token (-1 off turns), given only to the losses
  that take it (``takes_turns``: a turn-level loss, ``turn_ppo``);
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

TENSORS = ("logprobs", "old_logprobs", "advantages", "weights", "is_weights", "turn_index")
"""The parameters of a policy loss that are not settings: every loss takes the first five, a
turn-level loss ``turn_index`` too."""
TURN_RATIOS = ("product", "geometric")
"""The values of ``LossConfig.turn_ratio`` (``turn_ppo_loss``)."""


def takes_turns(fn: Callable) -> bool:
    """Whether the policy loss ``fn`` reads the turn of each token (a ``turn_index`` parameter)."""
    return "turn_index" in inspect.signature(fn).parameters


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


def _clipped_objective(advantages: torch.Tensor, ratio: torch.Tensor, low: float, high: float, weights: torch.Tensor,
                       is_weights: torch.Tensor | None, token_log_ratio: torch.Tensor, mask: torch.Tensor):
    """The clipped surrogate of a ratio already built per token (a sequence's or a turn's on each of
    its tokens): ``sum(weights * max(-A r, -A clip(r, low, high)) * is_weights)`` and ``_stats``."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(low, high)
    per_token = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = (per_token * weights).sum()
    with torch.no_grad():
        stats = _stats(token_log_ratio, ratio.detach(), clipped > unclipped, mask)
    return loss, stats


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
    return _clipped_objective(advantages, ratio, 1.0 - gspo_clip_low, 1.0 + gspo_clip_high, weights, is_weights,
                              token_log_ratio, mask)


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


@POLICY_LOSSES.register("turn_ppo")
def turn_ppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    turn_index: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    turn_ratio: str = "product",
    log_ratio_clip: float = 20.0,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Turn-PPO (Li et al. 2025, arXiv 2512.17008): PPO on the turn-level MDP, where a turn (the
    model's whole reply to one observation) is one action, with one importance ratio and one
    clip per turn.

    The ratio of turn ``k`` is the probability ratio of the turn as an action, the product of
    its tokens' ratios (``turn_ratio="product"``, the default):

        ``r_k = pi(a_k | s_k) / pi_old(a_k | s_k) = exp(sum_{t in k} (logprob_t - old_logprob_t))``.

    That is the ratio the paper's turn-level MDP defines; it is not clear from the paper whether
    its implementation normalises it by the turn's length, so the length-normalised geometric
    mean ``exp(mean_{t in k} (logprob_t - old_logprob_t))`` (GSPO's sequence ratio, per turn)
    is ``turn_ratio="geometric"``. A product compounds its tokens' drift: a long turn leaves
    ``[1 - clip_low, 1 + clip_high]`` after a small per-token change (and any sampler/learner
    mismatch counts in it: ``algorithm.tis`` makes the learner's own logprobs the old ones),
    so later minibatches and epochs clip whole turns; the geometric mean stays near 1 and wants
    a tighter range. The log of ``r_k`` is clamped to ``[-log_ratio_clip, log_ratio_clip]``.

    The loss of the turn is PPO's, with PPO's ``clip_low``/``clip_high`` applied once per turn:

        ``L_k = -min(r_k A_k, clip(r_k, 1 - clip_low, 1 + clip_high) A_k)``,

    ``A_k`` the turn's advantage (``turn_mdp_gae`` gives one per turn). The gradient reaches
    every token of the turn through ``r_k``: ``dL_k / dlogprob_t = -A_k r_k`` for each token of
    an unclipped turn (``-A_k r_k / n_k`` with the geometric mean, ``n_k`` its sampled tokens),
    0 for every token of a turn whose loss takes the clipped branch.

    Written per token, ``loss = sum_t weights_t * is_t * -min(r_{k(t)} A_t, clip(r_{k(t)}) A_t)``:
    with an advantage constant over each turn this is ``sum_k W_k L_k``, the turn weighing
    ``W_k = sum_{t in k} weights_t is_t``. The loss aggregation sets the turns' weights: under
    ``turn-mean`` (``algorithm=turn_ppo``'s) every turn of the batch counts once (``W_k = 1 /
    K``), the mean of ``L_k`` over the batch's turns; under ``token-mean`` a turn counts by its
    tokens. An advantage that varies inside a turn is taken per token, each token's term
    clipped by its own advantage's sign.

    ``is_weights`` (``[N, T]``, no gradient) multiply each token's share of its turn's weight.

    Args:
        turn_index: ``[N, T]`` the turn of each token (-1 off turns); every token with a
            nonzero weight needs one. Turns are told apart within a row.
        turn_ratio: ``"product"`` or ``"geometric"`` (``TURN_RATIOS``).

    Returns:
        ``(loss, stats)``, the stats of ``ppo_clip_loss``: ``clipped`` counts the tokens whose
        term takes the clipped branch (all the tokens of a clipped turn), ``ratio``,
        ``ratio_max`` and ``ratio_min`` are of each token's turn ratio ``r_k``, ``approx_kl``
        of the token log-ratios, ``dual_clipped`` is 0.

    Raises:
        ValueError: Without ``turn_index``, on a ``turn_ratio`` not in ``TURN_RATIOS``, or on a
            token of the loss with turn -1.
    """
    if turn_index is None:
        raise ValueError("turn_ppo_loss needs the turn of each token (turn_index): its ratio and clip are per turn")
    if turn_ratio not in TURN_RATIOS:
        raise ValueError(f"turn_ratio must be one of {TURN_RATIOS}, got {turn_ratio!r}")
    same_shape("turn_ppo_loss", logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, weights=weights,
               is_weights=is_weights, turn_index=turn_index)
    on = weights != 0
    if bool((on & (turn_index < 0)).any()):
        raise ValueError("turn_ppo_loss: a token of the loss (nonzero weight) has turn_index -1")
    mask = on.to(logprobs.dtype)
    token_log_ratio = torch.where(on, logprobs - old_logprobs, torch.zeros_like(logprobs))
    index = torch.where(on, turn_index, torch.zeros_like(turn_index))
    turns = int(index.max()) + 1 if index.numel() else 1
    per_turn = token_log_ratio.new_zeros(logprobs.shape[0], turns).scatter_add(1, index, token_log_ratio)
    if turn_ratio == "geometric":
        sizes = mask.new_zeros(logprobs.shape[0], turns).scatter_add(1, index, mask)
        per_turn = per_turn / sizes.clamp(min=1.0)
    # each token's turn ratio, with the gradient of every token of its turn
    ratio = per_turn.clamp(-log_ratio_clip, log_ratio_clip).exp().gather(1, index)
    return _clipped_objective(advantages, ratio, 1.0 - clip_low, 1.0 + clip_high, weights, is_weights,
                              token_log_ratio, mask)

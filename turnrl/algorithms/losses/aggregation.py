"""Loss aggregation: how per-token losses of a batch are weighted into one scalar.

Each mode maps the loss mask of a whole (mini)batch (and the turn of each token,
``turn_index``, which only ``turn-mean`` reads) to per-token weights ``[N, T]`` so that
``loss = sum(per_token_loss * weights)``. Weights are computed on the whole batch before it
is split into micro-batches, so gradient accumulation gives the same gradient as one pass.
"""

from __future__ import annotations

import torch

from turnrl.algorithms.shapes import same_shape
from turnrl.registry import Registry

AGGREGATIONS: Registry = Registry("loss aggregation")


@AGGREGATIONS.register("token-mean")
def token_mean(mask: torch.Tensor, turn_index: torch.Tensor | None = None) -> torch.Tensor:
    """Every sampled token of the batch weighs the same: ``mask / sum(mask)``.

    Long trajectories weigh more. In multi-turn GRPO, failed episodes often run to the turn
    limit, so their tokens (end-of-turn markers included) outnumber those of successes.
    """
    return mask / mask.sum().clamp(min=1.0)


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(mask: torch.Tensor, turn_index: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over each trajectory's tokens, then mean over trajectories (with any tokens):
    every trajectory weighs the same whatever its length."""
    per_row = mask.sum(dim=1, keepdim=True)
    rows = (per_row > 0).sum().clamp(min=1)
    return mask / per_row.clamp(min=1.0) / rows


@AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(mask: torch.Tensor, turn_index: torch.Tensor | None = None) -> torch.Tensor:
    """Sum over each trajectory's tokens, mean over trajectories (with any tokens): a long
    trajectory's tokens each weigh as much as a short one's, and its total weighs more."""
    rows = (mask.sum(dim=1) > 0).sum().clamp(min=1)
    return mask / rows


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(mask: torch.Tensor, turn_index: torch.Tensor | None = None) -> torch.Tensor:
    """Dr.GRPO's aggregation: token sums divided by one constant for the whole batch,
    ``rows * L`` with ``L`` the most sampled tokens any trajectory of the batch has, so no
    trajectory's tokens are scaled by its own length (the length bias of per-sequence means)."""
    rows = (mask.sum(dim=1) > 0).sum().clamp(min=1)
    longest = mask.sum(dim=1).max().clamp(min=1.0)
    return mask / (rows * longest)


def turn_sizes(mask: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """``[N, K]``: the sampled tokens of each turn of each row (``K`` = 1 + the largest turn index).

    Raises:
        ValueError: If a sampled token (``mask != 0``) has no turn (``turn_index < 0``), or the
            shapes differ.
    """
    same_shape("turn_sizes", mask=mask, turn_index=turn_index)
    on = mask != 0
    if bool((on & (turn_index < 0)).any()):
        raise ValueError("a sampled token has turn_index -1: every token of the loss mask must belong to a turn")
    k = int(turn_index.max()) + 1 if turn_index.numel() else 0
    index = torch.where(on, turn_index, torch.zeros_like(turn_index))
    return torch.zeros(mask.shape[0], max(k, 1), dtype=mask.dtype, device=mask.device).scatter_add_(
        1, index, on.to(mask.dtype))


@AGGREGATIONS.register("turn-mean")
def turn_mean(mask: torch.Tensor, turn_index: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over each turn's tokens, then mean over the batch's turns (with sampled tokens):
    every turn weighs the same whatever its length or its trajectory's, ``1 / (n_k K)`` per
    token with ``n_k`` its turn's sampled tokens and ``K`` the batch's turns. The unit of a
    turn-level MDP (Turn-PPO's): a loss constant over a turn's tokens counts once per turn.

    Raises:
        ValueError: Without ``turn_index`` (``[N, T]``, the turn of each token; -1 off turns).
    """
    if turn_index is None:
        raise ValueError("the turn-mean loss aggregation needs the turn of each token (turn_index)")
    sizes = turn_sizes(mask, turn_index)
    turns = (sizes > 0).sum().clamp(min=1)
    per_token = sizes.gather(1, turn_index.clamp(min=0))
    return torch.where(mask != 0, mask / (per_token.clamp(min=1.0) * turns), torch.zeros_like(mask))

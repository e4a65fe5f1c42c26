"""Loss aggregation: how per-token losses of a batch are weighted into one scalar.

Each mode maps the loss mask of a whole (mini)batch to per-token weights ``[N, T]`` so that
``loss = sum(per_token_loss * weights)``. Weights are computed on the whole batch before it
is split into micro-batches, so gradient accumulation gives the same gradient as one pass.
"""

from __future__ import annotations

import torch

from turnrl.registry import Registry

AGGREGATIONS: Registry = Registry("loss aggregation")


@AGGREGATIONS.register("token-mean")
def token_mean(mask: torch.Tensor) -> torch.Tensor:
    """Every sampled token of the batch weighs the same: ``mask / sum(mask)``.

    Long trajectories weigh more. In multi-turn GRPO, failed episodes often run to the turn
    limit, so their tokens (end-of-turn markers included) outnumber those of successes.
    """
    return mask / mask.sum().clamp(min=1.0)


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(mask: torch.Tensor) -> torch.Tensor:
    """Mean over each trajectory's tokens, then mean over trajectories (with any tokens):
    every trajectory weighs the same whatever its length."""
    per_row = mask.sum(dim=1, keepdim=True)
    rows = (per_row > 0).sum().clamp(min=1)
    return mask / per_row.clamp(min=1.0) / rows


@AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(mask: torch.Tensor) -> torch.Tensor:
    """Sum over each trajectory's tokens, mean over trajectories (with any tokens): a long
    trajectory's tokens each weigh as much as a short one's, and its total weighs more."""
    rows = (mask.sum(dim=1) > 0).sum().clamp(min=1)
    return mask / rows


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(mask: torch.Tensor) -> torch.Tensor:
    """Dr.GRPO's aggregation: token sums divided by one constant for the whole batch,
    ``rows * L`` with ``L`` the most sampled tokens any trajectory of the batch has, so no
    trajectory's tokens are scaled by its own length (the length bias of per-sequence means)."""
    rows = (mask.sum(dim=1) > 0).sum().clamp(min=1)
    longest = mask.sum(dim=1).max().clamp(min=1.0)
    return mask / (rows * longest)

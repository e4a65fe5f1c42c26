"""Advantage estimators: pure functions in a registry, looked up by name.

Every estimator has the signature ``fn(batch: TrainBatch, **params) -> Tensor[N, T]`` and
returns per-token advantages that are 0 wherever ``batch.loss_mask`` is 0.
"""

from __future__ import annotations

import torch

from turnrl.algorithms.batch import TrainBatch
from turnrl.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")


def group_mean_std(scores: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row mean, unbiased std and size of the row's group.

    Args:
        scores: ``[N]`` float.
        group_index: ``[N]`` long, any non-negative ids.

    Returns:
        ``(mean [N], std [N], count [N])``; std is 0 for groups of size one.
    """
    if scores.shape != group_index.shape or scores.dim() != 1:
        raise ValueError(f"scores {tuple(scores.shape)} and group_index {tuple(group_index.shape)} must be equal 1-d shapes")
    _, inverse = torch.unique(group_index, return_inverse=True)
    groups = int(inverse.max()) + 1
    count = torch.zeros(groups, dtype=scores.dtype, device=scores.device).index_add_(0, inverse, torch.ones_like(scores))
    total = torch.zeros(groups, dtype=scores.dtype, device=scores.device).index_add_(0, inverse, scores)
    mean = total / count
    sq = torch.zeros(groups, dtype=scores.dtype, device=scores.device).index_add_(0, inverse, (scores - mean[inverse]) ** 2)
    var = torch.where(count > 1, sq / (count - 1).clamp(min=1), torch.zeros_like(sq))
    return mean[inverse], var.sqrt()[inverse], count[inverse]


@ADVANTAGES.register("grpo")
def grpo(batch: TrainBatch, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Trajectory-level GRPO: each trajectory's return minus its group's mean return,
    optionally divided by the group's (unbiased) std, broadcast to all its sampled tokens.

    ``A_i = (R_i - mean_g R) / (std_g R + eps)`` (or without the division).
    A group of one, or a group whose returns are all equal, gets advantage 0.

    Args:
        batch: uses ``scores [N]``, ``group_index [N]``, ``loss_mask [N, T]``.
        normalize_std: divide by the group std (GRPO); False gives Dr.GRPO-style centring.
        eps: added to the std.

    Returns:
        ``[N, T]`` advantages.
    """
    mean, std, _ = group_mean_std(batch.scores, batch.group_index)
    adv = batch.scores - mean
    if normalize_std:
        adv = adv / (std + eps)
    return adv[:, None] * batch.loss_mask

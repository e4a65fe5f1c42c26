"""Statistics over groups of entries (a GRPO group, an anchor state, a turn index, a whole
batch's tokens), vectorised: the one place every estimator gets its means and stds from.

Every function takes ``values`` and integer ``keys`` of one shape plus an optional boolean
``valid`` mask, and returns per-entry statistics of the entry's group (entries with equal
keys among the valid ones). Invalid entries get 0 and do not count.

Exactness: a group whose values are all equal has deviations and std of exactly 0, for any
magnitude and input dtype, so its advantages are exactly 0. A plain float32 mean of eight
0.7s is one rounding step off 0.7 and the std about 6e-8, which ``eps = 1e-6`` does not
cancel: ``(x - mean) / (std + eps)`` came out near +0.06 where it should be 0. Here each
group's values are first shifted by the group's minimum (exact zeros for equal members),
then accumulated in float64; results are float64 and callers cast their final advantage
back to their input dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

STAT_DTYPE = torch.float64
"""Dtype of every group statistic (and of the returns estimators compute before them)."""


class GroupStats(NamedTuple):
    """Per-entry statistics of each entry's group, all of the values' shape, dtype ``STAT_DTYPE``."""

    mean: torch.Tensor  # the group's mean
    centred: torch.Tensor  # value - group mean; exactly 0 in a group of equal values
    std: torch.Tensor  # unbiased std; 0 in a group of one or of equal values
    count: torch.Tensor  # the group's size


def group_stats(values: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor | None = None) -> GroupStats:
    """Per-entry mean, deviation from the mean, unbiased std and size of the entry's group.

    Args:
        values: float of any dtype, any shape ``S``.
        keys: integer, shape ``S``; equal keys form a group (any integers).
        valid: bool, shape ``S``; None means all valid.

    Returns:
        ``GroupStats`` of shape ``S`` in float64; all four are 0 on invalid entries.

    Raises:
        ValueError: If the shapes differ.
    """
    if values.shape != keys.shape or (valid is not None and valid.shape != values.shape):
        raise ValueError(f"values {tuple(values.shape)}, keys {tuple(keys.shape)} and valid "
                         f"{None if valid is None else tuple(valid.shape)} must have one shape")
    flat_v, flat_k = values.reshape(-1).to(STAT_DTYPE), keys.reshape(-1)
    ok = torch.ones_like(flat_v, dtype=torch.bool) if valid is None else valid.reshape(-1).bool()
    mean, centred, std, count = (torch.zeros_like(flat_v) for _ in range(4))
    if ok.any():
        v, k = flat_v[ok], flat_k[ok]
        _, inverse = torch.unique(k, return_inverse=True)
        zeros = torch.zeros(int(inverse.max()) + 1, dtype=STAT_DTYPE, device=v.device)
        ref = zeros.scatter_reduce(0, inverse, v, "amin", include_self=False)
        shifted = v - ref[inverse]  # exactly 0 for every member equal to the group's minimum
        n = zeros.index_add(0, inverse, torch.ones_like(v))
        shift_mean = zeros.index_add(0, inverse, shifted) / n
        dev = shifted - shift_mean[inverse]
        var = torch.where(n > 1, zeros.index_add(0, inverse, dev * dev) / (n - 1).clamp(min=1), zeros)
        mean[ok], centred[ok] = (ref + shift_mean)[inverse], dev
        std[ok], count[ok] = var.sqrt()[inverse], n[inverse]
    return GroupStats(*(t.view(values.shape) for t in (mean, centred, std, count)))


def group_normalize(values: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor | None = None,
                    eps: float | None = 1e-6) -> torch.Tensor:
    """``(value - group mean) / (group std + eps)``, or only the centring with ``eps=None``.

    A group of one or of equal values gets exactly 0; so do invalid entries.

    Returns:
        float64, the values' shape.
    """
    stats = group_stats(values, keys, valid)
    return stats.centred if eps is None else stats.centred / (stats.std + eps)


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``(values - mean) / (std + eps)`` over the entries where ``mask`` is nonzero (the
    whole batch's sampled tokens as one group), 0 elsewhere; exactly 0 if they are all equal.

    Returns:
        float64, the values' shape.
    """
    return group_normalize(values, torch.zeros_like(values, dtype=torch.long), mask != 0, eps)


def leave_one_out_centred(values: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-entry value minus the mean of the *other* valid entries of its group (RLOO).

    Computed as ``G / (G - 1) * (value - group mean)`` (the same number), so a group of
    equal values gets exactly 0.

    Returns:
        ``(centred, others)`` in float64: the value minus the leave-one-out mean, and how many
        entries that mean is over. Where ``others == 0`` (a group of one, or an invalid entry)
        ``centred`` is 0; a caller wanting another fallback uses ``others``.
    """
    stats = group_stats(values, keys, valid)
    others = (stats.count - 1).clamp(min=0)
    centred = torch.where(others > 0, stats.centred * stats.count / others.clamp(min=1), torch.zeros_like(others))
    return centred, others

"""Statistics over groups of entries (a GRPO group, an anchor state, a turn index), vectorised.

Every function takes ``values`` and integer ``keys`` of one shape plus an optional boolean
``valid`` mask, and returns per-entry statistics of the entry's group (entries with equal
keys among the valid ones). Invalid entries get 0 and do not count.
"""

from __future__ import annotations

import torch


def segment_stats(values: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-entry mean, unbiased std and size of the entry's group.

    Args:
        values: float, any shape ``S``.
        keys: long, shape ``S``; equal keys form a group (any integers).
        valid: bool, shape ``S``; None means all valid.

    Returns:
        ``(mean, std, count)``, each of shape ``S``; std is 0 for groups of one, and all
        three are 0 on invalid entries.
    """
    if values.shape != keys.shape or (valid is not None and valid.shape != values.shape):
        raise ValueError(f"values {tuple(values.shape)}, keys {tuple(keys.shape)} and valid "
                         f"{None if valid is None else tuple(valid.shape)} must have one shape")
    flat_v, flat_k = values.reshape(-1), keys.reshape(-1)
    ok = torch.ones_like(flat_v, dtype=torch.bool) if valid is None else valid.reshape(-1).bool()
    mean = torch.zeros_like(flat_v)
    std = torch.zeros_like(flat_v)
    count = torch.zeros_like(flat_v)
    if ok.any():
        v, k = flat_v[ok], flat_k[ok]
        _, inverse = torch.unique(k, return_inverse=True)
        groups = int(inverse.max()) + 1
        zeros = torch.zeros(groups, dtype=v.dtype, device=v.device)
        n = zeros.index_add(0, inverse, torch.ones_like(v))
        m = zeros.index_add(0, inverse, v) / n
        sq = zeros.index_add(0, inverse, (v - m[inverse]) ** 2)
        var = torch.where(n > 1, sq / (n - 1).clamp(min=1), torch.zeros_like(sq))
        mean[ok], std[ok], count[ok] = m[inverse], var.sqrt()[inverse], n[inverse]
    return mean.view_as(values), std.view_as(values), count.view_as(values)


def leave_one_out_mean(values: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-entry mean of the *other* valid entries of its group (RLOO's baseline).

    Returns:
        ``(loo_mean, others)``: the mean over the group without the entry itself, and how
        many entries that mean is over. Where ``others == 0`` (a group of one, or an
        invalid entry) ``loo_mean`` is 0.
    """
    mean, _, count = segment_stats(values, keys, valid)
    others = (count - 1).clamp(min=0)
    loo = torch.where(others > 0, (mean * count - values) / others.clamp(min=1), torch.zeros_like(values))
    if valid is not None:
        loo = torch.where(valid.bool(), loo, torch.zeros_like(loo))
    return loo, others

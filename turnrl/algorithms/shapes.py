"""Shape contracts of the credit and loss functions: a tensor of the wrong shape raises,
naming the function, the tensor and both shapes, instead of broadcasting into a wrong answer
(or a ``gather`` that reads past a row)."""

from __future__ import annotations

import torch

__all__ = ["same_shape"]


def same_shape(where: str, **tensors: torch.Tensor | None) -> None:
    """Raise unless every tensor given (None: not given) has the shape of the first one.

    Args:
        where: The function checking, for the message (e.g. ``"token_gae"``).
        **tensors: Name -> tensor, the reference first (e.g. ``loss_mask=batch.loss_mask``).

    Raises:
        ValueError: ``"token_gae: values has shape [1, 15], loss_mask [1, 12]; they must be
            equal (one value per token of the batch)"``.
    """
    given = [(name, t) for name, t in tensors.items() if t is not None]
    if not given:
        return
    ref_name, ref = given[0]
    for name, t in given[1:]:
        if tuple(t.shape) != tuple(ref.shape):
            raise ValueError(f"{where}: {name} has shape {list(t.shape)}, {ref_name} {list(ref.shape)}; they must be "
                             "equal (one value per token of the batch, [rows, tokens])")

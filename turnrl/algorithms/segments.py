"""Segmented sequences: a trajectory row whose tokens form several sequences the sampler saw.

A template that rewrites history makes an episode go on in a new segment whose prompt is a
fresh render (``turnrl.chat.renderer``). A ``TrainBatch`` keeps one row per episode (credit,
KL and the loss stay per episode) with ``segment_index`` saying which segment each token is in;
``forward_segments`` runs the model on each segment as its own sequence (positions from 0,
attention within the segment) and puts the outputs back in the row's layout. A batch with
one segment per row runs the model once on it, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def segment_index(segment_starts: list[list[int]], lengths: list[int], width: int) -> torch.Tensor:
    """``[N, width]`` long: the segment of each token (0 on padding) of rows whose segments
    begin at ``segment_starts[i]`` and which hold ``lengths[i]`` tokens."""
    out = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, (starts, length) in enumerate(zip(segment_starts, lengths)):
        for k, start in enumerate(starts[1:], start=1):
            out[row, start:length] = k
    return out


def forward_segments(forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], input_ids: torch.Tensor,
                     attention_mask: torch.Tensor, segments: torch.Tensor | None) -> torch.Tensor:
    """``forward`` run on every segment as its own right-padded sequence.

    Args:
        forward: ``(ids [S, L], mask [S, L]) -> [S, L, ...]`` (e.g. a model's logits or hidden
            states).
        input_ids: ``[N, T]`` right-padded rows.
        attention_mask: ``[N, T]``, 1 on real tokens.
        segments: ``[N, T]`` segment of each token, or None (one segment per row).

    Returns:
        ``[N, T, ...]``: at each real token, ``forward``'s output at that token within its own
        segment; 0 on padding when the rows are segmented (``forward``'s own output otherwise).
    """
    if segments is None or not bool((segments[attention_mask.bool()] > 0).any()):
        return causal_forward(forward, input_ids, attention_mask)
    rows, cols = attention_mask.bool().nonzero(as_tuple=True)
    key = rows * (int(segments.max()) + 1) + segments[rows, cols]
    _, packed_row = torch.unique(key, return_inverse=True)  # one packed row per (row, segment), in order
    n_packed = int(packed_row.max()) + 1
    first = torch.full((n_packed,), input_ids.shape[1], dtype=torch.long, device=cols.device)
    first = first.scatter_reduce(0, packed_row, cols, reduce="amin")
    pos = cols - first[packed_row]
    ids = torch.zeros((n_packed, int(pos.max()) + 1), dtype=input_ids.dtype, device=input_ids.device)
    mask = torch.zeros_like(ids)
    ids[packed_row, pos] = input_ids[rows, cols]
    mask[packed_row, pos] = 1
    packed = causal_forward(forward, ids, mask)
    out = packed.new_zeros((*input_ids.shape, *packed.shape[2:]))
    out[rows, cols] = packed[packed_row, pos]
    return out


def causal_forward(forward: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor], input_ids: torch.Tensor,
                   attention_mask: torch.Tensor) -> torch.Tensor:
    """``forward(ids, mask)`` on right-padded rows, run as plain causal attention: the columns
    after the longest row are cut off and the padding mask is left out (``mask=None``).

    With right padding a real token's causal context holds real tokens only, so its output is the
    same with or without the mask (to float rounding); only outputs at padding change, and those
    are zero here. Without a mask, transformers' SDPA attention runs ``is_causal`` (on CPU the
    flash kernel instead of the math one with a materialised ``[N, heads, T, T]`` mask): on
    64 FrozenLake episodes of ~670 tokens padded to 1,064 (the 0.6M model, one thread), one
    learner update took 12.0-13.1 s with the mask, 9.6-9.8 s without it, and 4.0 s without it
    in length-grouped micro-batches of 8,192 tokens (``TrainBatch.micro_batches``), each cut to
    its longest row here. Rows that are not right-padded (a 0 before a 1) keep the mask and
    the width.

    Returns:
        ``[N, T, ...]``: ``forward``'s output at each real token, 0 on cut-off columns.
    """
    lengths = attention_mask.sum(-1)
    width = int(lengths.max()) if len(lengths) else 0
    right_padded = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None] < lengths[:, None]
    if not width or not bool((attention_mask.bool() == right_padded).all()):
        return forward(input_ids, attention_mask)
    out = forward(input_ids[:, :width], None)
    if width == input_ids.shape[1]:
        return out
    return torch.cat([out, out.new_zeros((out.shape[0], input_ids.shape[1] - width, *out.shape[2:]))], dim=1)

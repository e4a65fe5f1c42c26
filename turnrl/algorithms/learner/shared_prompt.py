"""The learner's forward with each prompt that several rows share run once.

A GRPO step scores ``G`` samples of each task, and the samples of one task open with the same
prompt (a system prompt, tool schemas, the task): the plain forward runs the decoder over that
prompt ``G`` times. ``shared_prompt_hidden`` runs each distinct prompt once, keeps its keys
and values, and runs every row's remaining tokens on top of its prompt's (the keys and values
indexed per row, so the gradient of every row flows back into the one prompt forward). On the
TRL tool benchmark's episodes (a 224-token prompt of ~390 tokens, 8 samples) that is about half
of the learner's compute.

Contract: the hidden states at every position from a row's ``start`` on equal the plain
forward's to float rounding (tested, values and gradients), where ``start`` is one before the
row's first scored token (the position that predicts it), so every scored token and the value
of every scored position are unchanged; positions before ``start`` are 0 (nothing reads them).
Rows group by their ids before ``start``. It applies to decoders whose cache is plain
attention layers (``DynamicLayer``), on rows scored as one segment each; anything else, or no
two rows with the same prompt, returns None and the caller runs the plain forward.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from turnrl.algorithms.segments import forward_segments

MIN_SAVED_FRACTION = 0.2
"""Share only when the prompt tokens not run again are at least this fraction of the rows'
tokens: the rows' own tokens then run under an explicit mask (the prompts' keys come first),
which costs more than the plain causal forward's, and a second decoder call."""


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  score_mask: torch.Tensor) -> tuple[torch.Tensor, list[list[int]]]:
    """``(start [N], groups)``: each row's shared length ``start`` (one before its first scored
    token; one before its end when nothing is scored) and the rows grouped by their first ``start``
    ids, each group's rows in order, groups in order of their first row."""
    lengths = attention_mask.sum(-1)
    scored = (score_mask != 0) & (attention_mask != 0)
    first = torch.where(scored.any(-1), scored.to(torch.int8).argmax(-1), lengths)
    start = (first - 1).clamp(min=0)
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, (ids, n) in enumerate(zip(input_ids.tolist(), start.tolist())):
        groups.setdefault(tuple(ids[:n]), []).append(row)
    return start, list(groups.values())


def shared_prompt_hidden(decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         score_mask: torch.Tensor) -> torch.Tensor | None:
    """The decoder's last hidden states ``[N, T, H]`` of right-padded rows, each shared prompt
    run once (module docstring), or None when sharing would save under ``MIN_SAVED_FRACTION``
    of the tokens, the rows are not right-padded or the decoder's cache is not plain attention.

    Args:
        decoder: a transformers decoder stack (``model.get_decoder()``), called with
            ``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values``.
        input_ids: ``[N, T]`` right-padded ids.
        attention_mask: ``[N, T]``, 1 on real tokens (a prefix of each row).
        score_mask: ``[N, T]``, nonzero on the tokens whose logprobs are wanted.
    """
    lengths = attention_mask.sum(-1)
    right_padded = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None] < lengths[:, None]
    if not bool((attention_mask.bool() == right_padded).all()):
        return None
    start, groups = prompt_groups(input_ids, attention_mask, score_mask)
    saved = sum((len(rows) - 1) * int(start[rows[0]]) for rows in groups)
    if not saved or saved < MIN_SAVED_FRACTION * int(lengths.sum()):
        return None
    device, n = input_ids.device, input_ids.shape[0]
    # each group's prompt, right-padded: a real token's causal context holds real tokens only
    width = int(start.max())
    prompts = torch.zeros((len(groups), width), dtype=input_ids.dtype, device=device)
    group_of = torch.empty(n, dtype=torch.long, device=device)
    for g, rows in enumerate(groups):
        prompts[g, :int(start[rows[0]])] = input_ids[rows[0], :int(start[rows[0]])]
        group_of[rows] = g
    past = decoder(input_ids=prompts, use_cache=True).past_key_values
    layers = getattr(past, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    # every row's prompt keys and values, then its own tokens from `start` on, in buckets of
    # rows of similar length (each bucket padded to its own longest row)
    rest = lengths - start
    out = None
    for bucket in suffix_buckets(rest.tolist(), width):
        rows = torch.tensor(bucket, dtype=torch.long, device=device)
        hidden = _suffix_hidden(decoder, layers, group_of[rows], input_ids[rows], start[rows], rest[rows], width)
        if out is None:
            out = hidden.new_zeros((n, input_ids.shape[1], hidden.shape[-1]))
        real = torch.arange(hidden.shape[1], device=device)[None] < rest[rows][:, None]
        at_row, at = real.nonzero(as_tuple=True)
        out = out.index_put((rows[at_row], start[rows][at_row] + at), hidden[at_row, at])
    return out


def _suffix_hidden(decoder, layers, group_of: torch.Tensor, input_ids: torch.Tensor, start: torch.Tensor,
                   rest: torch.Tensor, width: int) -> torch.Tensor:
    """``[R, S, H]``: the decoder over each row's ``rest`` tokens from ``start`` on (``S`` the
    longest), on top of its prompt's keys and values (``layers``: ``[G, kv_heads, width, d]``,
    row ``r``'s prompt ``group_of[r]``, real up to ``start[r]``; cut to these rows' longest)."""
    device = input_ids.device
    cols = torch.arange(int(rest.max()), device=device)
    real = cols[None] < rest[:, None]  # [R, S]
    ids = torch.where(real, input_ids.gather(1, (start[:, None] + cols[None]).clamp(max=input_ids.shape[1] - 1)),
                      torch.zeros_like(input_ids[:, :1]))
    positions = start[:, None] + cols[None]
    width = min(width, int(start.max()))  # these rows' prompts (the others' may be longer)
    prompt_real = torch.arange(width, device=device)[None] < start[:, None]  # [R, width]
    mask = torch.cat([prompt_real, real], dim=1).long()
    cache = DynamicCache(ddp_cache_data=[(layer.keys[group_of, :, :width], layer.values[group_of, :, :width])
                                         for layer in layers])
    return decoder(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True).last_hidden_state


def suffix_buckets(rest: list[int], width: int) -> list[list[int]]:
    """Rows (indices of ``rest``, each row's tokens after the shared prompt) cut into buckets run
    as separate calls, longest rows first, so that one long row does not pad every other.

    A bucket's cost is taken as its rows x its longest row x (``width`` + that row): what its
    attention computes over the prompt's keys and its own (the linear layers save in proportion
    to the rows x longest). Rows sorted longest first split at the point that costs least, then
    the second part again, while a split saves at least ``MIN_SPLIT_SAVING`` of its part's cost
    (a call costs overhead too)."""
    order = sorted(range(len(rest)), key=lambda r: -rest[r])

    def cost(rows: list[int]) -> int:
        return len(rows) * rest[rows[0]] * (width + rest[rows[0]])

    buckets, part = [], order
    while len(part) > 1:
        whole = cost(part)
        split, best = min(((k, cost(part[:k]) + cost(part[k:])) for k in range(1, len(part))), key=lambda kv: kv[1])
        if best > (1 - MIN_SPLIT_SAVING) * whole:
            break
        buckets.append(part[:split])
        part = part[split:]
    return buckets + [part]


MIN_SPLIT_SAVING = 0.25
"""``suffix_buckets`` splits a bucket only when that saves this fraction of its cost."""


def decoder_hidden(decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor, score_mask: torch.Tensor,
                   segments: torch.Tensor | None, share_prompts: bool = True) -> torch.Tensor:
    """``[N, T, H]`` hidden states of ``decoder`` for the scored positions' predictions:
    ``shared_prompt_hidden`` on unsegmented rows when it applies, else the plain forward
    (``turnrl.algorithms.segments.forward_segments``). Right at every position from one before
    each row's first scored token on."""
    one_segment = segments is None or not bool((segments[attention_mask.bool()] > 0).any())
    if share_prompts and one_segment:
        hidden = shared_prompt_hidden(decoder, input_ids, attention_mask, score_mask)
        if hidden is not None:
            return hidden
    return forward_segments(
        lambda ids, mask: decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state,
        input_ids, attention_mask, segments)

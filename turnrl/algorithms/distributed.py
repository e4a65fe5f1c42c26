"""Process-group helpers for training under ``accelerate launch`` (DDP): how a global batch
is split into minibatches and sharded across processes, and the few collectives the learner
needs so that N processes give the same update as one.

Contract of the sharded update: every process holds a disjoint shard of the global batch's
rows; minibatch ``m`` of the global batch is the union of every process's local minibatch
``m`` (``minibatch_splits`` of its shard). ``shard_rows`` shards a global batch so that this
union is exactly the single-process minibatch ``m``; shards made any other way (e.g. each rank
collecting its own rollouts) are still normalised globally, only the minibatch partition differs.

The collectives use ``torch.distributed`` directly (accelerate sets up the process group:
gloo on CPU, nccl on GPU); with no initialised group, or one process, they are identities.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


LOCAL_PROCESSES_ENV = "TURNRL_LOCAL_PROCESSES"
"""Set by a launcher of several turnrl processes on one machine (the suite's workers) to their
count; ``accelerate launch``/``torchrun`` set ``LOCAL_WORLD_SIZE`` instead."""


def local_processes() -> int:
    """Processes sharing this machine's cores: ``TURNRL_LOCAL_PROCESSES`` (the suite's workers),
    else ``LOCAL_WORLD_SIZE`` (``accelerate launch``, ``torchrun``), else 1. The suite's count
    comes first: it is set by the launcher nearest the process, and a ``LOCAL_WORLD_SIZE`` may
    be left in the environment by something else (an in-process vLLM engine sets it to 1)."""
    for name in (LOCAL_PROCESSES_ENV, "LOCAL_WORLD_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) >= 1:
            return int(value)
    return 1


def torch_threads(setting: int | None) -> int | None:
    """The torch CPU threads of ``trainer.threads=setting``: None gives this process its share
    of the cores it may run on (``max(1, cores // local_processes())``, so N processes on one
    machine do not oversubscribe it); 0 gives None (leave torch's default); n > 0 gives n."""
    if setting is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, cores // local_processes())
    return setting or None


def set_torch_threads(setting: int | None) -> None:
    """``torch.set_num_threads(torch_threads(setting))`` unless that is None."""
    threads = torch_threads(setting)
    if threads is not None:
        torch.set_num_threads(threads)


def world_size() -> int:
    """Processes in the default group (1 when none is initialised)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def minibatch_splits(n: int, num_minibatches: int) -> list[torch.Tensor]:
    """Row indices of the minibatches of an ``n``-row batch: ``num_minibatches`` contiguous
    pieces whose sizes differ by at most one (larger first); pieces may be empty when
    ``n < num_minibatches`` (a process's shard can be smaller than the minibatch count)."""
    if num_minibatches < 1:
        raise ValueError(f"num_minibatches must be >= 1, got {num_minibatches}")
    return list(torch.arange(n).tensor_split(num_minibatches))


def shard_rows(n: int, num_minibatches: int, num_processes: int, rank: int) -> torch.Tensor:
    """The rows of an ``n``-row global batch that process ``rank`` trains on.

    Each global minibatch (``minibatch_splits(n, min(num_minibatches, n))``) is split into
    ``num_processes`` contiguous parts and the process takes part ``rank`` of each, in
    minibatch order. ``minibatch_splits`` of the returned shard then gives back exactly those
    parts, so every optimizer step sees the same rows as in one process.

    Raises:
        ValueError: On a rank outside ``[0, num_processes)`` or non-positive sizes.
    """
    if n < 1 or num_processes < 1:
        raise ValueError(f"need n >= 1 and num_processes >= 1, got n={n}, num_processes={num_processes}")
    if not 0 <= rank < num_processes:
        raise ValueError(f"rank must be in [0, {num_processes}), got {rank}")
    parts = [rows.tensor_split(num_processes)[rank] for rows in minibatch_splits(n, min(num_minibatches, n))]
    return torch.cat(parts)


def shard_list(items: Sequence[T], num_processes: int, rank: int) -> list[T]:
    """Process ``rank``'s share of ``items`` (e.g. the rollout tasks of a step), contiguous,
    sizes differing by at most one; whole items, so a task's group of samples stays on one
    process (group-relative advantages need the whole group)."""
    if not 0 <= rank < num_processes:
        raise ValueError(f"rank must be in [0, {num_processes}), got {rank}")
    bounds = torch.arange(len(items)).tensor_split(num_processes)[rank]
    return [items[i] for i in bounds.tolist()]


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``tensor`` reduced over processes (``"sum"``, ``"max"`` or ``"min"``), a new tensor."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if op not in ops:
        raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
    out = tensor.detach().clone()
    if world_size() > 1:
        dist.all_reduce(out, op=ops[op])
    return out


def all_gather_rows(values: torch.Tensor, pad: float = -1.0) -> list[torch.Tensor]:
    """Every process's 1-D ``values`` (lengths may differ), in rank order."""
    if world_size() == 1:
        return [values]
    length = torch.tensor([values.numel()], device=values.device)
    lengths = [torch.zeros_like(length) for _ in range(world_size())]
    dist.all_gather(lengths, length)
    width = int(max(int(x) for x in lengths))
    padded = torch.full((width,), pad, dtype=values.dtype, device=values.device)
    padded[: values.numel()] = values
    gathered = [torch.empty_like(padded) for _ in range(world_size())]
    dist.all_gather(gathered, padded)
    return [g[: int(k)] for g, k in zip(gathered, lengths)]


def global_weights(aggregate: Callable[..., torch.Tensor], mask: torch.Tensor,
                   turn_index: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token loss weights of this process's rows as if ``aggregate`` ran on the loss mask
    (and the turns) of the whole global minibatch.

    Only the other processes' per-row token counts (and, given ``turn_index``, turn counts) are
    exchanged: they stand in as left-aligned rows of ones, a row of ``c`` tokens and ``m`` turns
    holding ``m - 1`` turns of one token and one of the rest. That is exact for every
    aggregation whose weights for a row depend on the other rows only through their token and
    turn counts (all of ``turnrl.algorithms.losses.aggregation``: the global token count of
    token-mean, the number of non-empty rows of the seq-mean modes, the longest row of
    seq-mean-token-sum-norm, the number of turns of turn-mean).

    Args:
        aggregate: an aggregation mode (``(mask [N, T], turn_index [N, T] or None) -> weights [N, T]``).
        mask: ``[n, T]`` this process's loss mask of the minibatch (``n`` may be 0).
        turn_index: ``[n, T]`` the turn of each of its tokens (-1 off turns), or None.

    Returns:
        ``[n, T]`` weights; summed with the other processes' they are the single-process loss.
    """
    if world_size() == 1:
        return aggregate(mask, turn_index)
    rank = dist.get_rank()
    counts = all_gather_rows(mask.sum(dim=1))
    others = torch.cat([c for r, c in enumerate(counts) if r != rank])
    width = max(mask.shape[1], int(others.max().item()) if others.numel() else 0)
    position = torch.arange(width, device=mask.device)[None, :]
    stand_in = (position < others[:, None]).to(mask.dtype)
    full = torch.cat([torch.nn.functional.pad(mask, (0, width - mask.shape[1])), stand_in])
    full_turns = None
    if turn_index is not None:
        on = (mask != 0) & (turn_index >= 0)
        k = int(turn_index.max()) + 1 if turn_index.numel() else 1
        seen = torch.zeros(mask.shape[0], max(k, 1), dtype=torch.bool, device=mask.device)
        seen[torch.nonzero(on, as_tuple=True)[0], turn_index[on]] = True
        turns = all_gather_rows(seen.sum(dim=1).to(mask.dtype))
        other_turns = torch.cat([m for r, m in enumerate(turns) if r != rank]).long()
        stand_in_turns = torch.minimum(position, (other_turns[:, None] - 1).clamp(min=0))
        stand_in_turns = torch.where(stand_in > 0, stand_in_turns, torch.full_like(stand_in_turns, -1))
        full_turns = torch.cat([torch.nn.functional.pad(turn_index, (0, width - mask.shape[1]), value=-1),
                                stand_in_turns])
    return aggregate(full, full_turns)[: mask.shape[0], : mask.shape[1]]

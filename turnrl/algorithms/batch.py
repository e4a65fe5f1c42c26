"""Collates trajectories into right-padded tensors for the learner."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turnrl.algorithms.anchors import anchor_index
from turnrl.algorithms.segments import segment_index
from turnrl.rollout.trajectory import Trajectory


@dataclass
class TrainBatch:
    """Padded tensors of ``N`` trajectories, ``T`` = longest trajectory.

    Attributes:
        input_ids: ``[N, T]`` long, right-padded with ``pad_id``.
        attention_mask: ``[N, T]`` long, 1 on real tokens.
        loss_mask: ``[N, T]`` float, 1 on sampled tokens only.
        old_logprobs: ``[N, T]`` float, the sampler's logprobs (0 off the loss mask).
        turn_index: ``[N, T]`` long, index of the assistant turn a sampled token belongs to;
            -1 on every other token.
        rewards: ``[N]`` float, each trajectory's return (sum of turn rewards).
        group_index: ``[N]`` long, trajectories of one task share an index.
        turn_rewards: ``[N, K]`` float, per-turn rewards, 0-padded to the most turns ``K``.
        num_turns: ``[N]`` long.
        state_index: ``[N, K]`` long, the anchor group of each turn's start state
            (``turnrl.algorithms.anchors``; equal ids = the same state within a task's
            group); -1 for turns without a state key and padded turns.
        values: ``[N, T]`` float, the critic's value of the state before each sampled token
            (0 elsewhere), set by the trainer for critic-based estimators; None otherwise.
        segment_index: ``[N, T]`` long, the segment of each token (``Trajectory.segment_starts``;
            0 throughout for one segment, and on padding): the model scores each segment as its
            own sequence (``turnrl.algorithms.segments``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    turn_index: torch.Tensor
    rewards: torch.Tensor
    group_index: torch.Tensor
    turn_rewards: torch.Tensor
    num_turns: torch.Tensor
    state_index: torch.Tensor
    values: torch.Tensor | None = None
    segment_index: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> "TrainBatch":
        """The same batch on ``device``."""
        return TrainBatch(**{k: None if v is None else v.to(device) for k, v in vars(self).items()})

    def rows(self, index: slice | torch.Tensor) -> "TrainBatch":
        """The sub-batch of the given rows (for micro-batching)."""
        return TrainBatch(**{k: None if v is None else v[index] for k, v in vars(self).items()})

    def micro_batches(self, rows: torch.Tensor, max_rows: int, max_tokens: int | None = None) -> list[torch.Tensor]:
        """``rows`` (indices into this batch) split into micro-batches of rows of similar length.

        The rows are sorted longest first and cut into runs of at most ``max_rows`` rows and,
        with ``max_tokens``, at most that many padded tokens (its rows times its longest row: what
        a forward over it computes, since the learner cuts each micro-batch to its longest row);
        a row longer than ``max_tokens`` goes alone. So a batch of ragged episodes pads each
        micro-batch to its own longest row, not every row to the batch's longest, and the
        forward's memory is bounded by ``max_tokens`` whatever the batch size. Of the cuts with
        the fewest micro-batches (forward and backward calls), the one with the fewest padded
        tokens (``_cut``): one long episode among short ones goes alone rather than padding as
        many others as fit to its length. Returns index tensors on ``rows``' device, together
        holding every row once.
        """
        if not len(rows):
            return []
        lengths, index = torch.sort(self.attention_mask[rows].sum(-1), descending=True, stable=True)
        return list(rows[index.to(rows.device)].split(_cut(lengths.tolist(), max_rows, max_tokens)))


def _cut(lengths: list[int], max_rows: int, max_tokens: int | None) -> list[int]:
    """The sizes of consecutive runs of ``lengths`` (sorted longest first) that make the fewest
    runs and, among those, the fewest padded tokens (a run's size times its first length); a run
    holds at most ``max_rows`` rows and, past one row, at most ``max_tokens`` padded tokens.
    Dynamic programming over where each run ends: ``O(len(lengths) * max_rows)`` steps."""
    n, max_rows = len(lengths), max(max_rows, 1)  # (a row always fits alone)
    best: list[tuple[int, int]] = [(0, 0)] + [(n + 1, 0)] * n  # (runs, padded tokens) of the first `end` rows
    begins = [0] * (n + 1)
    for end in range(1, n + 1):
        for begin in range(end - 1, max(end - max_rows, 0) - 1, -1):
            padded = (end - begin) * lengths[begin]  # grows as the run starts earlier: stop at the budget
            if end - begin > 1 and max_tokens is not None and padded > max_tokens:
                break
            runs, tokens = best[begin]
            if (runs + 1, tokens + padded) < best[end]:
                best[end], begins[end] = (runs + 1, tokens + padded), begin
    sizes, end = [], n
    while end:
        sizes.append(end - begins[end])
        end = begins[end]
    return sizes[::-1]


def collate(trajectories: list[Trajectory], pad_id: int, state_similarity: float | None = None) -> TrainBatch:
    """Stack trajectories into a ``TrainBatch`` (right padding).

    Args:
        trajectories: the batch.
        pad_id: id written into padding positions.
        state_similarity: anchor grouping of state keys (``anchors.anchor_index``): None
            for exact matches only.
    """
    if not trajectories:
        raise ValueError("cannot collate an empty list of trajectories")
    n = len(trajectories)
    width = max(len(t.token_ids) for t in trajectories)
    k_max = max(1, max(t.num_turns for t in trajectories))
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width))
    old_logprobs = torch.zeros((n, width))
    turn_index = torch.full((n, width), -1, dtype=torch.long)
    turn_rewards = torch.zeros((n, k_max))
    for row, traj in enumerate(trajectories):
        length = len(traj.token_ids)
        input_ids[row, :length] = torch.tensor(traj.token_ids, dtype=torch.long)
        attention_mask[row, :length] = 1
        loss_mask[row, :length] = torch.tensor(traj.loss_mask, dtype=torch.float)
        old_logprobs[row, :length] = torch.tensor(traj.logprobs, dtype=torch.float)
        for k, (start, end) in enumerate(traj.turn_spans):
            turn_index[row, start:end] = k
        turn_rewards[row, : traj.num_turns] = torch.tensor(traj.turn_rewards, dtype=torch.float)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        turn_index=turn_index,
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float),
        group_index=torch.tensor([t.group_id for t in trajectories], dtype=torch.long),
        turn_rewards=turn_rewards,
        num_turns=torch.tensor([t.num_turns for t in trajectories], dtype=torch.long),
        state_index=anchor_index(trajectories, k_max, state_similarity),
        segment_index=segment_index([t.segment_starts for t in trajectories], [len(t.token_ids) for t in trajectories],
                                    width),
    )

"""Collates trajectories into right-padded tensors for the learner.

Episodes the infrastructure ended (``turnrl.rollout.termination.is_infra_failure``: an env
or tool that crashed, a step past its deadline) say nothing about the policy. Under the
``drop`` and ``refill`` policies (``trainer.infra_failures``, the default ``drop``) ``collate``
keeps their rows, for shapes and logs, but makes them absent to everything that trains
(``TrainBatch.excluded``): no sampled tokens (``loss_mask`` 0: no loss, no whitening, no
aggregation count), a group of their own (no group mean, std or leave-one-out baseline sees
their reward), no anchor states (the others' anchor ids numbered as if they were not there),
and the learner leaves them out of its minibatches. So every advantage and the update equal
those of the batch without them. ``keep`` stacks them like any other episode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turnrl.algorithms.anchors import NO_ANCHOR, anchor_index
from turnrl.algorithms.segments import segment_index
from turnrl.rollout.termination import INFRA_FAILURE_POLICIES, is_infra_failure
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
        excluded: ``[N]`` bool, rows that must not train (infrastructure failures under
            ``collate(infra_failures="drop" | "refill")``), or None for none. ``collate`` has
            already made such a row inert for every estimator (``loss_mask`` 0, a group of
            its own, ``state_index`` -1); the flag is for code that counts rows (the
            learner's minibatches, the critic's micro-batches).
        token_penalty: ``[N, T]`` float, the reward penalty of each sampled token (0
            elsewhere) that ``turn_rewards`` and ``rewards`` already include, summed per turn
            and per row: ``kl_coef * KL`` when the KL is in the reward
            (``turnrl.algorithms.kl_control.kl_penalized``); None for no penalty (the same as
            zeros). Token-level estimators (REINFORCE++) read it to place each token's
            penalty on the token itself.
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
    excluded: torch.Tensor | None = None
    token_penalty: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> "TrainBatch":
        """The same batch on ``device``."""
        return TrainBatch(**{k: None if v is None else v.to(device) for k, v in vars(self).items()})

    def rows(self, index: slice | torch.Tensor) -> "TrainBatch":
        """The sub-batch of the given rows (for micro-batching)."""
        return TrainBatch(**{k: None if v is None else v[index] for k, v in vars(self).items()})

    def trained_rows(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The indices among ``rows`` (default: every row, ``arange(N)``) that are not
        ``excluded``, in order, on ``rows``' device."""
        rows = torch.arange(len(self)) if rows is None else rows
        if self.excluded is None:
            return rows
        return rows[~self.excluded.to(rows.device)[rows]]

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


def collate(trajectories: list[Trajectory], pad_id: int, state_similarity: float | None = None,
            infra_failures: str = "drop") -> TrainBatch:
    """Stack trajectories into a ``TrainBatch`` (right padding).

    Args:
        trajectories: the batch.
        pad_id: id written into padding positions.
        state_similarity: anchor grouping of state keys (``anchors.anchor_index``): None
            for exact matches only.
        infra_failures: what to do with an episode the infrastructure ended
            (``turnrl.rollout.termination.INFRA_FAILURE_POLICIES``). ``"drop"`` and
            ``"refill"`` (whose collector has already sampled failures again once; what still
            failed is dropped): the row is ``excluded``, with ``loss_mask`` 0, a
            ``group_index`` no other row has and ``state_index`` -1 on every turn, and the
            other rows' anchor ids are those of the batch without it; its tokens, rewards and
            turns stay as they were. ``"keep"``: stacked like any episode, with the reward
            it got.

    Raises:
        ValueError: On an empty list, or an ``infra_failures`` that is not one of the policies.
    """
    if not trajectories:
        raise ValueError("cannot collate an empty list of trajectories")
    if infra_failures not in INFRA_FAILURE_POLICIES:
        raise ValueError(f"infra_failures={infra_failures!r} is not one of {list(INFRA_FAILURE_POLICIES)}; "
                         "pass one of them (trainer.infra_failures in a run's config)")
    n = len(trajectories)
    dropped = [infra_failures != "keep" and is_infra_failure(t.termination) for t in trajectories]
    width = max(1, max(len(t.token_ids) for t in trajectories))  # (an episode failed at reset has no token)
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
        if not dropped[row]:  # a dropped row keeps no sampled token
            loss_mask[row, :length] = torch.tensor(traj.loss_mask, dtype=torch.float)
        old_logprobs[row, :length] = torch.tensor(traj.logprobs, dtype=torch.float)
        for k, (start, end) in enumerate(traj.turn_spans):
            turn_index[row, start:end] = k
        turn_rewards[row, : traj.num_turns] = torch.tensor(traj.turn_rewards, dtype=torch.float)
    group_ids = [t.group_id for t in trajectories]
    alone = max(group_ids) + 1  # a dropped row's own group: ids no trajectory has
    for row in range(n):
        if dropped[row]:
            group_ids[row], alone = alone, alone + 1
    kept = [row for row in range(n) if not dropped[row]]
    state_index = torch.full((n, k_max), NO_ANCHOR, dtype=torch.long)
    if kept:  # numbered over the kept rows alone: the ids of the batch without the dropped ones
        state_index[kept] = anchor_index([trajectories[row] for row in kept], k_max, state_similarity)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        turn_index=turn_index,
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float),
        group_index=torch.tensor(group_ids, dtype=torch.long),
        turn_rewards=turn_rewards,
        num_turns=torch.tensor([t.num_turns for t in trajectories], dtype=torch.long),
        state_index=state_index,
        segment_index=segment_index([t.segment_starts for t in trajectories], [len(t.token_ids) for t in trajectories],
                                    width),
        excluded=torch.tensor(dropped, dtype=torch.bool),
    )

"""Anchor states: which turns of a task's group start from the same env state (GiGPO).

Each turn ``k`` of a trajectory starts from the env state ``state_keys[k]`` (the env's
``info["state_key"]``). Turns of one group (the G samples of a task) whose keys are equal
form an anchor group; optionally, keys whose text is similar enough join one group too.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from difflib import SequenceMatcher

import torch

from turnrl.rollout.trajectory import Trajectory

NO_ANCHOR = -1
"""Index of a turn without a state key (or a padded turn): it belongs to no anchor group."""


def anchor_index(trajectories: Sequence[Trajectory], k_max: int, similarity: float | None = None) -> torch.Tensor:
    """Number the anchor groups of a batch.

    Args:
        trajectories: the batch; ``group_id`` and ``state_keys`` are used.
        k_max: width of the result (the most turns in the batch).
        similarity: None groups exact key matches only. A float in ``(0, 1]`` also merges
            keys whose ``repr`` strings have a ``difflib.SequenceMatcher`` ratio of at least
            this much with a group's first key (greedy, in batch order, within a task's
            group only), for envs whose states rarely repeat exactly (text observations).

    Returns:
        ``[N, k_max]`` long: equal values mark turns of one anchor group; ``NO_ANCHOR``
        where a turn has no key (None) or does not exist.
    """
    if similarity is not None and not 0.0 < similarity <= 1.0:
        raise ValueError(f"similarity must be None or in (0, 1], got {similarity}")
    index = torch.full((len(trajectories), k_max), NO_ANCHOR, dtype=torch.long)
    exact: dict[tuple[int, Hashable], int] = {}
    representatives: dict[int, list[tuple[str, int]]] = {}  # group_id -> [(repr of first key, anchor id)]
    for row, traj in enumerate(trajectories):
        for k in range(min(traj.num_turns, len(traj.state_keys), k_max)):
            key = traj.state_keys[k]
            if key is None:
                continue
            anchor = exact.get((traj.group_id, key))
            if anchor is None:
                anchor = _similar(repr(key), representatives.get(traj.group_id, []), similarity)
                if anchor is None:
                    anchor = len(exact)
                    representatives.setdefault(traj.group_id, []).append((repr(key), anchor))
                exact[(traj.group_id, key)] = anchor
            index[row, k] = anchor
    return index


def _similar(text: str, candidates: list[tuple[str, int]], similarity: float | None) -> int | None:
    if similarity is None:
        return None
    for other, anchor in candidates:
        if SequenceMatcher(None, text, other).ratio() >= similarity:
            return anchor
    return None

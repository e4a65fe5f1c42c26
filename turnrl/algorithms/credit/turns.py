"""Per-turn tensors: discounted turn returns and the broadcast of per-turn values to tokens.

Shapes: ``N`` trajectories, ``K`` the most assistant turns in the batch, ``T`` tokens.
Rewards live on turns (the env rewards a whole assistant turn), so returns are computed
over turns, never over tokens: the observation and tool tokens between two turns carry no
loss and cannot cut a return short, a bug class where token-level recursions reset at
masked positions.
"""

from __future__ import annotations

import torch


def turn_valid(num_turns: torch.Tensor, k_max: int) -> torch.Tensor:
    """``[N, K]`` bool: turn ``k`` exists in row ``i`` (``k < num_turns[i]``)."""
    return torch.arange(k_max, device=num_turns.device)[None, :] < num_turns[:, None]


def discounted_turn_returns(turn_rewards: torch.Tensor, num_turns: torch.Tensor, gamma: float = 1.0
                            ) -> torch.Tensor:
    """``G_k = r_k + gamma * G_{k+1}`` over each row's own turns, ``G`` = 0 past the last.

    A truncated episode (turn limit, context length, env error) is treated as ended: there
    is no value to bootstrap from, so its return is what it got.

    Args:
        turn_rewards: ``[N, K]`` float, 0-padded.
        num_turns: ``[N]`` long.
        gamma: turn discount in ``[0, 1]``.

    Returns:
        ``[N, K]`` returns, 0 on padded turns.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    valid = turn_valid(num_turns, turn_rewards.shape[1])
    rewards = turn_rewards * valid
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for k in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, k] + gamma * running
        returns[:, k] = running
    return returns * valid


def turns_to_tokens(per_turn: torch.Tensor, turn_index: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Give every sampled token the value of its turn.

    Args:
        per_turn: ``[N, K]`` float.
        turn_index: ``[N, T]`` long, the turn of each sampled token, -1 elsewhere.
        loss_mask: ``[N, T]`` float.

    Returns:
        ``[N, T]``: ``per_turn[i, turn_index[i, t]]`` on sampled tokens, 0 elsewhere.
    """
    if per_turn.shape[1] == 0:
        return torch.zeros_like(loss_mask)
    gathered = per_turn.gather(1, turn_index.clamp(min=0))
    return torch.where(turn_index >= 0, gathered, torch.zeros_like(gathered)) * loss_mask


def earlier_in_turn(token_values: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """For each turn token, the sum of ``token_values`` over the tokens of its own turn before it.

    Turns occupy increasing positions of a row (turn ``k``'s tokens all come before turn
    ``k + 1``'s), which is how a trajectory is laid out.

    Args:
        token_values: ``[N, T]`` float (read on tokens with ``turn_index >= 0`` only).
        turn_index: ``[N, T]`` long, the turn of each sampled token, -1 elsewhere.

    Returns:
        ``[N, T]`` in the values' dtype, 0 where ``turn_index`` is -1.
    """
    on = turn_index >= 0
    values = torch.where(on, token_values, torch.zeros_like(token_values))
    before = values.cumsum(dim=1) - values  # every turn token before t in the row
    k_max = int(turn_index.max()) + 1 if on.any() else 1
    index = turn_index.clamp(min=0)
    per_turn = torch.zeros(values.shape[0], k_max, dtype=values.dtype, device=values.device).scatter_add_(1, index, values)
    earlier_turns = per_turn.cumsum(dim=1) - per_turn  # the tokens of the turns before k
    return torch.where(on, before - earlier_turns.gather(1, index), torch.zeros_like(values))

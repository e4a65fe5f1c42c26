"""Generalised advantage estimation over sampled tokens, at token level and over turns.

Shapes: ``N`` trajectories, ``T`` tokens, ``K`` turns. ``values [N, T]`` is the critic's
``V`` of the state before each sampled token (aligned like the logprobs: position ``t`` is
predicted from the tokens ``< t``), 0 elsewhere.

The recursions run over the *sampled* tokens of a trajectory in order, skipping the prompt,
template and observation tokens between turns: those are the env's transition, not steps of
the policy, so they neither carry loss nor cut a recursion short (frameworks that run GAE
over every position and reset at masked tokens lose the credit that crosses a turn). The
reward of turn ``k`` sits on that turn's last sampled token (``token_rewards``). The last
sampled token of a trajectory is terminal: truncated episodes have no next state to
bootstrap from, so their value target is what they got.
"""

from __future__ import annotations

import torch

from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.shapes import same_shape
from turnrl.algorithms.credit.turns import turn_valid


def pack(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of the sampled tokens, packed left: ``(cols [N, L], valid [N, L])``.

    ``cols[i, j]`` is the column of row ``i``'s ``j``-th sampled token (0 where invalid),
    ``L`` the most sampled tokens in a row.
    """
    counts = mask.sum(dim=1).long()
    width = int(counts.max()) if counts.numel() else 0
    order = torch.argsort((mask == 0).to(torch.int8), dim=1, stable=True)[:, :width]
    valid = torch.arange(width, device=mask.device)[None, :] < counts[:, None]
    return torch.where(valid, order, torch.zeros_like(order)), valid


def token_rewards(batch: TrainBatch) -> torch.Tensor:
    """``[N, T]``: each turn's reward on the last sampled token of that turn (a turn without
    sampled tokens passes its reward to the last sampled token before it; with none, it is
    dropped)."""
    out = torch.zeros_like(batch.loss_mask)
    cols, valid = pack(batch.loss_mask)
    if cols.shape[1] == 0:
        return out
    n, k_max = batch.turn_rewards.shape
    turn_of = torch.where(valid, batch.turn_index.gather(1, cols), torch.full_like(cols, k_max)).clamp(max=k_max)
    position = torch.arange(cols.shape[1], device=cols.device).expand_as(cols)
    # the last packed token of each turn (-1: none), then of each turn or an earlier one
    last = torch.full((n, k_max + 1), -1, dtype=torch.long, device=cols.device)
    last = last.scatter_reduce(1, turn_of, position, "amax")[:, :k_max]
    last = last.cummax(dim=1).values
    has = (last >= 0) & turn_valid(batch.num_turns, k_max)
    target = cols.gather(1, last.clamp(min=0))
    rewards = torch.where(has, batch.turn_rewards, torch.zeros_like(batch.turn_rewards)).to(out.dtype)
    return out.scatter_add(1, target, rewards)


def _recursion(rewards: torch.Tensor, values: torch.Tensor, valid: torch.Tensor,
               gamma: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """Backward GAE over packed ``[N, L]`` tensors with per-step gamma and lambda."""
    adv = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])  # (L may be 0: a batch without sampled tokens)
    running = rewards.new_zeros(rewards.shape[0])
    for j in range(rewards.shape[1] - 1, -1, -1):
        live = valid[:, j]
        delta = rewards[:, j] + gamma[:, j] * next_value - values[:, j]
        running = torch.where(live, delta + gamma[:, j] * lam[:, j] * running, running)
        adv[:, j] = torch.where(live, running, torch.zeros_like(running))
        next_value = torch.where(live, values[:, j], next_value)
    return adv


def _unpack(packed: torch.Tensor, cols: torch.Tensor, valid: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    rows = torch.arange(like.shape[0], device=like.device)[:, None].expand_as(cols)
    out[rows[valid], cols[valid]] = packed[valid]
    return out


def token_gae(batch: TrainBatch, values: torch.Tensor, gamma: float = 1.0, lam: float = 0.95) -> torch.Tensor:
    """Token-level GAE: ``delta_j = r_j + gamma V_{j+1} - V_j``, ``A_j = delta_j + gamma lam A_{j+1}``
    over the sampled tokens ``j`` of each row (``V`` past the last = 0).

    Returns:
        ``[N, T]`` advantages (0 off the loss mask); ``A + values`` are the lambda-returns.

    Raises:
        ValueError: If ``values`` is not ``[N, T]``, the loss mask's shape.
    """
    same_shape("token_gae", loss_mask=batch.loss_mask, values=values)
    cols, valid = pack(batch.loss_mask)
    r = token_rewards(batch).gather(1, cols) * valid
    v = values.gather(1, cols) * valid
    g = torch.full_like(r, gamma)
    lam_t = torch.full_like(r, lam)
    return _unpack(_recursion(r, v, valid, g, lam_t), cols, valid, batch.loss_mask)


def turn_level_gae(batch: TrainBatch, values: torch.Tensor, gamma: float = 1.0, lam: float = 0.95,
                   token_lam: float = 1.0) -> torch.Tensor:
    """Bi-level GAE: GAE over turns with a turn-level value, then token-level inside each turn.

    * Turn level: ``V_k`` = the value at turn ``k``'s first sampled token (the state the turn
      starts from); ``delta_k = r_k + gamma V_{k+1} - V_k`` (``V`` past the last turn = 0);
      ``A^turn_k = delta_k + gamma lam A^turn_{k+1}``; turn target ``G_k = A^turn_k + V_k``.
    * Token level inside turn ``k``: no discount; the turn's last token bootstraps from
      ``G_k``: ``delta_last = G_k - V_last``, ``delta_j = V_{j+1} - V_j`` otherwise, and
      ``A_j = delta_j + token_lam A_{j+1}`` within the turn. With ``token_lam = 1`` every
      token gets ``A_j = G_k - V_j``.

    Turns without sampled tokens have no value; they are skipped (their reward moves to the
    previous turn's last token, as in ``token_rewards``).

    Returns:
        ``[N, T]`` advantages (0 off the loss mask).

    Raises:
        ValueError: If ``values`` is not ``[N, T]``, the loss mask's shape.
    """
    same_shape("turn_level_gae", loss_mask=batch.loss_mask, values=values)
    cols, valid = pack(batch.loss_mask)
    n, width = cols.shape
    v = values.gather(1, cols) * valid
    r = token_rewards(batch).gather(1, cols) * valid
    turn_of = torch.where(valid, batch.turn_index.gather(1, cols), torch.full_like(cols, -1))
    first = valid & torch.cat([torch.ones_like(valid[:, :1]), turn_of[:, 1:] != turn_of[:, :-1]], dim=1)
    last = valid & torch.cat([turn_of[:, 1:] != turn_of[:, :-1], torch.ones_like(valid[:, :1])], dim=1)
    last = last & valid
    # turn level: one step per turn, packed by turn start
    turn_r = torch.zeros_like(r)
    turn_id = first.long().cumsum(dim=1) - 1  # packed turn number of each token
    turn_id = torch.where(valid, turn_id, torch.zeros_like(turn_id))
    turn_r.scatter_add_(1, turn_id, r)  # rewards of a turn (they sit on its last token)
    n_turns = first.sum(dim=1)
    turn_valid_mask = torch.arange(width, device=cols.device)[None, :] < n_turns[:, None]
    start_pos = torch.where(first, torch.arange(width, device=cols.device)[None, :], torch.full_like(cols, width))
    start_pos = start_pos.sort(dim=1).values.clamp(max=max(width - 1, 0))
    turn_v = v.gather(1, start_pos) * turn_valid_mask
    g = torch.full_like(turn_r, gamma)
    lam_t = torch.full_like(turn_r, lam)
    turn_adv = _recursion(turn_r * turn_valid_mask, turn_v, turn_valid_mask, g, lam_t)
    target = (turn_adv + turn_v).gather(1, turn_id) * valid  # G_k for every token of turn k
    # token level within each turn
    next_v = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1)
    delta = torch.where(last, target - v, next_v - v) * valid
    adv = torch.zeros_like(delta)
    running = delta.new_zeros(n)
    for j in range(width - 1, -1, -1):
        running = torch.where(last[:, j], delta[:, j], delta[:, j] + token_lam * running)
        adv[:, j] = torch.where(valid[:, j], running, torch.zeros_like(running))
    return _unpack(adv, cols, valid, batch.loss_mask)

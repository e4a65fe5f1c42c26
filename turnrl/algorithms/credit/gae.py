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

Three estimators work over turns, and differ in where a turn's value is read and what the
tokens of a turn get:

* ``turn_level_gae`` (``turn_gae``): the value at the turn's first sampled token, then GAE
  inside the turn from its return;
* ``bilevel_gae``: RAGEN's bi-level GAE as published, the value at the turn's last sampled
  token, then GAE inside the turn from its return;
* ``turn_mdp_gae`` (Turn-PPO's): the value at the turn's first sampled token, and every token
  of the turn gets the turn's advantage.
"""

from __future__ import annotations

from typing import NamedTuple

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


class _Turns(NamedTuple):
    """A batch's sampled tokens packed left (``[N, L]``, as ``pack``) with their turns."""

    cols: torch.Tensor  # column of each packed token
    valid: torch.Tensor  # a sampled token
    v: torch.Tensor  # its value
    r: torch.Tensor  # its reward (a turn's reward on its last token)
    first: torch.Tensor  # the first sampled token of its turn
    last: torch.Tensor  # the last sampled token of its turn
    turn_id: torch.Tensor  # the packed number of its turn (turns without sampled tokens skipped)
    turn_r: torch.Tensor  # [N, L] by packed turn: the turn's reward
    turn_live: torch.Tensor  # [N, L] by packed turn: the turn exists


def _turns(batch: TrainBatch, values: torch.Tensor) -> _Turns:
    """The packed sampled tokens of ``batch`` with their values, rewards and turn structure."""
    cols, valid = pack(batch.loss_mask)
    width = cols.shape[1]
    v = values.gather(1, cols) * valid
    r = token_rewards(batch).gather(1, cols) * valid
    turn_of = torch.where(valid, batch.turn_index.gather(1, cols), torch.full_like(cols, -1))
    first = valid & torch.cat([torch.ones_like(valid[:, :1]), turn_of[:, 1:] != turn_of[:, :-1]], dim=1)
    last = valid & torch.cat([turn_of[:, 1:] != turn_of[:, :-1], torch.ones_like(valid[:, :1])], dim=1)
    turn_id = first.long().cumsum(dim=1) - 1  # packed turn number of each token
    turn_id = torch.where(valid, turn_id, torch.zeros_like(turn_id))
    turn_r = torch.zeros_like(r).scatter_add_(1, turn_id, r)  # rewards of a turn (they sit on its last token)
    turn_live = torch.arange(width, device=cols.device)[None, :] < first.sum(dim=1)[:, None]
    return _Turns(cols, valid, v, r, first, last, turn_id, turn_r * turn_live, turn_live)


def _turn_level(t: _Turns, read: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over turns: ``(A^turn, V^turn)``, packed by turn ``[N, L]``, the turn value of turn
    ``k`` read at its token where ``read`` (``t.first`` or ``t.last``) is set."""
    width = t.cols.shape[1]
    positions = torch.arange(width, device=t.cols.device)[None, :]
    at = torch.where(read, positions, torch.full_like(t.cols, width)).sort(dim=1).values.clamp(max=max(width - 1, 0))
    turn_v = t.v.gather(1, at) * t.turn_live
    g = torch.full_like(t.turn_r, gamma)
    lam_t = torch.full_like(t.turn_r, lam)
    return _recursion(t.turn_r, turn_v, t.turn_live, g, lam_t), turn_v


def _within_turns(t: _Turns, target: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Token-level GAE inside each turn, packed ``[N, L]``: the turn's last token bootstraps
    from ``target`` (each token's turn target, ``delta_last = target - V_last``), the others
    ``delta_j = gamma V_{j+1} - V_j``; ``A_j = delta_j + gamma lam A_{j+1}`` within the turn."""
    next_v = torch.cat([t.v[:, 1:], torch.zeros_like(t.v[:, :1])], dim=1)
    delta = torch.where(t.last, target - t.v, gamma * next_v - t.v) * t.valid
    adv = torch.zeros_like(delta)
    running = delta.new_zeros(delta.shape[0])
    for j in range(delta.shape[1] - 1, -1, -1):
        running = torch.where(t.last[:, j], delta[:, j], delta[:, j] + gamma * lam * running)
        adv[:, j] = torch.where(t.valid[:, j], running, torch.zeros_like(running))
    return adv


def turn_level_gae(batch: TrainBatch, values: torch.Tensor, gamma: float = 1.0, lam: float = 0.95,
                   token_lam: float = 1.0) -> torch.Tensor:
    """Bi-level GAE with the turn value read at each turn's *start*: GAE over turns, then
    token-level inside each turn (``turn_gae``).

    * Turn level: ``V_k`` = the value at turn ``k``'s first sampled token (the state the turn
      is written from: the history and the turn's observation); ``delta_k = r_k + gamma
      V_{k+1} - V_k`` (``V`` past the last turn = 0); ``A^turn_k = delta_k + gamma lam
      A^turn_{k+1}``; turn target ``G_k = A^turn_k + V_k``.
    * Token level inside turn ``k``: no discount; the turn's last token bootstraps from
      ``G_k``: ``delta_last = G_k - V_last``, ``delta_j = V_{j+1} - V_j`` otherwise, and
      ``A_j = delta_j + token_lam A_{j+1}`` within the turn. With ``token_lam = 1`` every
      token gets ``A_j = G_k - V_j`` (the first token ``A^turn_k``).

    RAGEN's published bi-level GAE (``bilevel_gae``) reads the turn value at the turn's
    *last* sampled token instead, discounts tokens by its own gamma and uses one lambda at
    both levels; with every turn's first and last values equal, ``gamma`` as its
    ``high_level_gamma``, a token gamma of 1 and ``token_lam = lam``, the two are the same.

    Turns without sampled tokens have no value; they are skipped (their reward moves to the
    previous turn's last token, as in ``token_rewards``).

    Returns:
        ``[N, T]`` advantages (0 off the loss mask).

    Raises:
        ValueError: If ``values`` is not ``[N, T]``, the loss mask's shape.
    """
    same_shape("turn_level_gae", loss_mask=batch.loss_mask, values=values)
    return _two_level(batch, values, "first", gamma, lam, 1.0, token_lam)


def bilevel_gae(batch: TrainBatch, values: torch.Tensor, high_level_gamma: float = 0.95,
                token_level_gamma: float = 1.0, lam: float = 1.0) -> torch.Tensor:
    """RAGEN's bi-level GAE (Wang et al. 2025, "RAGEN: Understanding Self-Evolution in LLM
    Agents via Multi-Turn Reinforcement Learning"; ``compute_bi_level_gae_advantage_return`` in
    ``ragen/trainer/core_algos.py``), with the turn value read at each turn's *end*.

    What is read where (``values[:, t]`` is the critic's value of the state before sampled
    token ``t``, as everywhere here):

    * Turn level, over the turns of a row: turn ``k``'s value is ``V(e_k)``, the value at its
      last sampled token ``e_k`` (the turn written up to its final token, in RAGEN the
      end-of-response token); its reward ``r_k`` sits on ``e_k``.
      ``delta_k = r_k + high_level_gamma V(e_{k+1}) - V(e_k)`` (``V`` past the last turn
      = 0), ``A^turn_k = delta_k + high_level_gamma lam A^turn_{k+1}``, and the turn's
      return ``G_k = A^turn_k + V(e_k)``.
    * Token level, inside each turn and never across one: the last token ``e_k`` gets
      ``delta = G_k - V(e_k)`` (its reward replaced by the turn's return, nothing
      bootstrapped after it), so ``A(e_k) = A^turn_k``; every earlier token ``j`` of the turn
      ``delta_j = token_level_gamma V_{j+1} - V_j`` (``j + 1`` the turn's next sampled token)
      and ``A_j = delta_j + token_level_gamma lam A_{j+1}``.

    With ``token_level_gamma = lam = 1`` (RAGEN's defaults, with ``high_level_gamma`` 0.95)
    every token of turn ``k`` gets ``A_j = G_k - V_j``. The critic's regression target at
    every sampled token is ``A_j + V_j`` (RAGEN's returns; ``G_k`` at the turn's last token),
    computed by ``bilevel_gae_targets`` before any whitening.

    RAGEN finds a turn's end as the positions whose reward is nonzero; here a turn's end is
    its last sampled token whatever its reward (a turn rewarded 0 is a turn of its own, which
    RAGEN's lookup would merge into the next). Turns without sampled tokens are skipped (their
    reward moves to the previous turn's last token, as in ``token_rewards``).

    Returns:
        ``[N, T]`` advantages (0 off the loss mask).

    Raises:
        ValueError: If ``values`` is not ``[N, T]``, the loss mask's shape.
    """
    same_shape("bilevel_gae", loss_mask=batch.loss_mask, values=values)
    return _two_level(batch, values, "last", high_level_gamma, lam, token_level_gamma, lam)


def _two_level(batch: TrainBatch, values: torch.Tensor, read: str, gamma: float, lam: float, token_gamma: float,
               token_lam: float) -> torch.Tensor:
    """GAE over turns with each turn's value read at its ``read`` ("first" or "last") sampled
    token, then GAE inside each turn from the turn's return ``G_k``: ``[N, T]`` advantages."""
    t = _turns(batch, values)
    turn_adv, turn_v = _turn_level(t, getattr(t, read), gamma, lam)
    target = (turn_adv + turn_v).gather(1, t.turn_id) * t.valid  # G_k for every token of turn k
    return _unpack(_within_turns(t, target, token_gamma, token_lam), t.cols, t.valid, batch.loss_mask)


def turn_mdp_gae(batch: TrainBatch, values: torch.Tensor, gamma: float = 1.0,
                 lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE of the turn-level MDP (Turn-PPO): one advantage per turn, with the turn value read
    at the turn's start.

    A turn is one action: its state ``s_k`` is everything before the turn's first sampled
    token (the history and the turn's observation), so ``V_k`` = the value at that token.
    ``delta_k = r_k + gamma V_{k+1} - V_k`` (``V`` past the last turn = 0), ``A_k = delta_k +
    gamma lam A_{k+1}``, and every sampled token of turn ``k`` gets ``A_k``. The critic's target
    is the turn's lambda-return ``G_k = A_k + V_k`` on every token of the turn (only the value
    at its first token is read).

    Returns:
        ``(advantages, returns)``, both ``[N, T]`` and 0 off the loss mask.

    Raises:
        ValueError: If ``values`` is not ``[N, T]``, the loss mask's shape.
    """
    same_shape("turn_mdp_gae", loss_mask=batch.loss_mask, values=values)
    t = _turns(batch, values)
    turn_adv, turn_v = _turn_level(t, t.first, gamma, lam)
    adv = turn_adv.gather(1, t.turn_id) * t.valid
    target = (turn_adv + turn_v).gather(1, t.turn_id) * t.valid
    return (_unpack(adv, t.cols, t.valid, batch.loss_mask), _unpack(target, t.cols, t.valid, batch.loss_mask))

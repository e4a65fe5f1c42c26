"""Turn-level advantage estimators: credit per assistant turn, broadcast to its tokens.

Same contract as ``advantages.py``: ``fn(batch, **params) -> Tensor[N, T]``, 0 off the loss
mask. Per-turn quantities are ``[N, K]`` (``K`` = most turns in the batch); a turn's
advantage is given to every sampled token of that turn (``turns.turns_to_tokens``).
Observation and tool tokens never carry loss and never interrupt a return: returns are
computed over turns, so the tokens between turns cannot reset them.

Edge cases: a group of one gets 0 from every group-relative term (``turn_returns``
instead falls back to the plain return, see there); all-equal returns give exactly 0 in
any dtype (returns, means and stds are computed in float64 by ``groups.py``, the advantage
cast back to the rewards' dtype); a turn with no sampled tokens (a zero-length turn)
carries no loss; a truncated episode counts with the return it got (no value to bootstrap
from).
"""

from __future__ import annotations

import torch

from turnrl.algorithms.credit.advantages import ADVANTAGES
from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.credit.groups import STAT_DTYPE, group_normalize, leave_one_out_centred
from turnrl.algorithms.credit.turns import discounted_turn_returns, turn_valid, turns_to_tokens

NORMALIZATIONS = ("std", "mean")
"""GiGPO's ``normalize`` values: divide by the group std, or centre only."""
NORMALIZATION_ALIASES = {"mean_std_norm": "std", "mean_norm": "mean"}
"""The GiGPO authors' names for them (their published scripts use ``mean_norm``)."""


def _turn_keys(group_index: torch.Tensor, k_max: int) -> torch.Tensor:
    """``[N, K]`` ids of (group, turn index) cells."""
    return group_index[:, None] * k_max + torch.arange(k_max, device=group_index.device)[None, :]


@ADVANTAGES.register("turn_returns")
def turn_returns(batch: TrainBatch, gamma: float = 1.0) -> torch.Tensor:
    """Discounted per-turn returns with a leave-one-out baseline at the same turn index.

    ``G_{i,k} = r_{i,k} + gamma * G_{i,k+1}`` and ``A_{i,k} = G_{i,k} - b_{i,k}`` with
    ``b_{i,k}`` the mean of ``G_{j,k}`` over the *other* samples ``j`` of the group that
    reached turn ``k``; ``b = 0`` when no other sample did (so a group of one, or a turn
    only one sample reached, gets its plain REINFORCE return rather than 0: a long episode
    that succeeds alone still credits its deep turns).

    Why this baseline stays unbiased when episodes have different numbers of turns: a
    baseline keeps the policy gradient unbiased when it does not depend on sample ``i``'s
    own actions from turn ``k`` on. ``b_{i,k}`` uses only the other, independent samples
    (which of them reached turn ``k`` depends on their actions, not on ``i``'s). The group
    mean including ``i`` itself is biased: it scales turn ``k``'s credit by ``1 - 1/n_k``
    (``n_k`` the samples that reached it, a number that varies from turn to turn) and gives 0
    to a turn only ``i`` reached. Counting the other samples that ended earlier as ``G = 0``
    instead of leaving them out is *not* biased (that baseline does not depend on ``i``
    either), only a different baseline: the credit lab measures both
    (``turnrl.bench.credit_lab``: ``turn_mean_incl_self``, ``turn_loo_padded``; docs/credit_lab.md).

    Args:
        batch: uses ``turn_rewards [N, K]``, ``num_turns [N]``, ``group_index [N]``,
            ``turn_index`` and ``loss_mask [N, T]``.
        gamma: turn discount in ``[0, 1]``.

    Returns:
        ``[N, T]`` advantages.
    """
    k_max = batch.turn_rewards.shape[1]
    returns = discounted_turn_returns(batch.turn_rewards.to(STAT_DTYPE), batch.num_turns, gamma)
    valid = turn_valid(batch.num_turns, k_max)
    centred, others = leave_one_out_centred(returns, _turn_keys(batch.group_index, k_max), valid)
    per_turn = torch.where(others > 0, centred, returns) * valid
    return turns_to_tokens(per_turn.to(batch.turn_rewards.dtype), batch.turn_index, batch.loss_mask)


@ADVANTAGES.register("gigpo")
def gigpo(batch: TrainBatch, omega: float = 1.0, gamma: float = 0.95, normalize: str = "std",
          eps: float = 1e-6) -> torch.Tensor:
    """GiGPO (Feng et al., 2025): an episode-level group advantage plus a step-level one
    computed over anchor-state groups.

    * Episode: ``A^E_i = (R_i - mean_g R) / F``.
    * Step: turns of one task's group that start from the same env state (equal
      ``batch.state_index``, built from the env's ``state_key``) form an anchor group ``s``;
      with the discounted step return ``G_{i,k} = sum_{j >= k} gamma^(j-k) r_{i,j}``,
      ``A^S_{i,k} = (G_{i,k} - mean_s G) / F_s``. A state visited once gets ``A^S = 0``; a
      turn without a state key (index -1) gets only ``A^E``.
    * Turn ``k``'s tokens get ``A^E_i + omega * A^S_{i,k}``.

    ``F`` is the std of the group (``normalize="std"``, plus eps; the default) or 1
    (``"mean"``, mean centring only, the paper's alternative that avoids inflating
    near-uniform groups). The authors' names are accepted too: ``"mean_std_norm"`` is
    ``"std"`` and ``"mean_norm"`` is ``"mean"``, which is what their published scripts use.

    Args:
        batch: uses ``rewards``, ``group_index``, ``turn_rewards``, ``num_turns``,
            ``state_index``, ``turn_index``, ``loss_mask``.
        omega: weight of the step-level advantage.
        gamma: discount of the step return.
        normalize: ``"std"`` (alias ``"mean_std_norm"``) or ``"mean"`` (alias ``"mean_norm"``).
        eps: added to the std.

    Returns:
        ``[N, T]`` advantages.

    Raises:
        ValueError: On another ``normalize``.
    """
    normalize = NORMALIZATION_ALIASES.get(normalize, normalize)
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {[*NORMALIZATIONS, *NORMALIZATION_ALIASES]}, got {normalize!r}")
    scale = eps if normalize == "std" else None
    episode = group_normalize(batch.rewards, batch.group_index, eps=scale)
    k_max = batch.turn_rewards.shape[1]
    returns = discounted_turn_returns(batch.turn_rewards.to(STAT_DTYPE), batch.num_turns, gamma)
    anchored = (batch.state_index >= 0) & turn_valid(batch.num_turns, k_max)
    step = group_normalize(returns, batch.state_index, anchored, eps=scale)  # 0 where not anchored
    per_turn = episode[:, None] + omega * step
    dtype = torch.promote_types(batch.rewards.dtype, batch.turn_rewards.dtype)
    return turns_to_tokens(per_turn.to(dtype), batch.turn_index, batch.loss_mask)


@ADVANTAGES.register("mt_grpo")
def mt_grpo(batch: TrainBatch, turn_coef: float = 1.0, eps: float = 1e-6) -> torch.Tensor:
    """MT-GRPO (Zeng et al., 2025) as the authors' code computes it: the outcome advantage on
    every turn, plus ``turn_coef`` times the group-normalised turn reward on the turns it
    credits.

    The outcome of a trajectory is the reward of its final turn, ``O_i`` (envs pay the outcome
    there; ``batch.rewards`` is not used because it is the *sum* of the turn rewards and would
    count the intermediate rewards twice, where the authors' outcome reward functions score the
    final answer alone). Every earlier turn ``k`` has an intermediate (turn) reward
    ``r_{i,k}``. Both are normalised over *all* ``G`` samples of the group:

    * ``A^O_i = (O_i - mean_g O) / (std_g O + eps)``;
    * ``A^T_{i,k} = (x_{i,k} - mean_g x_{.,k}) / (std_g x_{.,k} + eps)`` with ``x_{i,k} =
      r_{i,k}`` when ``k`` is a non-final turn of sample ``i`` and ``x_{i,k} = 0`` when
      sample ``i`` ended before turn ``k`` or ``k`` is its final turn (it has no
      intermediate reward there, and counts with 0).

    Tokens of a non-final turn ``k`` get ``A^O_i + turn_coef * A^T_{i,k}``; tokens of the final
    turn get ``A^O_i``. A sample with no tokens at turn ``k`` gets nothing from it, but its 0
    is in turn ``k``'s mean and std.

    In the authors' two-turn setup (a tool call, then the answer; every sample has a turn-1
    reward) this is their trainer's advantage: first-turn tokens get ``A^O + coef * A^T``,
    answer tokens ``A^O``. The paper's equation writes the weight on ``A^O`` instead (``A^T +
    lambda * A^O``); at the default 1.0 the two agree. ``mt_grpo_reached`` is the variant that
    normalises each turn over the samples that have an intermediate reward there and weights
    ``A^O``. With outcome-only envs (intermediate rewards all 0) every ``A^T`` is 0 and this is
    GRPO on the outcome.

    Args:
        batch: uses ``turn_rewards``, ``num_turns``, ``group_index``, ``turn_index``,
            ``loss_mask``.
        turn_coef: weight of the turn advantage on non-final turns (the authors'
            ``turn_advantage_coef``).
        eps: added to the stds.

    Returns:
        ``[N, T]`` advantages.
    """
    k_max = batch.turn_rewards.shape[1]
    rewards = batch.turn_rewards.to(STAT_DTYPE)
    a_outcome = group_normalize(_outcome(rewards, batch.num_turns), batch.group_index, eps=eps)
    intermediate = turn_valid((batch.num_turns - 1).clamp(min=0), k_max)  # k < num_turns - 1
    # every sample of the group counts at every turn index, with 0 where it has no intermediate reward
    a_turn = group_normalize(rewards * intermediate, _turn_keys(batch.group_index, k_max), eps=eps)
    per_turn = a_outcome[:, None] + turn_coef * a_turn * intermediate
    return turns_to_tokens(per_turn.to(batch.turn_rewards.dtype), batch.turn_index, batch.loss_mask)


@ADVANTAGES.register("mt_grpo_reached")
def mt_grpo_reached(batch: TrainBatch, outcome_weight: float = 1.0, eps: float = 1e-6) -> torch.Tensor:
    """A variant of MT-GRPO: each turn's intermediate reward normalised over the samples that
    have one at that turn, and the weight on the outcome advantage.

    The outcome ``O_i`` is the reward of a trajectory's final turn, every earlier turn ``k``
    has an intermediate reward ``r_{i,k}``. With ``A^O_i = (O_i - mean_g O) / (std_g O + eps)``
    and ``A^T_{i,k} = (r_{i,k} - mean) / (std + eps)`` over the group's samples for which ``k``
    is a non-final turn:

    * tokens of a non-final turn ``k`` get ``A^T_{i,k} + outcome_weight * A^O_i``;
    * tokens of the final turn get ``A^O_i``.

    It differs from ``mt_grpo`` (the authors' code) in two ways: a sample that ended at or
    before turn ``k`` is left out of turn ``k``'s statistics instead of counting with reward 0
    (so a turn that only one sample has as an intermediate turn gets ``A^T = 0``), and the
    weight multiplies ``A^O`` (the paper's equation) instead of ``A^T``. With outcome-only envs
    this is GRPO on the outcome with ``outcome_weight`` on the earlier turns.

    Args:
        batch: uses ``turn_rewards``, ``num_turns``, ``group_index``, ``turn_index``,
            ``loss_mask``.
        outcome_weight: weight (the paper's lambda) of the outcome advantage on non-final turns.
        eps: added to the stds.

    Returns:
        ``[N, T]`` advantages.
    """
    n, k_max = batch.turn_rewards.shape
    rewards = batch.turn_rewards.to(STAT_DTYPE)
    a_outcome = group_normalize(_outcome(rewards, batch.num_turns), batch.group_index, eps=eps)
    intermediate = turn_valid((batch.num_turns - 1).clamp(min=0), k_max)  # k < num_turns - 1
    a_turn = group_normalize(rewards, _turn_keys(batch.group_index, k_max), intermediate, eps=eps)
    per_turn = torch.where(intermediate, a_turn + outcome_weight * a_outcome[:, None],
                           a_outcome[:, None].expand(n, k_max))
    return turns_to_tokens(per_turn.to(batch.turn_rewards.dtype), batch.turn_index, batch.loss_mask)


def _outcome(rewards: torch.Tensor, num_turns: torch.Tensor) -> torch.Tensor:
    """``[N]`` the reward of each row's final turn (0 for a row without turns)."""
    last = (num_turns - 1).clamp(min=0)
    return rewards.gather(1, last[:, None]).squeeze(1) * (num_turns > 0)

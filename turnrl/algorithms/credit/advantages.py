"""Trajectory-level advantage estimators: pure functions in a registry, looked up by name.

Every estimator has the signature ``fn(batch: TrainBatch, **params) -> Tensor[N, T]`` and
returns per-token advantages that are 0 wherever ``batch.loss_mask`` is 0. Turn-level
estimators (turn returns, GiGPO, MT-GRPO) are in ``turn_advantages.py``.

Edge cases, for every estimator here: a group of one and a group whose returns are all
equal get advantage exactly 0 from the group-relative estimators (there is nothing to
compare), in any dtype: every mean and std comes from ``groups.py``, in float64, and the
advantage is cast back to the rewards' dtype;
truncated episodes count with the return they got (no bootstrap); a turn with no sampled
tokens carries no loss whatever its advantage.
"""

from __future__ import annotations

import torch

from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.credit.groups import STAT_DTYPE, group_normalize, leave_one_out_centred, whiten
from turnrl.algorithms.credit.turns import discounted_turn_returns, turns_to_tokens
from turnrl.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")


@ADVANTAGES.register("grpo")
def grpo(batch: TrainBatch, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Trajectory-level GRPO: each trajectory's return minus its group's mean return,
    optionally divided by the group's (unbiased) std, broadcast to all its sampled tokens.

    ``A_i = (R_i - mean_g R) / (std_g R + eps)`` (or without the division).
    A group of one, or a group whose returns are all equal, gets advantage 0.

    Args:
        batch: uses ``rewards [N]``, ``group_index [N]``, ``loss_mask [N, T]``.
        normalize_std: divide by the group std (GRPO); False gives Dr.GRPO-style centring.
        eps: added to the std.

    Returns:
        ``[N, T]`` advantages.
    """
    adv = group_normalize(batch.rewards, batch.group_index, eps=eps if normalize_std else None)
    return adv.to(batch.rewards.dtype)[:, None] * batch.loss_mask


@ADVANTAGES.register("dr_grpo")
def dr_grpo(batch: TrainBatch) -> torch.Tensor:
    """Dr.GRPO (Liu et al., 2025): ``A_i = R_i - mean_g R``, no std division.

    Dividing by the group std up-weights groups that are almost all right or all wrong (a
    question-difficulty bias); the paper also removes the per-sequence length
    normalisation, which is the loss aggregation's job: use ``loss_agg:
    seq-mean-token-sum-norm`` with it (``algorithm=dr_grpo`` sets both).

    Args:
        batch: uses ``rewards [N]``, ``group_index [N]``, ``loss_mask [N, T]``.

    Returns:
        ``[N, T]`` advantages.
    """
    return grpo(batch, normalize_std=False)


@ADVANTAGES.register("rloo")
def rloo(batch: TrainBatch) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al., 2024): ``A_i = R_i - mean_{j != i} R_j``
    over the other samples of the group, an unbiased baseline (it does not depend on sample
    i). Equal to ``G/(G-1) * (R_i - mean_g R)``. A group of one gets 0.

    Args:
        batch: uses ``rewards [N]``, ``group_index [N]``, ``loss_mask [N, T]``.

    Returns:
        ``[N, T]`` advantages.
    """
    adv, _ = leave_one_out_centred(batch.rewards, batch.group_index)
    return adv.to(batch.rewards.dtype)[:, None] * batch.loss_mask


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(batch: TrainBatch, gamma: float = 1.0, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ (Hu, 2025): the return-to-go of each token, normalised over the whole
    batch (every sampled token of every group) instead of per group.

    A token of turn ``k`` gets ``G_k = sum_{j >= k} gamma^(j-k) r_j`` (the rewards of its own
    turn and the later ones; with outcome-only rewards and ``gamma = 1`` that is ``R_i``),
    then ``A = (G - mean) / (std + eps)`` with mean and std over all sampled tokens. A batch
    whose tokens all have one return gets 0.

    Args:
        batch: uses ``turn_rewards [N, K]``, ``num_turns [N]``, ``turn_index [N, T]``,
            ``loss_mask [N, T]``.
        gamma: turn discount.
        eps: added to the std.

    Returns:
        ``[N, T]`` advantages.
    """
    returns = discounted_turn_returns(batch.turn_rewards.to(STAT_DTYPE), batch.num_turns, gamma)
    tokens = turns_to_tokens(returns, batch.turn_index, batch.loss_mask.to(STAT_DTYPE))
    return whiten(tokens, batch.loss_mask, eps).to(batch.turn_rewards.dtype) * batch.loss_mask


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline(batch: TrainBatch, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++-baseline: subtract the group mean return, then divide by the std of the
    centred values over the whole batch's sampled tokens (and, as OpenRLHF does, re-centre
    on their token mean): ``c_i = R_i - mean_g R``, ``A = (c - mean_tok c) / (std_tok c + eps)``.

    The group mean removes the task's difficulty; the batch-level std (rather than GRPO's
    per-group std) keeps groups that are nearly all right or all wrong from being blown up.

    Args:
        batch: uses ``rewards [N]``, ``group_index [N]``, ``loss_mask [N, T]``.
        eps: added to the std.

    Returns:
        ``[N, T]`` advantages.
    """
    centred = group_normalize(batch.rewards, batch.group_index, eps=None)
    tokens = centred[:, None] * batch.loss_mask.to(STAT_DTYPE)
    return whiten(tokens, batch.loss_mask, eps).to(batch.rewards.dtype) * batch.loss_mask

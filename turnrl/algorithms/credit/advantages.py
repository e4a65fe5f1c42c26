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
from turnrl.algorithms.credit.turns import discounted_turn_returns, earlier_in_turn, turns_to_tokens
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

    Rewards sit on tokens, as in OpenRLHF: turn ``k``'s env reward on its last sampled token
    and, with the KL in the reward, ``-p_s`` on every sampled token ``s``
    (``batch.token_penalty``, ``p_s = kl_coef * KL_s``). A token ``t`` of turn ``k`` gets the
    return-to-go

    ``G_t = sum_{j >= k} gamma^(j-k) R_j - sum_{s >= t} gamma^(k(s)-k) p_s``

    over the trajectory's sampled tokens ``s`` from ``t`` on (the rest of its own turn, then
    the later turns; ``R_j`` the env reward of turn ``j``), so a token's return holds the
    penalty of the tokens after it, not its whole turn's. The discount is per turn (tokens of
    one turn are not discounted against each other); with ``gamma = 1`` it is OpenRLHF's token
    return-to-go. Then ``A = (G - mean) / (std + eps)`` with mean and std over all sampled
    tokens. Without a penalty every token of turn ``k`` gets ``G_k`` (with outcome-only rewards
    and ``gamma = 1`` that is ``R_i``); a batch whose tokens all have one return gets 0.

    Computed as the turn return of the penalised ``turn_rewards`` (each turn's reward lowered
    by its tokens' penalties) plus the penalties of the tokens of the same turn before ``t``.

    Args:
        batch: uses ``turn_rewards [N, K]``, ``num_turns [N]``, ``turn_index [N, T]``,
            ``loss_mask [N, T]`` and ``token_penalty [N, T]`` (when not None).
        gamma: turn discount.
        eps: added to the std.

    Returns:
        ``[N, T]`` advantages.
    """
    returns = discounted_turn_returns(batch.turn_rewards.to(STAT_DTYPE), batch.num_turns, gamma)
    tokens = turns_to_tokens(returns, batch.turn_index, batch.loss_mask.to(STAT_DTYPE))
    if batch.token_penalty is not None:  # the turn's penalty from t on, not the whole turn's
        earlier = earlier_in_turn(batch.token_penalty.to(STAT_DTYPE) * batch.loss_mask, batch.turn_index)
        tokens = tokens + earlier * batch.loss_mask
    return whiten(tokens, batch.loss_mask, eps).to(batch.turn_rewards.dtype) * batch.loss_mask


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline(batch: TrainBatch, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++-baseline (OpenRLHF's ``reinforce_baseline``): subtract the group mean of
    the return, put each token's KL penalty on that token, take each token's return-to-go,
    then whiten over the whole batch's sampled tokens.

    ``c_i = R_i - mean_g R`` with ``R_i`` the env return (the sum of the turn rewards, without
    the KL penalty: the group mean is taken before the penalty is added, as OpenRLHF does);
    token ``t`` gets ``G_t = c_i - sum_{s >= t} p_s`` over the trajectory's sampled tokens from
    ``t`` on (``p_s = kl_coef * KL_s``, ``batch.token_penalty``; no penalty: ``G_t = c_i``);
    ``A = (G - mean_tok G) / (std_tok G + eps)``.

    The group mean removes the task's difficulty; the batch-level std (rather than GRPO's
    per-group std) keeps groups that are nearly all right or all wrong from being blown up.

    Args:
        batch: uses ``rewards [N]`` (the env return lowered by the row's penalties, which are
            added back), ``group_index [N]``, ``loss_mask [N, T]`` and ``token_penalty [N, T]``
            (when not None).
        eps: added to the std.

    Returns:
        ``[N, T]`` advantages.
    """
    mask = batch.loss_mask.to(STAT_DTYPE)
    if batch.token_penalty is None:
        centred = group_normalize(batch.rewards, batch.group_index, eps=None)
        tokens = centred[:, None] * mask
    else:
        penalty = batch.token_penalty.to(STAT_DTYPE) * mask
        env_return = batch.rewards.to(STAT_DTYPE) + penalty.sum(dim=1)
        centred = group_normalize(env_return, batch.group_index, eps=None)
        from_t = penalty.flip(1).cumsum(dim=1).flip(1)  # sum over s >= t
        tokens = (centred[:, None] - from_t) * mask
    return whiten(tokens, batch.loss_mask, eps).to(batch.rewards.dtype) * batch.loss_mask

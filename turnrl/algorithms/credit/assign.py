"""Credit assignment of one step: what the update trains on, from the collated batch.

Three things happen in this order, each optional but the last: the KL penalty to the
reference policy is put into the rewards (``algorithm.kl_placement=reward``), the critic's
values are attached (critic-based estimators) together with their regression targets, and
the advantage estimator turns rewards (and values) into per-token advantages. The input
batch is never modified; the result is one ``Credited``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.kl_control import kl_penalized
from turnrl.algorithms.shapes import same_shape
from turnrl.algorithms.distributed import all_reduce


@dataclass
class Credited:
    """A batch and its credit: the hand-off from credit assignment to the update.

    Attributes:
        batch: the collated batch as the estimator saw it: rewards lowered by the KL
            penalty and each token's penalty in ``token_penalty`` (KL in the reward),
            ``values`` ``[N, T]`` of the critic (critic-based).
        advantages: ``[N, T]`` per-token advantages (0 off the loss mask).
        returns: ``[N, T]`` the critic's regression targets, or None without a critic.
        reward_kl: the mean per-token KL to the reference measured before the update (all
            processes' tokens), when the KL is in the reward; else None.
        metrics: figures of this stage for the step's log (``kl_reward_penalty``).
    """

    batch: TrainBatch
    advantages: torch.Tensor
    returns: torch.Tensor | None = None
    reward_kl: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def assign_credit(batch: TrainBatch, advantage_fn: Callable[[TrainBatch], torch.Tensor], *,
                  kl_coef: float = 0.0, reference_kl: Callable[[TrainBatch], torch.Tensor] | None = None,
                  values: Callable[[TrainBatch], torch.Tensor] | None = None,
                  value_targets: Callable[[TrainBatch], torch.Tensor] | None = None) -> Credited:
    """Credit for ``batch``.

    Args:
        advantage_fn: the estimator, ``fn(batch) -> [N, T]`` (its kwargs bound).
        kl_coef: the KL penalty's weight this step (with ``reference_kl``).
        reference_kl: ``fn(batch) -> [N, T]`` per-token KL to the reference policy: when given,
            each turn's reward is lowered by ``kl_coef`` times its tokens' KL, and each token's
            ``kl_coef * KL`` is kept in ``batch.token_penalty`` (``kl_control.kl_penalized``).
        values: ``fn(batch) -> [N, T]`` the critic's values; with ``value_targets``
            (``fn(batch) -> [N, T]``), for critic-based estimators.

    Raises:
        ValueError: If an estimator, the critic or the reference KL returns a tensor that is
            not ``[N, T]``, the loss mask's shape (naming it and both shapes).
    """
    metrics, reward_kl = {}, None
    if reference_kl is not None:
        kl = reference_kl(batch).cpu()
        same_shape("assign_credit", loss_mask=batch.loss_mask, reference_kl=kl)
        reward_kl = float(all_reduce(kl.sum()) / all_reduce(batch.loss_mask.sum()).clamp(min=1.0))
        batch, penalty = kl_penalized(batch, kl, kl_coef)
        metrics["kl_reward_penalty"] = float(penalty.mean())
    returns = None
    if values is not None:
        batch = dataclasses.replace(batch, values=values(batch))
        same_shape("assign_credit", loss_mask=batch.loss_mask, values=batch.values)
        returns = value_targets(batch)
    advantages = advantage_fn(batch)
    same_shape("assign_credit", loss_mask=batch.loss_mask, advantages=advantages, returns=returns)
    return Credited(batch, advantages, returns, reward_kl, metrics)

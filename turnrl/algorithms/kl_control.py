"""The KL coefficient (fixed or adaptive) and the KL penalty placed in the rewards.

KL to the frozen reference can sit in the loss (``loss += beta * KL`` per token, what GRPO
does) or in the reward (``r <- r - beta * KL``, what PPO-RLHF and REINFORCE++ do): there the
penalty flows through the advantage estimator like any reward, so its credit is assigned
the way the task reward's is.

In the reward, each sampled token's penalty ``beta * KL_t`` is kept on the batch
(``TrainBatch.token_penalty``) and also summed into the rewards the estimators read: each
turn's reward is lowered by its tokens' penalties (``turn_rewards``, read by the turn-level
estimators and GAE, which puts a turn's reward on its last sampled token) and each row's
return by all of them (``rewards``, read by the trajectory-level ones). REINFORCE++
(``reinforce_pp``, ``reinforce_pp_baseline``) reads ``token_penalty`` and puts each token's
penalty on that token, as OpenRLHF does, so a token's return-to-go holds the penalties of the
tokens from it on, not its whole turn's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from turnrl.algorithms.batch import TrainBatch

PLACEMENTS = ("loss", "reward")


@dataclass
class KLController:
    """``beta`` for the next step. Fixed when ``target`` is None; else adaptive (Ziegler et
    al., 2019): ``beta *= 1 + clip((kl - target) / target, -0.2, 0.2) * n / horizon`` after each
    step with measured per-token ``kl`` over ``n`` trajectories.

    Attributes:
        value: the current coefficient (>= 0).
        target: the per-token KL the adaptive controller steers to, or None.
        horizon: trajectories over which the adaptive controller moves ``beta`` by ~20%.
    """

    value: float
    target: float | None = None
    horizon: int = 10_000

    def __post_init__(self):
        if self.value < 0:
            raise ValueError(f"the KL coefficient must be >= 0, got {self.value}")
        if self.target is not None and (self.target <= 0 or self.value <= 0):
            raise ValueError("an adaptive KL controller needs kl_target > 0 and an initial kl_coef > 0, "
                             f"got kl_target={self.target}, kl_coef={self.value}")

    def update(self, kl: float, n: int) -> float:
        """Adjust ``beta`` after a step that measured mean per-token ``kl``; returns it."""
        if self.target is not None:
            error = max(-0.2, min(0.2, (kl - self.target) / self.target))
            self.value *= 1.0 + error * n / self.horizon
        return self.value


def kl_penalized(batch: TrainBatch, kl: torch.Tensor, coef: float) -> tuple[TrainBatch, torch.Tensor]:
    """Subtract ``coef * KL`` of each turn's sampled tokens from that turn's reward.

    Args:
        batch: the collated batch.
        kl: ``[N, T]`` per-token KL estimates (counted on the loss mask only).
        coef: the penalty weight.

    Returns:
        ``(new_batch, per_row_penalty [N])``: ``turn_rewards`` and ``rewards`` lowered by the
        penalty (``rewards`` stay the sum of turn rewards), and ``token_penalty [N, T]``
        holding ``coef * KL`` of each sampled token (added to one already there); the input
        batch is not modified.
    """
    k_max = batch.turn_rewards.shape[1]
    tokens = kl * batch.loss_mask * (batch.turn_index >= 0) * coef
    index = batch.turn_index.clamp(min=0)
    per_turn = torch.zeros_like(batch.turn_rewards).scatter_add_(1, index, tokens)[:, :k_max]
    penalty = per_turn.sum(dim=1)
    if batch.token_penalty is not None:
        tokens = batch.token_penalty + tokens
    return replace(batch, turn_rewards=batch.turn_rewards - per_turn, rewards=batch.rewards - penalty,
                   token_penalty=tokens), penalty

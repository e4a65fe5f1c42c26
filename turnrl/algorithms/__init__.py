"""Advantage estimators (a registry of pure functions), losses and the learner."""

from turnrl.algorithms.advantages import ADVANTAGES, grpo
from turnrl.algorithms import critic_advantages, turn_advantages  # noqa: F401  (register estimators)
from turnrl.algorithms.critic_advantages import VALUE_TARGETS
from turnrl.algorithms.aggregation import AGGREGATIONS
from turnrl.algorithms.batch import TrainBatch, collate
from turnrl.algorithms.config import LossConfig, OptimConfig
from turnrl.algorithms.learner import Learner, StepCoefs
from turnrl.algorithms.losses import KL_ESTIMATORS, ppo_clip_loss
from turnrl.algorithms.policy_losses import POLICY_LOSSES
from turnrl.algorithms.scoring import token_logprobs

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "Learner",
    "LossConfig",
    "OptimConfig",
    "POLICY_LOSSES",
    "StepCoefs",
    "TrainBatch",
    "VALUE_TARGETS",
    "collate",
    "grpo",
    "ppo_clip_loss",
    "token_logprobs",
]

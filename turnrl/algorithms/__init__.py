"""Algorithms: credit assignment (``credit``), losses (``losses``), the learner (``learner``), the stages
before RL (``pre_rl``) and what they share (the batch, configs, KL control, schedules, shape checks,
the process-group helpers)."""

from turnrl.algorithms.credit.advantages import ADVANTAGES, grpo
from turnrl.algorithms.credit import critic_advantages, turn_advantages  # noqa: F401  (register estimators)
from turnrl.algorithms.credit.critic_advantages import VALUE_TARGETS
from turnrl.algorithms.losses.aggregation import AGGREGATIONS
from turnrl.algorithms.batch import TrainBatch, collate
from turnrl.algorithms.config import LossConfig, OptimConfig
from turnrl.algorithms.learner.learner import Learner, StepCoefs
from turnrl.algorithms.losses.token_losses import KL_ESTIMATORS, ppo_clip_loss
from turnrl.algorithms.losses.policy import POLICY_LOSSES
from turnrl.algorithms.learner.scoring import token_logprobs

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

"""The configured RL algorithm as one object: the step's coefficients (schedules and the KL
controller), credit assignment and the update (the policy learner and, for critic-based
estimators, a separate critic or a value head on the policy's backbone).

Per step the trainer calls ``coefs(step)``, ``sampling(step)`` (through the rollout source),
``credit(batch, coefs)``, ``update(credited, coefs)`` and ``observe_kl(kl, n)``; checkpoints
go through ``state()`` / ``load_state(ckpt)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from turnrl.agents.sampling import SamplingParams
from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.critic import Critic, CriticConfig, CriticLearner, new_value_head
from turnrl.algorithms.critic_advantages import VALUE_TARGETS
from turnrl.algorithms.credit import Credited, assign_credit
from turnrl.algorithms.kl_control import KLController
from turnrl.algorithms.learner import Learner, LearnerConfig
from turnrl.algorithms.schedules import SCHEDULES
from turnrl.build import advantage_fn
from turnrl.conf.schema import Config


@dataclass(frozen=True)
class StepCoefs:
    """The coefficients of one step: the sampling temperature (the learner computes logprobs at the
    same one), the entropy bonus's weight and the KL penalty's weight."""

    temperature: float
    entropy_coef: float
    kl_coef: float

    def metrics(self) -> dict[str, float]:
        return {"kl_coef": self.kl_coef, "entropy_coef": self.entropy_coef, "temperature": self.temperature}


class Algorithm:
    """Everything of ``cfg.algorithm`` (and the optimiser settings of ``cfg.trainer``) around
    the policy ``model``.

    Args:
        cfg: the run's config.
        model: the policy (trained in place).
        device: where a critic or value head lives.
        accelerator: the ``accelerate.Accelerator`` of a multi-process run, or None.
    """

    def __init__(self, cfg: Config, model, device, accelerator=None):
        acfg, tcfg = cfg.algorithm, cfg.trainer
        self.cfg, self.total = cfg, tcfg.steps
        self.advantage_fn = advantage_fn(cfg)
        self.critic = self.value_head = self.value_targets = None
        if acfg.advantage in VALUE_TARGETS:  # a separate critic model, or a value head on the policy's backbone
            self.value_targets = partial(VALUE_TARGETS.get(acfg.advantage), **acfg.advantage_kwargs)
            if acfg.critic == "separate":
                self.critic = CriticLearner(Critic.from_policy(model).to(device), CriticConfig(
                    lr=acfg.critic_lr, value_clip=acfg.value_clip, max_grad_norm=tcfg.max_grad_norm,
                    micro_batch_size=tcfg.micro_batch_size))
            else:
                self.value_head = new_value_head(model.config.hidden_size).to(device)
        self.learner = Learner(model, LearnerConfig(
            lr=tcfg.lr, max_grad_norm=tcfg.max_grad_norm, ppo_epochs=acfg.ppo_epochs,
            num_minibatches=acfg.num_minibatches, micro_batch_size=tcfg.micro_batch_size,
            clip_low=acfg.clip_low, clip_high=acfg.clip_high, kl_coef=acfg.kl_coef,
            kl_estimator=acfg.kl_estimator, entropy_coef=acfg.entropy_coef,
            temperature=cfg.agent.temperature, loss_agg=acfg.loss_agg, kl_placement=acfg.kl_placement,
            dual_clip=acfg.dual_clip, log_ratio_clip=acfg.log_ratio_clip, tis=acfg.tis, tis_cap=acfg.tis_cap,
            vf_coef=acfg.vf_coef, value_clip=acfg.value_clip, mixed_precision=tcfg.mixed_precision,
            gradient_checkpointing=tcfg.gradient_checkpointing, lora_rank=tcfg.lora_rank,
        ), value_head=self.value_head, accelerator=accelerator)
        self.kl_ctl = KLController(acfg.kl_coef, acfg.kl_target, acfg.kl_horizon)
        self._entropy = partial(SCHEDULES.get(acfg.entropy_schedule), acfg.entropy_coef, acfg.entropy_coef_end)
        self._temperature = partial(SCHEDULES.get(cfg.agent.temperature_schedule), cfg.agent.temperature,
                                    cfg.agent.temperature_end)

    # ---------------------------------------------------------------- the step's coefficients
    def coefs(self, step: int) -> StepCoefs:
        """Step ``step``'s coefficients (1-based; schedules count from 0)."""
        return StepCoefs(temperature=self._temperature(step=step - 1, total=self.total),
                         entropy_coef=self._entropy(step=step - 1, total=self.total), kl_coef=self.kl_ctl.value)

    def sampling(self, step: int) -> SamplingParams:
        """How step ``step``'s training rollouts are sampled."""
        return SamplingParams(max_new_tokens=self.cfg.agent.max_new_tokens,
                              temperature=self._temperature(step=step - 1, total=self.total))

    def observe_kl(self, kl: float, trajectories: int) -> None:
        """The step's measured per-token KL over all processes' ``trajectories`` (adaptive KL)."""
        self.kl_ctl.update(kl, trajectories)

    # ---------------------------------------------------------------- credit and update
    def credit(self, batch: TrainBatch, coefs: StepCoefs) -> Credited:
        """KL in the reward, the critic's values and the advantages of ``batch`` (before the update)."""
        self._use(coefs)
        kl_in_reward = self.cfg.algorithm.kl_placement == "reward" and self.learner.ref_model is not None
        values = None
        if self.value_targets is not None:
            values = self.critic.values if self.critic is not None else self.learner.values
        return assign_credit(batch, self.advantage_fn, kl_coef=coefs.kl_coef,
                             reference_kl=self.learner.reference_kl if kl_in_reward else None,
                             values=values, value_targets=self.value_targets)

    def update(self, credited: Credited, coefs: StepCoefs) -> dict[str, float]:
        """One update of the policy (and critic) on ``credited``; returns the step's figures."""
        self._use(coefs)
        batch = credited.batch
        metrics = self.learner.update(batch, credited.advantages,
                                      credited.returns if self.value_head is not None else None)
        if self.critic is not None:
            metrics.update(self.critic.update(batch, credited.returns, batch.values))
        if credited.reward_kl is not None:
            metrics["kl"] = credited.reward_kl
        return metrics

    def _use(self, coefs: StepCoefs) -> None:
        self.learner.cfg.temperature = coefs.temperature
        self.learner.cfg.entropy_coef = coefs.entropy_coef
        self.learner.cfg.kl_coef = coefs.kl_coef

    # ---------------------------------------------------------------- checkpoints
    def state(self) -> tuple[dict, dict, float]:
        """``(modules, optimizers, kl_coef)``: state dicts of every module besides the policy
        and of every optimizer, by name, and the KL controller's coefficient."""
        modules, optimizers = {}, {"policy": self.learner.optimizer.state_dict()}
        if self.learner.ref_model is not None:
            modules["ref_model"] = self.learner.ref_model.state_dict()
        if self.value_head is not None:
            modules["value_head"] = self.value_head.state_dict()
        if self.critic is not None:
            modules["critic"] = self.critic.critic.state_dict()
            optimizers["critic"] = self.critic.optimizer.state_dict()
        return modules, optimizers, self.kl_ctl.value

    def load_state(self, ckpt) -> None:
        """Load what ``state`` saved into ``ckpt`` (a ``turnrl.checkpoint.Checkpoint``)."""
        self.learner.optimizer.load_state_dict(ckpt.optimizer("policy"))
        if self.learner.ref_model is not None:
            self.learner.ref_model.load_state_dict(ckpt.module("ref_model"))
        if self.value_head is not None:
            self.value_head.load_state_dict(ckpt.module("value_head"))
        if self.critic is not None:
            self.critic.critic.load_state_dict(ckpt.module("critic"))
            self.critic.optimizer.load_state_dict(ckpt.optimizer("critic"))
        self.kl_ctl.value = ckpt.state.kl_coef

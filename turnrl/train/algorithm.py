"""The configured RL algorithm as one object: the step's coefficients (schedules and the KL
controller), credit assignment and the update (the policy learner and, for critic-based
estimators, a separate critic or a value head on the policy's backbone).

Per step the trainer calls ``coefs(step)``, ``sampling(step)`` (through the rollout source),
``credit(batch, coefs)``, ``update(credited, coefs)`` and ``observe_kl(kl, n)``; checkpoints
go through ``state()`` / ``load_state(ckpt)``.
"""

from __future__ import annotations

from functools import partial

from turnrl.policies.sampling import SamplingParams
from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.learner.critic import Critic, CriticLearner, new_value_head
from turnrl.algorithms.credit.critic_advantages import VALUE_TARGETS
from turnrl.algorithms.credit.assign import Credited, assign_credit
from turnrl.algorithms.kl_control import KLController
from turnrl.algorithms.learner.learner import Learner, StepCoefs, TokenView
from turnrl.algorithms.schedules import SCHEDULES
from turnrl.train.factories import advantage_fn
from turnrl.conf.schema import Config


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
                self.critic = CriticLearner(Critic.from_policy(model).to(device), acfg, tcfg)
            else:
                self.value_head = new_value_head(model.config.hidden_size).to(device)
        self.learner = Learner(model, acfg, tcfg, value_head=self.value_head, accelerator=accelerator)
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
        kl_in_reward = self.cfg.algorithm.kl_placement == "reward" and self.learner.ref_model is not None
        values = None
        if self.value_targets is not None:
            values = self.critic.values if self.critic is not None else self.learner.values
        return assign_credit(batch, self.advantage_fn, kl_coef=coefs.kl_coef,
                             reference_kl=partial(self.learner.reference_kl, temperature=coefs.temperature)
                             if kl_in_reward else None,
                             values=values, value_targets=self.value_targets)

    def update(self, credited: Credited, coefs: StepCoefs, view: TokenView | None = None) -> dict[str, float]:
        """One update of the policy (and critic) on ``credited``; returns the step's figures (and
        fills ``view`` with the per-token ones, when given)."""
        batch = credited.batch
        metrics = self.learner.update(batch, credited.advantages,
                                      credited.returns if self.value_head is not None else None, coefs=coefs,
                                      view=view)
        if self.critic is not None:
            metrics.update(self.critic.update(batch, credited.returns, batch.values))
        if credited.reward_kl is not None:
            metrics["kl"] = credited.reward_kl
        return metrics

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
        """Load what ``state`` saved into ``ckpt`` (a ``turnrl.train.checkpoint.Checkpoint``)."""
        self.learner.optimizer.load_state_dict(ckpt.optimizer("policy"))
        if self.learner.ref_model is not None:
            self.learner.ref_model.load_state_dict(ckpt.module("ref_model"))
        if self.value_head is not None:
            self.value_head.load_state_dict(ckpt.module("value_head"))
        if self.critic is not None:
            self.critic.critic.load_state_dict(ckpt.module("critic"))
            self.critic.optimizer.load_state_dict(ckpt.optimizer("critic"))
        self.kl_ctl.value = ckpt.state.kl_coef

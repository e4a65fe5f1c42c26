"""The learner's and critic's settings, declared once.

``LossConfig`` (what is optimised: the policy and value losses) and ``OptimConfig`` (how: the
optimizer, precision, adapters) are plain dataclasses. The Hydra schema's ``AlgorithmConfig``
and ``TrainerConfig`` (``turnrl.conf.schema``) inherit them, so ``algorithm.clip_low`` or
``trainer.weight_decay`` on the command line set exactly these fields, and the trainer hands
``cfg.algorithm`` and ``cfg.trainer`` to ``Learner`` / ``CriticLearner`` as they are. No
other dataclass declares these fields (``tests/conf/test_declared_once.py``).

The learner only reads them. What changes from step to step (sampling temperature, entropy
weight, KL coefficient) is not here: it is ``turnrl.algorithms.learner.learner.StepCoefs``, passed to
each call. Choice fields are checked by ``turnrl.conf.validate.validate`` (and again by the
learner's constructor, for direct callers).
"""

from __future__ import annotations

from typing import Optional
from dataclasses import dataclass, field


@dataclass
class LossConfig:
    """Settings of the policy loss and the value loss (under ``algorithm.`` in Hydra)."""

    # policy loss, a name in turnrl.algorithms.POLICY_LOSSES: ppo_clip, gspo, cispo or turn_ppo
    policy_loss: str = "ppo_clip"
    # PPO ratio clip below 1 (policy_loss=ppo_clip; turn_ppo clips each turn's ratio with it)
    clip_low: float = 0.2
    # PPO ratio clip above 1 (clip-higher when > clip_low; policy_loss=ppo_clip or turn_ppo)
    clip_high: float = 0.2
    # Turn-PPO: a turn's importance ratio (policy_loss=turn_ppo): "product" (of its tokens' ratios: the
    # probability ratio of the whole turn) or "geometric" (their geometric mean, length-normalised)
    turn_ratio: str = "product"
    # GSPO: clip of the sequence ratio below 1 (paper: 3e-4; policy_loss=gspo). A field of its own, not
    # clip_low: sequence ratios (geometric means of token ratios) stay near 1, so PPO's 0.2 would never clip
    gspo_clip_low: float = 3e-4
    # GSPO: clip of the sequence ratio above 1 (paper: 4e-4; policy_loss=gspo)
    gspo_clip_high: float = 4e-4
    # CISPO: the detached importance weight is >= 1 - this (policy_loss=cispo); 1.0 = no lower bound, as
    # in the paper. Not clip_low: it bounds a weight's size (no token loses its gradient), not a trust region
    cispo_clip_low: float = 1.0
    # CISPO: the importance weight is <= 1 + this (the paper tunes only this bound; 0.28 as Trinity-RFT)
    cispo_clip_high: float = 0.28
    # passes over each rollout batch
    ppo_epochs: int = 1
    # optimizer steps per pass (the batch is split into this many minibatches)
    num_minibatches: int = 1
    # weight of KL to the frozen initial policy in the loss, at the first step (0 = no reference
    # model); the weight of each step is StepCoefs.kl_coef (the KL controller's value)
    kl_coef: float = 0.0
    # per-token KL estimator, a name in turnrl.algorithms.KL_ESTIMATORS: k1, k2 or k3
    kl_estimator: str = "k3"
    # where the KL penalty goes: "loss" (beta * KL per token in the loss) or "reward" (before the
    # advantage estimator, each turn's reward is lowered by beta * its tokens' KL; REINFORCE++
    # puts beta * KL on each token itself, so a token's return holds the KL of the tokens after it)
    kl_placement: str = "loss"
    # dual-clip constant c > 1: the loss of a negative-advantage token is capped at -A * c (null = off;
    # policy_loss=ppo_clip)
    dual_clip: Optional[float] = None
    # |log ratio| is clamped to this before exp (a stale token cannot overflow the ratio)
    log_ratio_clip: float = 20.0
    # importance correction against the sampler's logprobs (turnrl.algorithms.losses.importance):
    # none, token or sequence (TIS: truncated), icepop, mis_token or mis_sequence (masked), geo_mask
    tis: str = "none"
    # TIS's truncation of the ratio; the bound above which MIS and IcePop mask a token (IcePop's: 5)
    tis_cap: float = 2.0
    # IcePop's lower bound: a token whose ratio is below it is masked
    tis_floor: float = 0.5
    # geo_mask: a row is masked when its geometric-mean ratio leaves [1 - tis_band, 1 + tis_band]
    tis_band: float = 0.01
    # weight of the entropy bonus at the first step (each step's is StepCoefs.entropy_coef)
    entropy_coef: float = 0.0
    # loss aggregation, a name in turnrl.algorithms.AGGREGATIONS: token-mean,
    # seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm or turn-mean
    loss_agg: str = "token-mean"
    # weight of the value loss of a shared value head
    vf_coef: float = 0.5
    # PPO value clipping around the old values, of a shared value head or a separate critic (null = off)
    value_clip: Optional[float] = 0.2
    # AdamW learning rate of a separate critic model
    critic_lr: float = 1e-3
    # passes of a separate critic over each rollout batch (one optimizer step each)
    critic_epochs: int = 1


@dataclass
class OptimConfig:
    """Settings of the optimizer and the training forward (under ``trainer.`` in Hydra)."""

    # AdamW learning rate of the RL updates
    lr: float = 3e-4
    # AdamW decoupled weight decay of the policy (and of a separate critic)
    weight_decay: float = 0.0
    # gradient clipping by global norm (policy and separate critic)
    max_grad_norm: float = 1.0
    # skip the optimizer step of a minibatch whose gradient is exactly zero (every advantage 0 and
    # no KL or entropy term: no group had a learning signal). AdamW would still move the weights
    # on it by its momentum, about lr per weight for ~10 steps after one noisy update, which on
    # sparse rewards drifts the policy while no reward is seen. false: step anyway (torch's and
    # TRL's behaviour)
    skip_zero_grad: bool = True
    # rows per forward/backward pass (gradient accumulation inside a minibatch)
    micro_batch_size: int = 64
    # padded tokens per forward/backward pass (its rows x its longest row): rows sorted by length
    # fill each micro-batch up to this and micro_batch_size, so ragged episodes are padded to
    # their micro-batch's longest row and the learner's memory is bounded by this whatever the
    # batch size (a longer row goes alone); null: micro_batch_size rows, whatever their lengths
    micro_batch_tokens: Optional[int] = 8192
    # "bf16": the learner's forward passes under bf16 autocast (fp32 weights); "no": fp32
    mixed_precision: str = "no"
    # recompute activations in the backward pass (less memory, more compute)
    gradient_checkpointing: bool = False
    # > 0: train LoRA adapters of this rank instead of every weight (needs the "lora" extra: peft)
    lora_rank: int = 0
    # LoRA scaling numerator (an adapter's update is scaled by lora_alpha / lora_rank)
    lora_alpha: float = 16.0
    # names of the modules that get LoRA adapters (peft's target_modules)
    lora_target_modules: list[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])

"""The policy learner: PPO-clip over masked tokens, optional KL to a frozen reference and an
entropy bonus. Plain torch; the model and optimizer are the only state (accelerate-ready:
``prepare`` them and replace ``loss.backward()`` with ``accelerator.backward(loss)``)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from turnrl.algorithms.aggregation import AGGREGATIONS
from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.losses import KL_ESTIMATORS, ppo_clip_loss
from turnrl.algorithms.scoring import token_logprobs


@dataclass
class LearnerConfig:
    """Optimisation settings of the policy update."""

    lr: float = 3e-4  # Adam learning rate
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    max_grad_norm: float = 1.0  # gradient clipping by global norm
    ppo_epochs: int = 1  # passes over each rollout batch
    num_minibatches: int = 1  # optimizer steps per pass (batch split into this many)
    micro_batch_size: int = 64  # rows per forward/backward (gradient accumulation inside a minibatch)
    clip_low: float = 0.2  # PPO ratio clip below 1
    clip_high: float = 0.2  # PPO ratio clip above 1
    kl_coef: float = 0.0  # weight of KL(pi || pi_ref) in the loss; 0 disables the reference model
    kl_estimator: str = "k3"  # per-token KL estimator name
    entropy_coef: float = 0.0  # weight of the entropy bonus (subtracted from the loss)
    temperature: float = 1.0  # the sampling temperature: logits are scaled the same way
    loss_agg: str = "token-mean"  # loss aggregation mode (turnrl.algorithms.aggregation)


class Learner:
    """Updates a causal LM from a ``TrainBatch`` and per-token advantages.

    Args:
        model: the policy (trained in place).
        cfg: learner settings.
    """

    def __init__(self, model, cfg: LearnerConfig):
        self.model = model
        self.cfg = cfg
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.ref_model = None
        if cfg.kl_coef > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.kl_fn = KL_ESTIMATORS.get(cfg.kl_estimator)
        self.aggregate = AGGREGATIONS.get(cfg.loss_agg)

    def update(self, batch: TrainBatch, advantages: torch.Tensor) -> dict[str, float]:
        """Run ``ppo_epochs x num_minibatches`` optimizer steps on the batch.

        Args:
            batch: ``N`` collated trajectories.
            advantages: ``[N, T]`` per-token advantages (0 off the loss mask).

        Returns:
            Of the last pass: ``pg_loss`` (mean over minibatches of the aggregated loss) and
            means over sampled tokens of ``entropy``, ``kl``, ``clip_frac``, ``approx_kl``,
            ``ratio``; and ``grad_norm`` (mean over optimizer steps).
        """
        if advantages.shape != batch.loss_mask.shape:
            raise ValueError(f"advantages {tuple(advantages.shape)} != loss_mask {tuple(batch.loss_mask.shape)}")
        cfg, n = self.cfg, len(batch)
        device = next(self.model.parameters()).device
        batch, advantages = batch.to(device), advantages.to(device)
        self.model.train()
        minibatches = torch.arange(n, device=device).chunk(max(1, min(cfg.num_minibatches, n)))
        grad_norms = []
        for _ in range(cfg.ppo_epochs):
            sums = {k: 0.0 for k in ("pg_loss", "entropy", "kl", "clipped", "approx_kl", "ratio", "tokens")}
            for rows in minibatches:
                weights = torch.zeros_like(batch.loss_mask)
                weights[rows] = self.aggregate(batch.loss_mask[rows])
                for micro in rows.split(cfg.micro_batch_size):
                    self._backward(batch.rows(micro), advantages[micro], weights[micro], sums)
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)))
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        tokens = max(sums.pop("tokens"), 1.0)
        pg_loss = sums.pop("pg_loss") / len(minibatches)
        metrics = {k: v / tokens for k, v in sums.items()}
        metrics["pg_loss"] = pg_loss
        metrics["clip_frac"] = metrics.pop("clipped")
        metrics["grad_norm"] = sum(grad_norms) / len(grad_norms)
        return metrics

    def _backward(self, mb: TrainBatch, adv: torch.Tensor, weights: torch.Tensor, sums: dict) -> None:
        cfg = self.cfg
        mask = mb.loss_mask
        logprobs, entropy = token_logprobs(
            self.model, mb.input_ids, mb.attention_mask, cfg.temperature,
            with_entropy=True, score_mask=mask,
        )
        pg_loss, stats = ppo_clip_loss(
            logprobs, mb.old_logprobs, adv, weights, cfg.clip_low, cfg.clip_high
        )
        loss = pg_loss
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * (entropy * weights).sum()
        kl_sum = 0.0
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logprobs, _ = token_logprobs(
                    self.ref_model, mb.input_ids, mb.attention_mask, cfg.temperature, score_mask=mask
                )
            kl = self.kl_fn(logprobs, ref_logprobs)
            kl_sum = float((kl.detach() * mask).sum())
            loss = loss + cfg.kl_coef * (kl * weights).sum()
        loss.backward()
        sums["pg_loss"] += pg_loss.item()
        sums["entropy"] += float((entropy.detach() * mask).sum())
        sums["kl"] += float(kl_sum)
        sums["tokens"] += float(mask.sum())
        for k, v in stats.items():
            sums[k] += float(v)

"""The critic for PPO/GAE: a separate model (decoder backbone + linear value head) and its
clipped value-loss update. (A value head on the policy's own backbone is trained by the
``Learner`` itself, in the policy's forward: ``Learner(value_head=new_value_head(H))``.)"""

from __future__ import annotations

import copy
import logging
import math

import torch

from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.config import LossConfig, OptimConfig
from turnrl.algorithms.learner.shared_prompt import decoder_hidden

# algorithm.critic: a separate critic model (CriticLearner), or a value head on the policy's
# backbone (shared, trained by the Learner)
CRITICS = ("separate", "shared")

log = logging.getLogger(__name__)


def new_value_head(hidden_size: int) -> torch.nn.Linear:
    """A linear value head ``[.., H] -> [.., 1]`` that starts at zero (predicts 0 everywhere)."""
    head = torch.nn.Linear(hidden_size, 1)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return head


class Critic(torch.nn.Module):
    """``V`` of the state before each sampled token.

    ``values[:, t]`` is predicted from the hidden state at ``t - 1`` (the tokens before
    ``t``), aligned with ``token_logprobs``. The head starts at zero, so a new critic
    predicts 0 everywhere.

    Args:
        backbone: a decoder returning ``last_hidden_state`` (e.g. ``model.get_decoder()``).
        hidden_size: width of its hidden states.
    """

    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = new_value_head(hidden_size)

    @classmethod
    def from_policy(cls, policy) -> "Critic":
        """A critic whose backbone is a copy of the policy's decoder (its own weights)."""
        decoder = policy.get_decoder() if hasattr(policy, "get_decoder") else None
        if decoder is None or decoder is policy:
            raise TypeError(f"{type(policy).__name__} has no separate decoder to copy for a critic")
        return cls(copy.deepcopy(decoder), policy.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, score_mask: torch.Tensor,
                segments: torch.Tensor | None = None) -> torch.Tensor:
        """``[N, T]`` values on the ``score_mask`` positions (column 0 and segment starts excluded),
        0 elsewhere; ``segments`` as in ``turnrl.algorithms.segments.forward_segments``."""
        hidden = decoder_hidden(self.backbone, input_ids, attention_mask, score_mask, segments)
        target = score_mask.bool().clone()
        target[:, 0] = False
        if segments is not None:
            target[:, 1:] &= segments[:, 1:] == segments[:, :-1]
        rows, cols = target.nonzero(as_tuple=True)
        picked = self.head(hidden[rows, cols - 1]).squeeze(-1).float()
        return torch.zeros(score_mask.shape, dtype=picked.dtype, device=picked.device).index_put((rows, cols), picked)


class CriticLearner:
    """Fits a ``Critic`` to value targets with the clipped value loss
    ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)`` averaged over every
    sampled token of the batch (global count, so micro-batching does not change it). Rows the
    batch marks ``excluded`` are not run. An epoch whose loss or gradient is not finite takes
    no optimizer step (weights and optimizer state unchanged; counted and logged).

    Args:
        critic: the critic model (trained in place).
        loss: reads ``critic_lr`` (AdamW learning rate), ``value_clip`` (``c``; None = off) and
            ``critic_epochs`` (passes, one optimizer step each) of a run's ``cfg.algorithm``.
        optim: reads ``weight_decay``, ``max_grad_norm`` and ``micro_batch_size`` of a run's
            ``cfg.trainer`` (shared with the policy's learner).
    """

    def __init__(self, critic: Critic, loss: LossConfig, optim: OptimConfig):
        self.critic, self.loss_cfg, self.optim_cfg = critic, loss, optim
        self.optimizer = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=loss.critic_lr,
                                           weight_decay=optim.weight_decay)

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> torch.Tensor:
        """``[N, T]`` values of ``batch`` (no gradient), on the batch's device."""
        self.critic.eval()
        device = next(self.critic.parameters()).device
        out = torch.zeros_like(batch.loss_mask)
        for micro in batch.micro_batches(batch.trained_rows(), self.optim_cfg.micro_batch_size,
                                         self.optim_cfg.micro_batch_tokens):
            mb = batch.rows(micro).to(device)
            out[micro] = self.critic(mb.input_ids, mb.attention_mask, mb.loss_mask, mb.segment_index).to(out.device) * batch.loss_mask[micro]
        return out

    def update(self, batch: TrainBatch, returns: torch.Tensor, old_values: torch.Tensor) -> dict[str, float]:
        """Fit the critic; returns ``value_loss``, ``value_clip_frac`` (means over sampled
        tokens, last epoch), ``explained_variance`` of the returns by the old values and
        ``critic_nonfinite_updates`` (epochs whose step was skipped for a NaN or inf in the loss
        or the gradient)."""
        loss_cfg, optim_cfg = self.loss_cfg, self.optim_cfg
        device = next(self.critic.parameters()).device
        batch, returns, old_values = batch.to(device), returns.to(device), old_values.to(device)
        self.critic.train()
        total = batch.loss_mask.sum().clamp(min=1.0)
        nonfinite = 0
        for epoch in range(loss_cfg.critic_epochs):
            loss_sum, clipped = 0.0, 0.0
            for micro in batch.micro_batches(batch.trained_rows(torch.arange(len(batch), device=device)),
                                             optim_cfg.micro_batch_size, optim_cfg.micro_batch_tokens):
                mb = batch.rows(micro)
                mask = mb.loss_mask
                v = self.critic(mb.input_ids, mb.attention_mask, mask, mb.segment_index)
                r, v_old = returns[micro], old_values[micro]
                err = (v - r) ** 2
                if loss_cfg.value_clip is not None:
                    v_clipped = v_old + (v - v_old).clamp(-loss_cfg.value_clip, loss_cfg.value_clip)
                    err_clipped = (v_clipped - r) ** 2
                    clipped += float(((err_clipped > err).float() * mask).sum())
                    err = torch.maximum(err, err_clipped)
                loss = 0.5 * (err * mask).sum() / total
                loss.backward()
                loss_sum += loss.item()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.critic.parameters(), optim_cfg.max_grad_norm))
            if math.isfinite(loss_sum) and math.isfinite(grad_norm):
                self.optimizer.step()
            else:
                nonfinite += 1
                log.warning("non-finite critic loss or gradient (value_loss=%s, grad_norm=%s) in epoch %d: the "
                            "critic's optimizer step is skipped, its weights and optimizer state unchanged",
                            loss_sum, grad_norm, epoch)
            self.optimizer.zero_grad(set_to_none=True)
        mask = batch.loss_mask.bool()
        var = returns[mask].var() if mask.sum() > 1 else returns.new_tensor(0.0)
        resid = (returns - old_values)[mask].var() if mask.sum() > 1 else returns.new_tensor(0.0)
        explained = float(1.0 - resid / var) if float(var) > 0 else 0.0
        return {"value_loss": loss_sum, "value_clip_frac": clipped / float(total), "explained_variance": explained,
                "value_mean": float(old_values[mask].mean()) if mask.any() else 0.0,
                "critic_nonfinite_updates": float(nonfinite)}

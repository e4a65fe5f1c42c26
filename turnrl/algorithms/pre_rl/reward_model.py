"""A Bradley-Terry reward model trained from preference pairs, and its calibration report.

``P(chosen beats rejected) = sigmoid(r(chosen) - r(rejected))`` with ``r`` a scalar head on
the hidden state of a conversation's last token; the loss is ``-log sigmoid(r_c - r_r)``.
Calibration on held-out pairs: accuracy (``r_c > r_r``) and the expected calibration error
of the predicted probability (confidence ``max(p, 1 - p)`` binned; ECE = sum over bins of
``n_b / N * |accuracy_b - confidence_b|``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from turnrl.algorithms.batch import collate
from turnrl.algorithms.pre_rl.dpo import PreferencePair
from turnrl.algorithms.segments import forward_segments
from turnrl.rollout.trajectory import Trajectory


class RewardModel(torch.nn.Module):
    """``r(conversation)``: a decoder backbone and a linear head on the last real token.

    Args:
        backbone: a decoder returning ``last_hidden_state``.
        hidden_size: its width.
        pad_id: the id batches are padded with.
    """

    def __init__(self, backbone: torch.nn.Module, hidden_size: int, pad_id: int):
        super().__init__()
        self.backbone, self.pad_id = backbone, pad_id
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @classmethod
    def from_policy(cls, policy, pad_id: int) -> "RewardModel":
        """A reward model on a copy of the policy's decoder (its own weights)."""
        return cls(copy.deepcopy(policy.get_decoder()), policy.config.hidden_size, pad_id)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                segments: torch.Tensor | None = None) -> torch.Tensor:
        """``[N]`` rewards of right-padded sequences, read at each row's last token (for a
        segmented row, in its last segment: the latest full render of the conversation)."""
        hidden = forward_segments(
            lambda ids, mask: self.backbone(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state,
            input_ids, attention_mask, segments)
        last = attention_mask.sum(dim=1).clamp(min=1) - 1
        return self.head(hidden[torch.arange(len(last), device=last.device), last]).squeeze(-1).float()

    def score(self, trajectories: Sequence[Trajectory]) -> torch.Tensor:
        """``[N]`` rewards of whole trajectories (no gradient)."""
        device = next(self.parameters()).device
        batch = collate(list(trajectories), self.pad_id, infra_failures="keep").to(device)  # every one scored
        with torch.no_grad():
            return self(batch.input_ids, batch.attention_mask, batch.segment_index)


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Mean ``-log sigmoid(r_c - r_r)`` over pairs."""
    return -F.logsigmoid(chosen - rejected).mean()


def calibration(model: RewardModel, pairs: Sequence[PreferencePair], bins: int = 10) -> dict[str, float]:
    """Held-out ``accuracy``, ``ece`` (expected calibration error over ``bins`` confidence
    bins) and ``margin`` (mean ``r_c - r_r``) of the model on ``pairs``."""
    if not pairs:
        raise ValueError("calibration needs at least one pair")
    diff = model.score([p.chosen for p in pairs]) - model.score([p.rejected for p in pairs])
    prob = torch.sigmoid(diff)
    correct = (diff > 0).float()
    confidence = torch.maximum(prob, 1 - prob)
    edges = torch.linspace(0.5, 1.0, bins + 1)
    which = torch.bucketize(confidence, edges[1:-1], right=True)
    ece = 0.0
    for b in range(bins):
        in_bin = which == b
        if in_bin.any():
            ece += float(in_bin.float().mean()) * abs(float(correct[in_bin].mean()) - float(confidence[in_bin].mean()))
    return {"accuracy": float(correct.mean()), "ece": ece, "margin": float(diff.mean())}


@dataclass
class RewardModelConfig:
    """Settings of reward-model training (under ``reward_model.`` in Hydra).

    Declared once: the Hydra schema's ``RewardModelStageConfig`` (``turnrl.conf.schema``)
    inherits these fields and adds the stage's own (steps, where the pairs come from), so
    ``reward_model.lr`` on the command line sets exactly this field and the stage hands
    ``cfg.reward_model`` to ``RewardModelTrainer`` as it is.
    """

    # AdamW learning rate of the reward model
    lr: float = 1e-3
    # preference pairs per step
    batch_size: int = 16
    # gradient clipping by global norm of the reward model's updates
    max_grad_norm: float = 1.0


class RewardModelTrainer:
    """Fits a ``RewardModel`` to preference pairs with the Bradley-Terry loss.

    Args:
        model: the reward model, trained in place.
        cfg: its settings: a ``RewardModelConfig`` or the schema's ``cfg.reward_model`` (a
            subclass); the trainer reads ``lr``, ``batch_size`` and ``max_grad_norm`` only.
    """

    def __init__(self, model: RewardModel, cfg: RewardModelConfig):
        self.model, self.cfg = model, cfg
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    def step(self, pairs: Sequence[PreferencePair]) -> dict[str, float]:
        """One optimizer step; returns ``loss`` and the batch's ``accuracy``."""
        if not pairs:
            raise ValueError("reward-model training needs at least one preference pair")
        device = next(self.model.parameters()).device
        batch = collate([p.chosen for p in pairs] + [p.rejected for p in pairs], self.model.pad_id).to(device)
        self.model.train()
        rewards = self.model(batch.input_ids, batch.attention_mask, batch.segment_index)
        chosen, rejected = rewards[: len(pairs)], rewards[len(pairs):]
        loss = bradley_terry_loss(chosen, rejected)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": loss.item(), "accuracy": float((chosen > rejected).float().mean())}

    def train(self, pairs: Sequence[PreferencePair], steps: int, seed: int = 0, progress: bool = True) -> list[dict]:
        """``steps`` steps on minibatches drawn from ``pairs``."""
        gen = torch.Generator().manual_seed(seed)
        history = []
        for _ in tqdm(range(steps), desc="reward model", disable=not progress, leave=False):
            idx = torch.randperm(len(pairs), generator=gen)[: self.cfg.batch_size].tolist()
            history.append(self.step([pairs[i] for i in idx]))
        return history

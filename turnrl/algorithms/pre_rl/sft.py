"""Supervised fine-tuning on rendered episodes (the warm start before RL)."""

from __future__ import annotations

import torch

from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.learner.scoring import token_logprobs


def sft_loss(model, batch: TrainBatch) -> torch.Tensor:
    """Mean negative log-likelihood of the loss-masked (assistant) tokens of ``batch``."""
    logprobs, _, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, score_mask=batch.loss_mask,
                                 segments=batch.segment_index)
    return -(logprobs * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1.0)

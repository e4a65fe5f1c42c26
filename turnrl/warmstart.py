"""Supervised warm start: imitate an env's scripted player before RL."""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from turnrl.agents.renderer import ChatRenderer
from turnrl.agents.scripted import scripted_episode
from turnrl.algorithms.batch import collate
from turnrl.algorithms.sft import sft_loss


def warm_start(model, renderer: ChatRenderer, env, steps: int, batch_size: int, lr: float,
               player: str = "weak", seed: int = 0, progress: bool = True) -> list[float]:
    """Train ``model`` for ``steps`` supervised steps on fresh scripted episodes of the
    train split (each step draws ``batch_size`` new episodes). Returns the loss per step."""
    if steps <= 0:
        return []
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pad = renderer.tokenizer.pad_token_id
    losses = []
    model.train()
    for _ in tqdm(range(steps), desc="warm start", disable=not progress, leave=False):
        episodes = [
            scripted_episode(env, int(rng.integers(2**31)), renderer, player=player, rng=rng)
            for _ in range(batch_size)
        ]
        loss = sft_loss(model, collate(episodes, pad))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses

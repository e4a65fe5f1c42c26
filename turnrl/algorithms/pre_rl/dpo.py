"""Direct preference optimisation (Rafailov et al., 2023) on whole multi-turn trajectories.

A preference pair is two trajectories of the same task, ``chosen`` preferred to
``rejected``. A trajectory's log-likelihood is the sum of its sampled tokens' logprobs:
the env's observation tokens have the same probability under the policy and the
reference, so they cancel in DPO's log-ratios and carry no loss. With
``h = beta * ((log pi(c) - log ref(c)) - (log pi(r) - log ref(r)))`` the loss is
``-log sigmoid(h)``, averaged over pairs.

Pairs come from a JSONL file (``load_pairs``) or from rollout groups (``pairs_from_groups``:
in each group, the best trajectory against the worst, ties skipped).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from turnrl.chat.renderer import ChatRenderer
from turnrl.algorithms.batch import collate
from turnrl.algorithms.learner.scoring import token_logprobs
from turnrl.rollout.termination import is_infra_failure
from turnrl.rollout.trajectory import Trajectory
from turnrl.rollout.scripted import scripted_episode


@dataclass(frozen=True)
class PreferencePair:
    """``chosen`` is preferred to ``rejected``; both continue the same prompt."""

    chosen: Trajectory
    rejected: Trajectory


def pairs_from_groups(trajectories: Sequence[Trajectory]) -> list[PreferencePair]:
    """One pair per group of ``trajectories`` (by ``group_id``): the highest return as
    chosen, the lowest as rejected (first one on ties); groups whose returns are all equal
    give no pair. Episodes the infrastructure ended (``is_infra_failure``) are left out: their
    return says nothing about the policy."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        if not is_infra_failure(t.termination):
            groups.setdefault(t.group_id, []).append(t)
    pairs = []
    for members in groups.values():
        best = max(members, key=lambda t: t.reward)
        worst = min(members, key=lambda t: t.reward)
        if best.reward > worst.reward:
            pairs.append(PreferencePair(best, worst))
    return pairs


def pairs_from_players(env, renderer: ChatRenderer, episodes: int, seed: int = 0) -> list[PreferencePair]:
    """Pairs from an env's scripted players, labelled by the env's verifier: for reset seeds
    ``seed .. seed + episodes - 1`` of the train split, the expert's episode against the weak
    player's whenever the expert's return is higher (and the env failed neither episode)."""

    pairs = []
    for s in range(seed, seed + episodes):
        good = scripted_episode(env, s, renderer, "expert")
        bad = scripted_episode(env, s, renderer, "weak", rng=np.random.default_rng(s))
        if good.reward > bad.reward and not (is_infra_failure(good.termination) or is_infra_failure(bad.termination)):
            pairs.append(PreferencePair(good, bad))
    return pairs


def render_continuation(renderer: ChatRenderer, prompt: list[dict], continuation: list[dict], task_id: str) -> Trajectory:
    """Render ``prompt`` then ``continuation`` token-exactly; assistant messages are the
    trainable (loss-masked) part, each ending with the end-of-turn token."""
    conv = renderer.start(list(prompt))
    eos = renderer.tokenizer.eos_token_id
    pending: list[dict] = []
    for i, message in enumerate(continuation):
        if message.get("role") == "assistant":
            if pending:
                renderer.add_observation(conv, pending, add_generation_prompt=True)
                pending = []
            ids = renderer.encode(str(message.get("content", ""))) + [eos]
            renderer.add_sampled(conv, ids, [0.0] * len(ids))
        else:
            pending.append(message)
    renderer.add_observation(conv, pending, add_generation_prompt=False)
    return Trajectory.from_conversation(conv, [0.0] * len(conv.turn_spans), False, 0, task_id, "terminated")


def load_pairs(path: str | Path, renderer: ChatRenderer) -> list[PreferencePair]:
    """Read preference pairs from a JSONL file, one object per line::

        {"prompt": [{"role": "system", ...}, {"role": "user", ...}],
         "chosen": "a reply" | [{"role": "assistant", ...}, {"role": "user", ...}, ...],
         "rejected": ... same form ...}

    A string is one assistant reply; a list is a multi-turn continuation.

    Raises:
        ValueError: naming the line and what is wrong with it.
    """
    pairs = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e})") from e
        if not isinstance(row, dict) or not {"prompt", "chosen", "rejected"} <= set(row):
            raise ValueError(f"{where}: needs an object with keys prompt, chosen and rejected")
        prompt = row["prompt"]
        if not isinstance(prompt, list) or not all(isinstance(m, dict) and "role" in m for m in prompt):
            raise ValueError(f"{where}: prompt must be a list of {{role, content}} messages")
        sides = []
        for side in ("chosen", "rejected"):
            value = row[side]
            messages = [{"role": "assistant", "content": value}] if isinstance(value, str) else value
            if (not isinstance(messages, list) or not messages
                    or not all(isinstance(m, dict) and "role" in m for m in messages)
                    or messages[0]["role"] != "assistant"):
                raise ValueError(f"{where}: {side} must be a string or a list of {{role, content}} messages "
                                 "that starts with the assistant's reply")
            sides.append(render_continuation(renderer, prompt, messages, f"line{number}"))
        pairs.append(PreferencePair(*sides))
    if not pairs:
        raise ValueError(f"{path}: no preference pairs found")
    return pairs


def sequence_logprobs(model, trajectories: Sequence[Trajectory], pad_id: int) -> torch.Tensor:
    """``[N]`` sums of the sampled tokens' logprobs of each trajectory under ``model``."""
    device = next(model.parameters()).device
    batch = collate(list(trajectories), pad_id, infra_failures="keep").to(device)  # every trajectory scored
    lp, _, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, score_mask=batch.loss_mask,
                           segments=batch.segment_index)
    return (lp * batch.loss_mask).sum(dim=1)


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float = 0.1) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO loss over ``[P]`` sequence logprobs of P pairs.

    Returns:
        ``(loss, stats)``: the mean of ``-log sigmoid(h)``; ``accuracy`` (fraction with
        ``h > 0``), ``margin`` (mean ``h / beta``), ``chosen_reward`` and ``rejected_reward``
        (means of the implicit rewards ``beta * (log pi - log ref)``).
    """
    chosen = beta * (policy_chosen - ref_chosen)
    rejected = beta * (policy_rejected - ref_rejected)
    h = chosen - rejected
    loss = -F.logsigmoid(h).mean()
    h_ = h.detach()
    stats = {"accuracy": float((h_ > 0).float().mean()), "margin": float(h_.mean()) / beta,
             "chosen_reward": float(chosen.detach().mean()), "rejected_reward": float(rejected.detach().mean())}
    return loss, stats


@dataclass
class DPOConfig:
    """Settings of the DPO trainer (under ``dpo.`` in Hydra).

    Declared once: the Hydra schema's ``DPOStageConfig`` (``turnrl.conf.schema``) inherits
    these fields and adds the stage's own (steps, where the pairs come from), so ``dpo.beta``
    on the command line sets exactly this field and the DPO stage hands ``cfg.dpo`` to
    ``DPOTrainer`` as it is.
    """

    # DPO's beta (strength of the pull toward the reference)
    beta: float = 0.1
    # AdamW learning rate of the DPO stage
    lr: float = 1e-4
    # preference pairs per DPO step
    batch_size: int = 8
    # gradient clipping by global norm of the DPO updates
    max_grad_norm: float = 1.0


class DPOTrainer:
    """Trains ``model`` with DPO against a frozen copy of itself taken at construction.

    Args:
        model: the policy, trained in place.
        cfg: its settings: a ``DPOConfig`` or the schema's ``cfg.dpo`` (a subclass); the
            trainer reads ``beta``, ``lr``, ``batch_size`` and ``max_grad_norm`` only.
        pad_id: the tokenizer's pad id.
    """

    def __init__(self, model, cfg: DPOConfig, pad_id: int):
        self.model, self.cfg, self.pad_id = model, cfg, pad_id
        self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)

    def step(self, pairs: Sequence[PreferencePair]) -> dict[str, float]:
        """One optimizer step on ``pairs``; returns the loss and ``dpo_loss``'s stats."""
        if not pairs:
            raise ValueError("DPO needs at least one preference pair")
        trajs = [p.chosen for p in pairs] + [p.rejected for p in pairs]
        self.model.train()
        lp = sequence_logprobs(self.model, trajs, self.pad_id)
        with torch.no_grad():
            ref = sequence_logprobs(self.ref_model, trajs, self.pad_id)
        n = len(pairs)
        loss, stats = dpo_loss(lp[:n], lp[n:], ref[:n], ref[n:], self.cfg.beta)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": loss.item(), **stats}

    def train(self, pairs: Sequence[PreferencePair], steps: int, seed: int = 0, progress: bool = True) -> list[dict]:
        """``steps`` steps on minibatches drawn from ``pairs``; returns each step's metrics."""
        gen = torch.Generator().manual_seed(seed)
        history = []
        for _ in tqdm(range(steps), desc="DPO", disable=not progress, leave=False):
            idx = torch.randperm(len(pairs), generator=gen)[: self.cfg.batch_size].tolist()
            history.append(self.step([pairs[i] for i in idx]))
        return history

"""Supervised warm start: imitate an env's scripted player before RL; and the cache that lets
runs with the same settings share one warm-started model (``agent.warmstart.cache``)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from turnrl.chat.renderer import ChatRenderer
from turnrl.rollout.scripted import scripted_episode
from turnrl.algorithms.batch import collate
from turnrl.algorithms.pre_rl.sft import sft_loss
from turnrl.rollout.termination import is_infra_failure

log = logging.getLogger(__name__)

CACHE_VERSION = 1
"""Part of every cache key: raise it when the warm start's meaning changes, so old entries
are not reused."""


def warm_start(model, renderer: ChatRenderer, env, steps: int, batch_size: int, lr: float,
               player: str = "weak", seed: int = 0, progress: bool = True,
               max_new_tokens: int | None = None) -> list[float]:
    """Train ``model`` for ``steps`` supervised steps on fresh scripted episodes of the
    train split (each step draws ``batch_size`` new episodes). Returns the loss per step.

    With ``max_new_tokens`` (the sampler's cap per turn) it warns, once, when a scripted turn
    is longer: the model learns turns it can never write whole in RL."""
    if steps <= 0:
        return []
    longest = 0
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
        episodes = [e for e in episodes if not is_infra_failure(e.termination)]  # a failed env's episode
        if not episodes:  # (the env failed every episode of this step; logged by scripted_episode)
            continue
        longest = max([longest, *(end - start for e in episodes for start, end in e.turn_spans)])
        loss = sft_loss(model, collate(episodes, pad))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    if max_new_tokens is not None and longest > max_new_tokens:
        log.warning("the %s player's turns reach %d tokens, above agent.max_new_tokens=%d: the warm start teaches "
                    "turns the sampler cuts before their end; raise agent.max_new_tokens", player, longest,
                    max_new_tokens)
    return losses


def warm_start_as_configured(cfg, model, renderer: ChatRenderer, env, progress: bool = True) -> list[float]:
    """``warm_start`` with ``cfg.agent.warmstart``'s settings and ``warmstart_seed(cfg)``; logs
    the first and last loss. Returns the losses (empty: no warm start)."""
    ws = cfg.agent.warmstart
    losses = warm_start(model, renderer, env, ws.steps, ws.batch_size, ws.lr, ws.player, seed=warmstart_seed(cfg),
                        progress=progress, max_new_tokens=cfg.agent.max_new_tokens)
    if losses:
        log.info("warm start: %d steps, loss %.3f -> %.3f", len(losses), losses[0], losses[-1])
    return losses


def warmstart_seed(cfg) -> int:
    """The seed of the tiny model's initialisation and of the warm start's episodes:
    ``agent.warmstart.seed``, or the run's ``seed`` when that is null."""
    ws = cfg.agent.warmstart
    return cfg.seed if ws.seed is None else int(ws.seed)


SAMPLING_FIELDS = ("backend", "vllm", "http", "prefix_cache", "logprob_tolerance", "max_new_tokens", "temperature",
                   "temperature_schedule", "temperature_end")
"""``agent`` fields of how RL samples, which the warm start (teacher-forced on scripted
episodes) does not read: runs that differ only in them share a warm start."""


def cache_key(cfg) -> str:
    """A hash of everything the warm-started model depends on: the env section of ``cfg``, its
    agent section but ``SAMPLING_FIELDS`` and ``agent.warmstart.cache`` itself, the warm
    start's seed (as ``warmstart_seed`` resolves it: ``seed=0`` with a null
    ``agent.warmstart.seed`` shares ``agent.warmstart.seed=0``'s entry) and ``CACHE_VERSION``.
    16 hex digits."""
    agent = {k: v for k, v in dataclasses.asdict(cfg.agent).items() if k not in SAMPLING_FIELDS}
    agent["warmstart"].pop("cache", None)
    agent["warmstart"]["seed"] = warmstart_seed(cfg)
    payload = {"version": CACHE_VERSION, "env": dataclasses.asdict(cfg.env), "agent": agent,
               "seed": warmstart_seed(cfg)}
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_path(cfg) -> Path | None:
    """Where the run's warm-started model is kept (``<agent.warmstart.cache>/<cache_key>``), or
    None when ``agent.warmstart.cache`` is null or nothing would be warm-started (``steps=0``)."""
    ws = cfg.agent.warmstart
    if not ws.cache or ws.steps <= 0:
        return None
    return Path(ws.cache).expanduser() / cache_key(cfg)


def cached(cfg) -> Path | None:
    """The cache entry of ``cfg`` when a complete one exists (see ``save_to_cache``), else None."""
    path = cache_path(cfg)
    return path if path is not None and (path / "warmstart.json").is_file() else None


def save_to_cache(cfg, model, tokenizer, losses: list[float]) -> Path | None:
    """Save the warm-started ``model`` and ``tokenizer`` (``save_pretrained``, a valid
    ``agent.path``) and ``warmstart.json`` (the losses and the key's inputs) as the cache entry
    of ``cfg``. Written to a temporary folder and renamed, so a reader never sees half an entry
    and two runs racing to save leave one whole entry. Returns the entry (None: no cache)."""
    path = cache_path(cfg)
    if path is None or cached(cfg) is not None:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    ws = dataclasses.asdict(cfg.agent.warmstart)
    (tmp / "warmstart.json").write_text(json.dumps(
        {"key": path.name, "seed": warmstart_seed(cfg), "env": dataclasses.asdict(cfg.env), "warmstart": ws,
         "losses": losses}, indent=1, default=str))
    try:
        tmp.rename(path)
    except OSError:  # another run saved the same entry first
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("warm start saved for reuse: %s", path)
    return path

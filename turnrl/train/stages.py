"""The stages before RL, each on the policy in place: the supervised warm start (or its
``agent.warmstart.cache`` entry, loaded by ``start_run``), a learned
reward model (RL is then rewarded by it) and DPO; and the start-up check that a separate
sampler (a vLLM engine, rollout servers) serves the learner's weights.

A resumed run redoes none of them: its model is the checkpoint's, and a reward model is
loaded from the checkpoint instead of trained."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import gymnasium
import numpy as np

from turnrl.chat.renderer import ChatRenderer
from turnrl.policies.sampling import SamplingParams
from turnrl.algorithms.pre_rl.dpo import DPOTrainer, load_pairs, pairs_from_groups, pairs_from_players
from turnrl.algorithms.pre_rl.reward_model import RewardModel, RewardModelTrainer, calibration
from turnrl.train.factories import scripted_env
from turnrl.conf.schema import Config
from turnrl.train.reward_model_env import RewardModelReward
from turnrl.rollout.collector import RolloutCollector, Task
from turnrl.train.setup import Run
from turnrl.train.warm_start import save_to_cache, warm_start_as_configured
from turnrl.train.agreement import logprob_agreement

log = logging.getLogger(__name__)


@dataclass
class PreRL:
    """What the stages hand to RL.

    Attributes:
        train_env_fn: makes the envs of training rollouts (the config's env, or it wrapped so
            that a learned reward model gives the reward).
        reward_model: that reward model (frozen), or None.
    """

    train_env_fn: Callable[[], gymnasium.Env]
    reward_model: RewardModel | None = None


def pre_rl_stages(run: Run) -> PreRL:
    """Warm start, reward model and DPO as configured (a resumed run only reloads its reward
    model); logs each stage's figures (``reward_model``, ``dpo`` rows)."""
    cfg, resumed = run.cfg, run.resumed
    if resumed is None and run.warm_cached is None:
        losses = warm_start_as_configured(cfg, run.model, run.renderer, scripted_env(cfg, run.env_fn),
                                          progress=cfg.trainer.progress)
        if losses and run.procs.main:
            save_to_cache(cfg, run.model, run.tokenizer, losses)
    stages = PreRL(run.env_fn)
    if cfg.reward_model.steps > 0:  # RL is rewarded by a learned model; evaluation keeps the verifier
        if resumed is None:
            stages.reward_model, report = reward_model_stage(cfg, run.model, run.renderer, run.env_fn)
            run.logger.log(0, report, prefix="reward_model")
        else:
            stages.reward_model = RewardModel.from_policy(run.model, run.tokenizer.pad_token_id)
            stages.reward_model.load_state_dict(resumed.module("reward_model"))
            stages.reward_model.eval().requires_grad_(False)
        stages.train_env_fn = partial(_rm_env, run.env_fn, stages.reward_model, run.renderer)
    if cfg.dpo.steps > 0 and resumed is None:
        collector = RolloutCollector.for_run(cfg, stages.train_env_fn, run.policy, run.renderer)
        for i, metrics in enumerate(dpo_stage(cfg, run.model, run.renderer, collector), start=1):
            run.logger.log(i, metrics, prefix="dpo")
    return stages


def reward_model_stage(cfg: Config, model, renderer: ChatRenderer, env_fn: Callable) -> tuple[RewardModel, dict]:
    """Train a Bradley-Terry reward model on a copy of the policy's backbone; returns it and
    its training and held-out calibration figures (``heldout_accuracy``, ``heldout_ece``)."""
    r = cfg.reward_model
    if r.pairs_path:
        pairs = load_pairs(r.pairs_path, renderer)
    else:
        pairs = pairs_from_players(scripted_env(cfg, env_fn), renderer, r.scripted_episodes, seed=cfg.seed)
    if len(pairs) < 2:
        raise ValueError(f"the reward model needs at least 2 preference pairs, got {len(pairs)}; "
                         "raise reward_model.scripted_episodes or give reward_model.pairs_path")
    held = max(1, int(len(pairs) * r.heldout_fraction))
    order = np.random.default_rng(cfg.seed).permutation(len(pairs))
    train_pairs, heldout = [pairs[i] for i in order[held:]], [pairs[i] for i in order[:held]]
    rm = RewardModel.from_policy(model, renderer.tokenizer.pad_token_id)
    history = RewardModelTrainer(rm, r).train(train_pairs, r.steps, seed=cfg.seed, progress=cfg.trainer.progress)
    rm.eval().requires_grad_(False)
    stats = calibration(rm, heldout)
    report = {"train_loss": history[-1]["loss"], "train_accuracy": history[-1]["accuracy"],
              "heldout_accuracy": stats["accuracy"], "heldout_ece": stats["ece"], "heldout_margin": stats["margin"],
              "pairs": float(len(pairs))}
    log.info("reward model: held-out accuracy %.2f, ECE %.3f on %d pairs", stats["accuracy"], stats["ece"], held)
    return rm, report


def _rm_env(env_fn: Callable, reward_model: RewardModel, renderer: ChatRenderer):
    return RewardModelReward(env_fn(), reward_model, renderer)


def dpo_stage(cfg: Config, model, renderer: ChatRenderer, collector: RolloutCollector) -> list[dict]:
    """DPO on ``cfg.dpo.pairs_path`` or on best-vs-worst pairs of the policy's own rollouts;
    returns each step's metrics (the model is trained in place)."""
    d = cfg.dpo
    if d.pairs_path:
        pairs = load_pairs(d.pairs_path, renderer)
    else:
        rng = np.random.default_rng(cfg.seed + 1)
        tasks = [Task(seed=int(rng.integers(2**31)), split="train") for _ in range(d.rollout_tasks)]
        params = SamplingParams(max_new_tokens=cfg.agent.max_new_tokens, temperature=cfg.agent.temperature)
        pairs = pairs_from_groups(collector.collect(tasks, d.group_size, params))
        if not pairs:
            log.warning("DPO stage skipped: every rollout group had equal returns, so there are no pairs")
            return []
    log.info("DPO stage: %d steps on %d preference pairs", d.steps, len(pairs))
    trainer = DPOTrainer(model, d, renderer.tokenizer.pad_token_id)
    history = trainer.train(pairs, d.steps, seed=cfg.seed, progress=cfg.trainer.progress)
    return [{**m, "pairs": float(len(pairs))} for m in history]


def engine_agreement(sampler, model, renderer: ChatRenderer, env_fn: Callable, cfg: Config, episodes: int = 8) -> dict:
    """The start-up check of a sampler with weights of its own (a vLLM engine, rollout
    servers): sample first turns of ``episodes`` train tasks with it, score them with the
    learner's ``model``, and return ``max_abs`` / ``mean_abs`` logprob differences and the
    token count.

    Raises:
        ValueError: If ``max_abs`` exceeds ``agent.logprob_tolerance`` (the sampler does not
            serve the learner's model, or at another precision than the tolerance allows).
    """

    env = env_fn()
    openings = [env.reset(seed=i, options={"split": "train"}) for i in range(episodes)]
    prompts = [renderer.start(list(obs), tools=info.get("tools")).token_ids for obs, info in openings]
    env.close()
    params = SamplingParams(max_new_tokens=cfg.agent.max_new_tokens, temperature=cfg.agent.temperature)
    found = logprob_agreement(sampler, model, prompts, params)
    check = {k: float(found[k]) for k in ("max_abs", "mean_abs", "tokens")}
    tolerance = cfg.agent.logprob_tolerance
    if check["max_abs"] > tolerance:
        raise ValueError(f"the {cfg.agent.backend} sampler's logprobs differ from the learner's by up to "
                         f"{check['max_abs']:.2e} per token (mean {check['mean_abs']:.2e}), above "
                         f"agent.logprob_tolerance={tolerance}: it does not serve the learner's weights, or at another "
                         f"precision (an engine at agent.vllm.dtype={cfg.agent.vllm.dtype} against a "
                         f"{next(model.parameters()).dtype} learner needs a larger tolerance)")
    log.info("%s sampler check: logprobs agree with the learner within %.2e (mean %.2e, %d tokens)",
             cfg.agent.backend, check["max_abs"], check["mean_abs"], int(check["tokens"]))
    return check

"""The RL loop: collect B x G multi-turn rollouts, score advantages, update, evaluate.

Reads top to bottom: set-up, the warm start, the loop, and the wrap-up (checkpoint,
curve, table). Everything it builds comes from one ``Config``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from turnrl.agents.hf_policy import TransformersPolicy
from turnrl.agents.renderer import ChatRenderer
from turnrl.agents.sampling import SamplingParams
from turnrl.algorithms.batch import collate
from turnrl.algorithms.critic import Critic, CriticConfig, CriticLearner, new_value_head
from turnrl.algorithms.critic_advantages import VALUE_TARGETS
from turnrl.algorithms.dpo import DPOConfig, DPOTrainer, load_pairs, pairs_from_groups, pairs_from_players
from turnrl.algorithms.reward_model import RewardModel, RewardModelConfig, RewardModelTrainer, calibration
from turnrl.algorithms.kl_control import KLController, kl_penalized
from turnrl.algorithms.learner import Learner, LearnerConfig
from turnrl.algorithms.schedules import SCHEDULES
from turnrl.build import advantage_fn, build_agent, env_factory
from turnrl.conf.schema import Config
from turnrl.envs.reward_model import RewardModelReward
from turnrl.evaluate import evaluate, heldout_tasks
from turnrl.logger import RunLogger
from turnrl.report import after_value, before_after_table, plot_curves
from turnrl.rollout.collector import RolloutCollector, Task
from turnrl.rollout.metrics import rollout_metrics
from turnrl.warmstart import warm_start

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a run produced: held-out evaluations (step, metrics) and per-step train metrics."""

    evals: list[tuple[int, dict]] = field(default_factory=list)
    train: list[dict] = field(default_factory=list)
    run_dir: Path | None = None
    model: object = None
    tokenizer: object = None

    @property
    def before(self) -> float:
        return self.evals[0][1]["success"]

    @property
    def after(self) -> float:
        return after_value([e for _, e in self.evals], "success")


def train(cfg: Config, run_dir: str | Path, on_rl_start: Callable[[object], None] | None = None) -> TrainResult:
    """Run warm start + RL as configured; write logs, curve, table and checkpoint to ``run_dir``.

    Args:
        cfg: the composed config.
        run_dir: output folder (the Hydra run dir from the CLI).
        on_rl_start: called with the model after the warm start, before the first RL step.
    """
    run_dir = Path(run_dir)
    tcfg, acfg = cfg.trainer, cfg.algorithm
    # ---------------------------------------------------------------- set-up
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    torch.manual_seed(cfg.seed)
    env_fn = env_factory(cfg)
    model, tokenizer = build_agent(cfg, env_fn)
    model.to(tcfg.device)
    renderer = ChatRenderer(tokenizer)
    score = advantage_fn(cfg)
    logger = RunLogger(run_dir, tensorboard=tcfg.tensorboard)
    log.info("model: %.2fM parameters, vocab %d", sum(p.numel() for p in model.parameters()) / 1e6, len(tokenizer))

    # ---------------------------------------------------------------- warm start
    ws = cfg.agent.warmstart
    ws_losses = warm_start(model, renderer, env_fn(), ws.steps, ws.batch_size, ws.lr, ws.player,
                           seed=cfg.seed, progress=tcfg.progress)
    if ws_losses:
        log.info("warm start: %d steps, loss %.3f -> %.3f", len(ws_losses), ws_losses[0], ws_losses[-1])

    policy = TransformersPolicy(model, tokenizer, seed=cfg.seed)
    train_env_fn = env_fn
    if cfg.reward_model.steps > 0:  # RL is rewarded by a learned model; evaluation keeps the verifier
        reward_model, report = reward_model_stage(cfg, model, renderer, env_fn)
        logger.log(0, report, prefix="reward_model")
        train_env_fn = partial(_rm_env, env_fn, reward_model, renderer)
    collector = RolloutCollector(train_env_fn, policy, renderer, cfg.agent.max_context_tokens, tcfg.env_workers)
    eval_collector = RolloutCollector(env_fn, policy, renderer, cfg.agent.max_context_tokens, tcfg.env_workers)
    # ---------------------------------------------------------------- preference stage (optional)
    if cfg.dpo.steps > 0:
        for i, metrics in enumerate(dpo_stage(cfg, model, renderer, collector), start=1):
            logger.log(i, metrics, prefix="dpo")
    # critic-based estimators: a separate critic model, or a value head on the policy's backbone
    critic = value_head = value_targets = None
    if acfg.advantage in VALUE_TARGETS:
        value_targets = VALUE_TARGETS.get(acfg.advantage)
        if acfg.critic == "separate":
            critic = CriticLearner(Critic.from_policy(model).to(tcfg.device), CriticConfig(
                lr=acfg.critic_lr, value_clip=acfg.value_clip, max_grad_norm=tcfg.max_grad_norm,
                micro_batch_size=tcfg.micro_batch_size))
        elif acfg.critic == "shared":
            value_head = new_value_head(model.config.hidden_size).to(tcfg.device)
        else:
            raise ValueError(f"algorithm.critic must be 'separate' or 'shared', got {acfg.critic!r}")
    learner = Learner(model, LearnerConfig(
        lr=tcfg.lr, max_grad_norm=tcfg.max_grad_norm, ppo_epochs=acfg.ppo_epochs,
        num_minibatches=acfg.num_minibatches, micro_batch_size=tcfg.micro_batch_size,
        clip_low=acfg.clip_low, clip_high=acfg.clip_high, kl_coef=acfg.kl_coef,
        kl_estimator=acfg.kl_estimator, entropy_coef=acfg.entropy_coef,
        temperature=cfg.agent.temperature, loss_agg=acfg.loss_agg, kl_placement=acfg.kl_placement,
        dual_clip=acfg.dual_clip, log_ratio_clip=acfg.log_ratio_clip, tis=acfg.tis, tis_cap=acfg.tis_cap,
        vf_coef=acfg.vf_coef, value_clip=acfg.value_clip,
    ), value_head=value_head)
    kl_ctl = KLController(acfg.kl_coef, acfg.kl_target, acfg.kl_horizon)
    entropy_at = partial(SCHEDULES.get(acfg.entropy_schedule), acfg.entropy_coef, acfg.entropy_coef_end,
                         total=tcfg.steps)
    temperature_at = partial(SCHEDULES.get(cfg.agent.temperature_schedule), cfg.agent.temperature,
                             cfg.agent.temperature_end, total=tcfg.steps)
    eval_tasks = heldout_tasks(tcfg.eval_episodes)
    task_rng = np.random.default_rng(cfg.seed)
    result = TrainResult(run_dir=run_dir, model=model, tokenizer=tokenizer)

    def run_eval(step: int) -> None:
        metrics = evaluate(eval_collector, eval_tasks, cfg.agent.max_new_tokens)
        result.evals.append((step, metrics))
        logger.log(step, metrics, prefix="eval")

    if on_rl_start is not None:
        on_rl_start(model)
    run_eval(0)
    # ---------------------------------------------------------------- the RL loop
    bar = tqdm(range(1, tcfg.steps + 1), desc="RL", unit="step", disable=not tcfg.progress)
    warned: set[str] = set()
    try:
        for step in bar:
            t0 = time.perf_counter()
            # this step's coefficients; the learner scores at the temperature the sampler used
            learner.cfg.temperature = temperature_at(step=step - 1)
            learner.cfg.entropy_coef = entropy_at(step=step - 1)
            learner.cfg.kl_coef = kl_ctl.value
            sampling = SamplingParams(max_new_tokens=cfg.agent.max_new_tokens, temperature=learner.cfg.temperature)
            tasks = [Task(seed=int(task_rng.integers(2**31)), split="train") for _ in range(tcfg.tasks_per_step)]
            trajectories = collector.collect(tasks, tcfg.group_size, sampling)
            t_rollout = time.perf_counter() - t0
            batch = collate(trajectories, tokenizer.pad_token_id, cfg.algorithm.state_similarity)
            coefs = {"kl_coef": kl_ctl.value, "entropy_coef": learner.cfg.entropy_coef,
                     "temperature": learner.cfg.temperature}
            reward_kl = None
            if acfg.kl_placement == "reward" and learner.ref_model is not None:
                ref_kl = learner.reference_kl(batch).cpu()  # before this step's update
                reward_kl = float(ref_kl.sum() / batch.loss_mask.sum().clamp(min=1.0))
                batch, penalty = kl_penalized(batch, ref_kl, kl_ctl.value)
                coefs["kl_reward_penalty"] = float(penalty.mean())
            returns = None
            if value_targets is not None:
                batch.values = critic.values(batch) if critic is not None else learner.values(batch)
                returns = value_targets(batch, **acfg.advantage_kwargs)
            advantages = score(batch)
            update = learner.update(batch, advantages, returns if value_head is not None else None)
            if critic is not None:
                update.update(critic.update(batch, returns, batch.values))
            if reward_kl is not None:
                update["kl"] = reward_kl
            kl_ctl.update(update["kl"], len(trajectories))
            metrics = {**rollout_metrics(trajectories), **update, **coefs,
                       "step_time": time.perf_counter() - t0, "rollout_time": t_rollout}
            result.train.append({"step": step, **metrics})
            logger.log(step, metrics)
            bar.set_postfix(reward=f"{metrics['reward']:.2f}", heldout=f"{result.evals[-1][1]['success']:.2f}")
            if step % tcfg.eval_every == 0 or step == tcfg.steps:
                run_eval(step)
            _warn_once(metrics, cfg, warned)
    except KeyboardInterrupt:  # keep what was computed: evaluate, save and report below
        log.warning("interrupted after %d RL steps; evaluating and saving what there is", len(result.train))
        if result.evals[-1][0] != len(result.train):
            run_eval(len(result.train))
    bar.close()

    # ---------------------------------------------------------------- wrap-up
    if tcfg.save_checkpoint:
        save_checkpoint(run_dir / "checkpoint", model, tokenizer, learner.optimizer, len(result.train))
    plot_curves(result.train, result.evals, run_dir / "curves.png")
    table = before_after_table([e for _, e in result.evals])
    (run_dir / "summary.txt").write_text(table + "\n")
    (run_dir / "evals.json").write_text(json.dumps([{"step": s, **e} for s, e in result.evals], indent=1))
    logger.close()
    print(table, flush=True)
    return result


def reward_model_stage(cfg: Config, model, renderer: ChatRenderer, env_fn: Callable) -> tuple[RewardModel, dict]:
    """Train a Bradley-Terry reward model on a copy of the policy's backbone; returns it and
    its training and held-out calibration figures (``heldout_accuracy``, ``heldout_ece``)."""
    r = cfg.reward_model
    if r.pairs_path:
        pairs = load_pairs(r.pairs_path, renderer)
    else:
        pairs = pairs_from_players(env_fn(), renderer, r.scripted_episodes, seed=cfg.seed)
    if len(pairs) < 2:
        raise ValueError(f"the reward model needs at least 2 preference pairs, got {len(pairs)}; "
                         "raise reward_model.scripted_episodes or give reward_model.pairs_path")
    held = max(1, int(len(pairs) * r.heldout_fraction))
    order = np.random.default_rng(cfg.seed).permutation(len(pairs))
    train_pairs, heldout = [pairs[i] for i in order[held:]], [pairs[i] for i in order[:held]]
    rm = RewardModel.from_policy(model, renderer.tokenizer.pad_token_id)
    history = RewardModelTrainer(rm, RewardModelConfig(lr=r.lr, batch_size=r.batch_size)).train(
        train_pairs, r.steps, seed=cfg.seed, progress=cfg.trainer.progress)
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
    trainer = DPOTrainer(model, DPOConfig(beta=d.beta, lr=d.lr, batch_size=d.batch_size),
                         renderer.tokenizer.pad_token_id)
    history = trainer.train(pairs, d.steps, seed=cfg.seed, progress=cfg.trainer.progress)
    return [{**m, "pairs": float(len(pairs))} for m in history]


def _warn_once(metrics: dict, cfg: Config, warned: set[str]) -> None:
    """Say so (once per run) when most turns are cut or most tool calls fail to parse."""
    checks = {
        "turn_length_cut_rate": f"over half the turns hit agent.max_new_tokens={cfg.agent.max_new_tokens} "
                                "before the end-of-turn token; raise it if replies are cut",
        "tool_parse_error_rate": f"over half the turns hold a malformed tool call (parser "
                                 f"{cfg.agent.tool_parser!r}); check the call format the model writes",
    }
    for key, message in checks.items():
        if metrics.get(key, 0.0) > 0.5 and key not in warned:
            warned.add(key)
            log.warning("%s (%s=%.2f)", message, key, metrics[key])


def save_checkpoint(path: Path, model, tokenizer, optimizer, step: int) -> None:
    """``save_pretrained`` model and tokenizer, plus the optimizer state and step."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    torch.save({"optimizer": optimizer.state_dict(), "step": step}, path / "trainer_state.pt")

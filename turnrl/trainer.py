"""The RL loop: collect B x G multi-turn rollouts, score advantages, update, evaluate.

Reads top to bottom: set-up, the warm start, the loop, and the wrap-up (checkpoint,
curve, table). Everything it builds comes from one ``Config``.

Resuming (``trainer.resume``) restores a checkpoint of ``turnrl.checkpoint`` in place of the
warm start, DPO and reward-model stages, and the loop goes on from the checkpoint's step: the
metrics log, the held-out history, every module, optimizer and RNG state are those of the
uninterrupted run at that step, so the rest of the run is the same, step for step.
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
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from turnrl.agents.hf_policy import TransformersPolicy
from turnrl.agents.http_policy import assert_trainable
from turnrl.agents.model import load_pretrained
from turnrl.agents.renderer import ChatRenderer
from turnrl.agents.sampling import SamplingParams
from turnrl.algorithms.batch import collate
from turnrl.algorithms.critic import Critic, CriticLearner, new_value_head
from turnrl.algorithms.critic_advantages import VALUE_TARGETS
from turnrl.algorithms.dpo import DPOConfig, DPOTrainer, load_pairs, pairs_from_groups, pairs_from_players
from turnrl.algorithms.reward_model import RewardModel, RewardModelConfig, RewardModelTrainer, calibration
from turnrl.algorithms.kl_control import KLController, kl_penalized
from turnrl.algorithms.learner import Learner, StepCoefs
from turnrl.algorithms.schedules import SCHEDULES
from turnrl.build import advantage_fn, build_agent, env_factory, rollout_policy
from turnrl.checkpoint import (Checkpoint, TrainingState, checkpoint_steps, global_rng_state, read_checkpoint,
                               resolve_resume, restore_log, set_global_rng_state, write_checkpoint)
from turnrl.conf.schema import Config
from turnrl.conf.validate import validate
from turnrl.distributed import all_reduce, shard_list
from turnrl.envs.reward_model import RewardModelReward
from turnrl.evaluate import evaluate, heldout_tasks
from turnrl.logger import RunLogger
from turnrl.report import after_value, before_after_table, plot_curves
from turnrl.rollout.collector import RolloutCollector, Task
from turnrl.rollout.metrics import rollout_metrics
from turnrl.rollout.pipeline import AsyncRollouts
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

    With ``trainer.checkpoint_every`` it also saves resumable checkpoints into
    ``run_dir/checkpoints``; with ``trainer.resume`` it continues from one instead of running
    the warm start, DPO and reward-model stages (see ``turnrl.checkpoint``).

    Args:
        cfg: the composed config.
        run_dir: output folder (the Hydra run dir from the CLI).
        on_rl_start: called with the model after the warm start (or after restoring a
            checkpoint), before this process's first RL step.

    Raises:
        ValueError: On a config ``turnrl.conf.validate.validate`` rejects (before any work), or
            a ``trainer.resume`` that names no checkpoint or conflicts with newer checkpoints
            in ``run_dir``.
    """
    run_dir = Path(run_dir)
    tcfg, acfg = cfg.trainer, cfg.algorithm
    validate(cfg)
    resumed = _checkpoint_to_resume(cfg, run_dir)
    # ---------------------------------------------------------------- set-up
    # under `accelerate launch` (trainer.accelerate): every process runs this function; each
    # collects its share of a step's tasks, the learner is data-parallel, the main one writes
    accelerator, rank, world, gather = None, 0, 1, None  # gather: every process's list, in rank order
    if tcfg.accelerate:
        from accelerate import Accelerator
        from accelerate.utils import gather_object as gather

        accelerator = Accelerator(cpu=tcfg.device == "cpu")
        rank, world = accelerator.process_index, accelerator.num_processes
        if tcfg.tasks_per_step < world:
            raise ValueError(f"trainer.tasks_per_step={tcfg.tasks_per_step} < {world} processes: "
                             "each process needs at least one task per step")
    main = rank == 0
    device = tcfg.device if accelerator is None else accelerator.device
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    torch.manual_seed(cfg.seed)
    env_fn = env_factory(cfg)
    if resumed is None:
        model, tokenizer = build_agent(cfg, env_fn)
    else:  # the policy as it was at the checkpoint, and the run's log up to it
        model, tokenizer = load_pretrained(str(resumed.model_dir), resumed.state.dtype)
        model.train(resumed.state.model_training)
        if main:
            restore_log(run_dir, resumed)
    model.to(device)
    renderer = ChatRenderer(tokenizer)
    score = advantage_fn(cfg)
    logger = RunLogger(run_dir if main else run_dir / f"rank{rank}", tensorboard=tcfg.tensorboard and main)
    if resumed is not None and tcfg.tensorboard:  # the restored log, into fresh TensorBoard events
        for row in resumed.log_rows():
            step, kind = row.pop("step"), row.pop("kind")
            logger.log(step, row, prefix=kind, jsonl=False)
    log.info("model: %.2fM parameters, vocab %d", sum(p.numel() for p in model.parameters()) / 1e6, len(tokenizer))

    # ---------------------------------------------------------------- warm start
    if resumed is None:
        ws = cfg.agent.warmstart
        ws_losses = warm_start(model, renderer, env_fn(), ws.steps, ws.batch_size, ws.lr, ws.player,
                               seed=cfg.seed, progress=tcfg.progress)
        if ws_losses:
            log.info("warm start: %d steps, loss %.3f -> %.3f", len(ws_losses), ws_losses[0], ws_losses[-1])

    policy = TransformersPolicy(model, tokenizer, seed=cfg.seed + rank)
    train_env_fn, reward_model = env_fn, None
    if cfg.reward_model.steps > 0:  # RL is rewarded by a learned model; evaluation keeps the verifier
        if resumed is None:
            reward_model, report = reward_model_stage(cfg, model, renderer, env_fn)
            logger.log(0, report, prefix="reward_model")
        else:
            reward_model = RewardModel.from_policy(model, tokenizer.pad_token_id)
            reward_model.load_state_dict(resumed.module("reward_model"))
            reward_model.eval().requires_grad_(False)
        train_env_fn = partial(_rm_env, env_fn, reward_model, renderer)
    collector = RolloutCollector(train_env_fn, policy, renderer, cfg.agent.max_context_tokens, tcfg.env_workers)
    eval_collector = RolloutCollector(env_fn, policy, renderer, cfg.agent.max_context_tokens, tcfg.env_workers)
    # ---------------------------------------------------------------- preference stage (optional)
    if cfg.dpo.steps > 0 and resumed is None:
        for i, metrics in enumerate(dpo_stage(cfg, model, renderer, collector), start=1):
            logger.log(i, metrics, prefix="dpo")
    # critic-based estimators: a separate critic model, or a value head on the policy's backbone
    critic = value_head = value_targets = None
    if acfg.advantage in VALUE_TARGETS:
        value_targets = VALUE_TARGETS.get(acfg.advantage)
        if acfg.critic == "separate":
            critic = CriticLearner(Critic.from_policy(model).to(device), acfg, tcfg)
        elif acfg.critic == "shared":
            value_head = new_value_head(model.config.hidden_size).to(device)
        else:
            raise ValueError(f"algorithm.critic must be 'separate' or 'shared', got {acfg.critic!r}")
    learner = Learner(model, acfg, tcfg, value_head=value_head, accelerator=accelerator)
    kl_ctl = KLController(acfg.kl_coef, acfg.kl_target, acfg.kl_horizon)
    entropy_at = partial(SCHEDULES.get(acfg.entropy_schedule), acfg.entropy_coef, acfg.entropy_coef_end,
                         total=tcfg.steps)
    temperature_at = partial(SCHEDULES.get(cfg.agent.temperature_schedule), cfg.agent.temperature,
                             cfg.agent.temperature_end, total=tcfg.steps)
    eval_tasks = heldout_tasks(tcfg.eval_episodes)
    task_rng = np.random.default_rng(cfg.seed)
    result = TrainResult(run_dir=run_dir, model=model, tokenizer=tokenizer)
    warned: set[str] = set()

    def run_eval(step: int) -> None:
        # each process evaluates its share of the held-out tasks; the metrics are of all of them
        metrics = evaluate(eval_collector, shard_list(eval_tasks, world, rank), cfg.agent.max_new_tokens, gather)
        result.evals.append((step, metrics))
        logger.log(step, metrics, prefix="eval")

    def draw_tasks() -> list[Task]:
        return [Task(seed=int(task_rng.integers(2**31)), split="train") for _ in range(tcfg.tasks_per_step)]

    def sampling_at(step: int) -> SamplingParams:  # step is 1-based; schedules count from 0
        return SamplingParams(max_new_tokens=cfg.agent.max_new_tokens, temperature=temperature_at(step=step - 1))

    def save_resumable(step: int, pending: list) -> None:
        """Every process takes part (RNG states are gathered); the main one writes."""
        rngs = {"policy_rng": sampler.rng_state(), "global_rng": global_rng_state()}
        ranks, rollouts = [rngs], [pending]
        if gather is not None:
            ranks, rollouts = gather([rngs]), gather([pending])
        if not main:
            return
        modules, optimizers = _module_states(learner, critic, value_head, reward_model)
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        state = TrainingState(step=step, kl_coef=kl_ctl.value, task_rng=task_rng.bit_generator.state,
                              policy_rng=ranks[0]["policy_rng"], global_rng=ranks[0]["global_rng"],
                              model_training=model.training, dtype=dtype, warned=sorted(warned),
                              ranks=ranks if world > 1 else [])
        path = write_checkpoint(run_dir, state, model, tokenizer, modules, optimizers, _config_yaml(cfg),
                                keep=tcfg.keep_checkpoints, rollouts=rollouts)
        log.info("resumable checkpoint of step %d saved to %s", step, path)

    start, pending = 0, []
    if resumed is not None:  # every module, optimizer and the loop's state as they were at the checkpoint
        _load_module_states(resumed, learner, critic, value_head)
        kl_ctl.value = resumed.state.kl_coef
        task_rng.bit_generator.state = resumed.state.task_rng
        result.train, result.evals = resumed.history()
        warned.update(resumed.state.warned)
        start = resumed.state.step
        pending = resumed.pending_rollouts(rank)
        if pending and not tcfg.async_rollouts:
            raise ValueError(f"{resumed.path} holds in-flight rollouts of an asynchronous run; resume it with "
                             "trainer.async_rollouts=true and the same trainer.max_staleness")
    # the sampler of training rollouts: the learner's own model (synchronous transformers), its
    # copy (asynchronous), a vLLM engine or rollout servers; all but the first take the learner's
    # weights after updates. Evaluation samples from the learner's model, or from the sampler
    # when that is in step with it (synchronous rollouts)
    sampler, pipeline = policy, None
    if tcfg.async_rollouts or cfg.agent.backend != "transformers":
        sampler = rollout_policy(cfg, model, tokenizer, run_dir / ("sampler" if world == 1 else f"sampler{rank}"),
                                 seed=cfg.seed + rank, own_copy=True)
        collector = RolloutCollector(train_env_fn, sampler, renderer, cfg.agent.max_context_tokens,
                                     tcfg.env_workers)
        if not tcfg.async_rollouts:
            eval_collector = RolloutCollector(env_fn, sampler, renderer, cfg.agent.max_context_tokens,
                                              tcfg.env_workers)
    if cfg.agent.backend == "http":  # the servers start from whatever they loaded: give them the learner's weights
        sampler.sync_from(model)
    if cfg.agent.backend != "transformers":  # the sampler must serve the learner's model before anything is sampled
        check = engine_agreement(sampler, model, renderer, env_fn, cfg)
        if resumed is None:  # (a resumed run's log already holds it)
            logger.log(0, check, prefix="engine_check")
    if on_rl_start is not None:
        on_rl_start(model)
    if resumed is None:
        run_eval(0)
    else:  # the RNGs last: nothing draws between here and the next step, as in the uninterrupted run
        policy_rng, global_rng = resumed.state.rank_rngs(rank, world)
        sampler.set_rng_state(policy_rng)
        set_global_rng_state(global_rng)
        log.info("resumed from %s after step %d of %d", resumed.path, start, tcfg.steps)
    if tcfg.async_rollouts:
        def collect_step(step: int) -> tuple[list[Task], list]:
            tasks = draw_tasks()
            return tasks, collector.collect(shard_list(tasks, world, rank), tcfg.group_size, sampling_at(step))

        state_of = None
        if cfg.agent.backend != "transformers":
            from turnrl.agents.weights import merged_state_dict as state_of
        pipeline = AsyncRollouts(collect_step, sampler.load_weights, tcfg.max_staleness, first=start + 1 + len(pending),
                                 last=tcfg.steps, version=start, pending=pending, state_of=state_of)
    # ---------------------------------------------------------------- the RL loop
    bar = tqdm(range(start + 1, tcfg.steps + 1), initial=start, total=tcfg.steps, desc="RL", unit="step",
               disable=not tcfg.progress)
    try:
        for step in bar:
            t0 = time.perf_counter()
            # this step's coefficients; the learner scores at the temperature the sampler used
            step_coefs = StepCoefs(temperature=sampling_at(step).temperature, entropy_coef=entropy_at(step=step - 1),
                                   kl_coef=kl_ctl.value)
            if pipeline is None:
                tasks = draw_tasks()
                trajectories = collector.collect(shard_list(tasks, world, rank), tcfg.group_size, sampling_at(step))
                t_rollout = t_wait = time.perf_counter() - t0
                lag = 0
            else:  # sampled in the background with the weights of update max(0, step - 1 - k)
                rollouts, t_wait = pipeline.next(step)
                trajectories, t_rollout, lag = rollouts.trajectories, rollouts.rollout_time, rollouts.staleness
            if cfg.agent.backend == "http":  # refuse turns that are not token-exact
                assert_trainable(trajectories)
            batch = collate(trajectories, tokenizer.pad_token_id, cfg.algorithm.state_similarity)
            coefs = {"kl_coef": kl_ctl.value, "entropy_coef": step_coefs.entropy_coef,
                     "temperature": step_coefs.temperature}
            reward_kl = None
            if acfg.kl_placement == "reward" and learner.ref_model is not None:
                ref_kl = learner.reference_kl(batch, step_coefs.temperature).cpu()  # before this step's update
                reward_kl = float(all_reduce(ref_kl.sum()) / all_reduce(batch.loss_mask.sum()).clamp(min=1.0))
                batch, penalty = kl_penalized(batch, ref_kl, kl_ctl.value)
                coefs["kl_reward_penalty"] = float(penalty.mean())
            returns = None
            if value_targets is not None:
                batch.values = critic.values(batch) if critic is not None else learner.values(batch)
                returns = value_targets(batch, **acfg.advantage_kwargs)
            advantages = score(batch)
            if cfg.agent.vllm.sleep_during_update:  # the colocated engine frees its memory for the update
                sampler.sleep(level=2)
            update = learner.update(batch, advantages, returns if value_head is not None else None,
                                    coefs=step_coefs)
            if pipeline is None and sampler is not policy:  # the engine samples the next step with these weights
                if cfg.agent.vllm.sleep_during_update:
                    sampler.wake_up()
                sampler.sync_from(model)
            if critic is not None:
                update.update(critic.update(batch, returns, batch.values))
            checkpoint_due = bool(tcfg.checkpoint_every) and step % tcfg.checkpoint_every == 0
            if pipeline is not None and not checkpoint_due:  # the sampler may move on to these weights
                pipeline.publish(step, model)
            if reward_kl is not None:
                update["kl"] = reward_kl
            if gather is not None:  # every process's rollouts, for the step's figures
                trajectories = gather(trajectories)
            kl_ctl.update(update["kl"], len(trajectories))
            metrics = {**rollout_metrics(trajectories), **update, **coefs, "policy_lag": float(lag),
                       "step_time": time.perf_counter() - t0, "rollout_time": t_rollout, "rollout_wait": t_wait}
            result.train.append({"step": step, **metrics})
            logger.log(step, metrics)
            bar.set_postfix(reward=f"{metrics['reward']:.2f}", heldout=f"{result.evals[-1][1]['success']:.2f}")
            if step % tcfg.eval_every == 0 or step == tcfg.steps:
                run_eval(step)
            _warn_once(metrics, cfg, warned)
            if checkpoint_due:  # async: the next k steps' rollouts finish and are saved with it
                save_resumable(step, [] if pipeline is None else pipeline.drain(step))
                if pipeline is not None:
                    pipeline.publish(step, model)
    except KeyboardInterrupt:  # keep what was computed: evaluate, save and report below
        log.warning("interrupted after %d RL steps; evaluating and saving what there is", len(result.train))
        if result.evals[-1][0] != len(result.train):
            run_eval(len(result.train))
    finally:
        if pipeline is not None:
            pipeline.close()
        if callable(getattr(sampler, "close", None)):
            sampler.close()
    bar.close()

    # ---------------------------------------------------------------- wrap-up
    if accelerator is not None:
        accelerator.wait_for_everyone()
    if not main:
        logger.close()
        return result
    if tcfg.save_checkpoint:
        save_checkpoint(run_dir / "checkpoint", model, tokenizer, learner.optimizer, len(result.train))
    plot_curves(result.train, result.evals, run_dir / "curves.png")
    table = before_after_table([e for _, e in result.evals])
    (run_dir / "summary.txt").write_text(table + "\n")
    (run_dir / "evals.json").write_text(json.dumps([{"step": s, **e} for s, e in result.evals], indent=1))
    logger.close()
    print(table, flush=True)
    return result


def _checkpoint_to_resume(cfg: Config, run_dir: Path) -> Checkpoint | None:
    """The checkpoint ``trainer.resume`` names (None: start fresh), checked against ``run_dir``."""
    path = resolve_resume(cfg.trainer.resume, run_dir)
    if path is None:
        if cfg.trainer.resume and str(cfg.trainer.resume).lower() in ("true", "latest"):
            log.info("trainer.resume: no checkpoint in %s yet, starting fresh", run_dir)
        return None
    ckpt = read_checkpoint(path)
    step = ckpt.state.step
    clash = [p for s, p in checkpoint_steps(run_dir).items()
             if s > step or (s == step and p.resolve() != path.resolve())]
    if clash:
        names = [p.name for p in clash]
        raise ValueError(f"run dir {run_dir} holds checkpoints {names} not older than the one resumed "
                         f"({path}, step {step}); resume from the run dir's latest checkpoint (trainer.resume=true), "
                         "or into a fresh run dir")
    changed = _config_changes(ckpt.config_yaml, cfg)
    if changed:
        log.warning("resuming %s with a config that differs from the saved one in %s; the run will not be the one "
                    "the checkpoint was heading to", path, changed)
    return ckpt


def _config_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _config_changes(saved_yaml: str, cfg: Config) -> list[str]:
    """Dotted keys whose value differs between a saved config and ``cfg`` (resume and progress aside)."""
    def flat(node, prefix=""):
        if isinstance(node, dict):
            return {k: v for key, child in node.items() for k, v in flat(child, f"{prefix}{key}.").items()}
        return {prefix[:-1]: node}

    saved = flat(OmegaConf.to_container(OmegaConf.create(saved_yaml)))
    now = flat(OmegaConf.to_container(OmegaConf.create(_config_yaml(cfg))))
    ignored = {"trainer.resume", "trainer.progress"}
    return sorted(k for k in saved.keys() | now.keys() if k not in ignored and saved.get(k) != now.get(k))


def _module_states(learner: Learner, critic: CriticLearner | None, value_head, reward_model) -> tuple[dict, dict]:
    """State dicts of every module besides the policy, and of every optimizer, by name."""
    modules, optimizers = {}, {"policy": learner.optimizer.state_dict()}
    if learner.ref_model is not None:
        modules["ref_model"] = learner.ref_model.state_dict()
    if value_head is not None:
        modules["value_head"] = value_head.state_dict()
    if critic is not None:
        modules["critic"] = critic.critic.state_dict()
        optimizers["critic"] = critic.optimizer.state_dict()
    if reward_model is not None:
        modules["reward_model"] = reward_model.state_dict()
    return modules, optimizers


def _load_module_states(ckpt: Checkpoint, learner: Learner, critic: CriticLearner | None, value_head) -> None:
    """Load what ``_module_states`` saved (the reward model is loaded where it is built)."""
    learner.optimizer.load_state_dict(ckpt.optimizer("policy"))
    if learner.ref_model is not None:
        learner.ref_model.load_state_dict(ckpt.module("ref_model"))
    if value_head is not None:
        value_head.load_state_dict(ckpt.module("value_head"))
    if critic is not None:
        critic.critic.load_state_dict(ckpt.module("critic"))
        critic.optimizer.load_state_dict(ckpt.optimizer("critic"))


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


def engine_agreement(sampler, model, renderer: ChatRenderer, env_fn: Callable, cfg: Config, episodes: int = 8) -> dict:
    """The start-up check of a vLLM or served sampler: sample first turns of ``episodes`` train
    tasks with it, score them with the learner's ``model``, and return ``max_abs`` / ``mean_abs``
    logprob differences and the token count.

    Raises:
        ValueError: If ``max_abs`` exceeds ``agent.logprob_tolerance`` (the sampler does not
            serve the learner's model, or at another precision than the tolerance allows).
    """
    from turnrl.agents.vllm_policy import logprob_agreement

    env = env_fn()
    prompts = [renderer.start(list(env.reset(seed=i, options={"split": "train"})[0])).token_ids
               for i in range(episodes)]
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

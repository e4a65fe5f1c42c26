"""``turnrl eval``: evaluate a policy on held-out tasks with any backend.

What is evaluated (``resolve_checkpoint``): a run folder, one of its resumable checkpoints or
any ``save_pretrained`` folder; the run's saved config makes the env, chat format and token
limits those the policy was trained with (``eval_config``), and Hydra overrides change them
as for training. The policy is built by the training builders (``turnrl.train.factories``), so every
``agent.backend`` (``transformers``, ``vllm``, ``http``) evaluates as it trains. A checkpoint
that holds a learned reward model rewards the env with it (``RewardModelReward``), so the
report compares it with the verifier.

``run_eval`` plays ``episodes`` held-out tasks (``turnrl.train.evaluation.heldout_tasks``: the test
split seeds training evaluates on) once greedily and ``samples`` times at ``temperature``,
and returns an ``EvalReport`` with the trajectories; ``write_outputs`` saves ``eval.json``,
``eval.md`` and ``eval_episodes.jsonl`` (one line per episode).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import gymnasium
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from turnrl.chat.renderer import ChatRenderer
from turnrl.policies.sampling import SamplingParams
from turnrl.train.checkpoint import CHECKPOINTS_DIR, MODEL_DIR, STATE_FILE, latest_checkpoint, read_checkpoint
from turnrl.conf.schema import Config
from turnrl.eval.report import EvalReport, episode_stats, pass_at_ks
from turnrl.train.evaluation import heldout_tasks
from turnrl.rollout.collector import RolloutCollector, Task
from turnrl.rollout.trajectory import Trajectory
from turnrl.algorithms.pre_rl.reward_model import RewardModel
from turnrl.conf.schema import register_configs
from turnrl.conf.validate import validate
from turnrl.train.factories import build_agent, env_factory, rollout_policy
from turnrl.train.reward_model_env import RewardModelReward

FINAL_MODEL_DIR = "checkpoint"  # where a finished run saves its final model (turnrl.train.recorder.Recorder.finish)
RUN_CONFIG_FILES = ("config.yaml", ".hydra/config.yaml")  # a run folder's saved config, first found wins
CONFIG_GROUPS = ("env", "agent", "algorithm", "trainer", "experiment")  # Hydra's config groups (turnrl/conf)


@dataclass(frozen=True)
class EvalTarget:
    """A trained policy found on disk.

    Attributes:
        model_dir: the ``save_pretrained`` folder of the model and its tokenizer.
        config_yaml: the config of the run that trained it, or None (a bare model folder).
        reward_model: the state dict of the run's learned reward model, or None.
    """

    model_dir: Path
    config_yaml: str | None = None
    reward_model: dict | None = None


def resolve_checkpoint(path: str | Path) -> EvalTarget:
    """What ``--checkpoint PATH`` names:

    - a run folder (``checkpoint/`` and/or ``checkpoints/step-*``): its final model
      (``checkpoint/``, else the latest resumable checkpoint's) and its config (``config.yaml``,
      else Hydra's ``.hydra/config.yaml``, else the latest checkpoint's);
    - a resumable checkpoint (``checkpoints/step-N``, with ``state.pt``): its model and config;
    - a ``save_pretrained`` folder (``config.json``): the model; a run's config when the
      folder is a run's ``checkpoint/`` or a resumable checkpoint's ``model/``.

    A learned reward model comes from the resumable checkpoint used (or the run's latest).

    Raises:
        ValueError: If ``path`` is none of these.
    """
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return _from_resumable(path, path / MODEL_DIR)
    if (path / "config.json").is_file():
        parent = path.parent
        if path.name == MODEL_DIR and (parent / STATE_FILE).is_file():
            return _from_resumable(parent, path)
        if path.name == FINAL_MODEL_DIR:
            return _from_run(parent, path)
        return EvalTarget(path)
    if (path / FINAL_MODEL_DIR / "config.json").is_file() or latest_checkpoint(path) is not None:
        return _from_run(path, path / FINAL_MODEL_DIR)
    raise ValueError(f"--checkpoint {str(path)!r} is not a checkpoint: expected a run folder (with {FINAL_MODEL_DIR}/ "
                     f"or {CHECKPOINTS_DIR}/step-*), a resumable checkpoint ({CHECKPOINTS_DIR}/step-N with "
                     f"{STATE_FILE}) or a save_pretrained folder (with config.json); for a model by hub id or a "
                     "folder of another layout use agent.path=... instead")


def _from_resumable(ckpt_dir: Path, model_dir: Path) -> EvalTarget:
    ckpt = read_checkpoint(ckpt_dir)
    return EvalTarget(model_dir, ckpt.config_yaml, ckpt.modules.get("reward_model"))


def _from_run(run_dir: Path, model_dir: Path) -> EvalTarget:
    latest = latest_checkpoint(run_dir)
    ckpt = read_checkpoint(latest) if latest is not None else None
    if not (model_dir / "config.json").is_file():  # no final model (the run was stopped): its latest checkpoint's
        model_dir = latest / MODEL_DIR
    saved = next((run_dir / name for name in RUN_CONFIG_FILES if (run_dir / name).is_file()), None)
    config = saved.read_text(encoding="utf-8") if saved else ckpt.config_yaml if ckpt else None
    return EvalTarget(model_dir, config, ckpt.modules.get("reward_model") if ckpt else None)


def eval_config(target: EvalTarget | None, overrides: Sequence[str]) -> Config:
    """The config to evaluate with: the run's saved config (or, without one, the default
    composition of ``turnrl/conf``), the target's model as ``agent.path``, then
    ``overrides`` (Hydra syntax, as for ``python -m turnrl.train``).

    Raises:
        ValueError: On a group choice (``env=calc_math``) over a run's saved config (its env is
            the run's: override its keys instead), ``agent.path`` set beside ``--checkpoint``,
            a sweep, or an invalid config (``turnrl.conf.validate``).
    """
    from hydra import compose, initialize_config_module
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    for o in parsed:
        if o.is_sweep_override():
            raise ValueError(f"{o.input_line!r} is a sweep; turnrl eval evaluates one config: give one value")
    keys = {o.key_or_group for o in parsed}
    if target is not None and "agent.path" in keys:
        raise ValueError("--checkpoint and agent.path both name the model to evaluate; give one of them")
    if target is not None and target.config_yaml is not None:
        groups = [o.input_line for o in parsed if o.key_or_group in CONFIG_GROUPS]
        if groups:
            raise ValueError(f"{groups}: the checkpoint's run fixes its config groups (env, agent, ...); override "
                             "their keys instead (e.g. env.kwargs.n=64), or evaluate its model folder with "
                             "agent.path=... and the groups you want")
        cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(target.config_yaml))
        cfg.agent.path = str(target.model_dir)
        for o in parsed:
            if o.is_delete():
                raise ValueError(f"{o.input_line!r}: deleting keys is not supported over a saved run config")
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True, force_add=o.is_add())
    else:
        register_configs()
        with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
        if target is not None:
            cfg.agent.path = str(target.model_dir)
    config: Config = OmegaConf.to_object(cfg)
    validate(config)
    return config


def run_eval(cfg: Config, target: EvalTarget | None = None, *, episodes: int, samples: int, ks: Sequence[int],
             temperature: float | None = None, greedy: bool = True, batch_tasks: int = 32,
             progress: bool = True) -> tuple[EvalReport, list[Trajectory], list[Trajectory]]:
    """Evaluate ``cfg``'s policy (``agent.path``, or the tiny model ``cfg`` builds) on
    ``episodes`` held-out tasks with ``cfg.agent.backend``.

    Args:
        cfg: the config (``eval_config``).
        target: the checkpoint (its reward model, if any, rewards the env), or None.
        episodes: held-out tasks (seeds of ``heldout_tasks(episodes)``, split ``test``).
        samples: sampled episodes per task (0: none; then no pass@k).
        ks: the k of pass@k; each at most ``samples``.
        temperature: of the sampled episodes; None: ``cfg.agent.temperature``.
        greedy: also play one greedy episode per task.
        batch_tasks: tasks per rollout batch (each ``samples`` rows when sampling).
        progress: show a progress bar over episodes.

    Returns:
        ``(report, greedy_trajectories, sampled_trajectories)``; the sampled ones grouped by
        task: rows ``i*samples .. i*samples+samples-1`` are task ``i``'s.

    Raises:
        ValueError: On no episode set to play, a k above ``samples``, or as the builders do.
    """

    ks = sorted(set(ks))
    _check_plan(episodes, samples, ks, greedy, batch_tasks)
    temperature = cfg.agent.temperature if temperature is None else temperature
    env_fn = env_factory(cfg)
    model, tokenizer = build_agent(cfg, env_fn)
    model.to(cfg.trainer.device).eval()
    renderer = ChatRenderer(tokenizer, cfg.agent.chat_format, cfg.agent.template_kwargs)
    if target is not None and target.reward_model is not None:
        env_fn = _rewarded_by(env_fn, model, tokenizer, renderer, target.reward_model)
    tasks = heldout_tasks(episodes)
    with tempfile.TemporaryDirectory(prefix="turnrl-eval-") as workdir:  # a vLLM engine's copy of the model
        policy = rollout_policy(cfg, model, tokenizer, workdir, seed=cfg.seed, own_copy=False, pushes=False)
        collector = RolloutCollector.for_run(cfg, env_fn, policy, renderer)
        total = episodes * (int(greedy) + samples)
        bar = tqdm(total=total, desc="eval", unit="episode", disable=not progress)
        started = time.perf_counter()
        try:
            greedy_params = SamplingParams(max_new_tokens=cfg.agent.max_new_tokens, greedy=True)
            sampled_params = SamplingParams(max_new_tokens=cfg.agent.max_new_tokens, temperature=temperature)
            greedy_trajs = _play(collector, tasks, 1, greedy_params, batch_tasks, bar) if greedy else []
            sampled_trajs = _play(collector, tasks, samples, sampled_params, batch_tasks, bar) if samples else []
        finally:
            bar.close()
            policy.close()
        wall = time.perf_counter() - started
    correct = [sum(t.success for t in sampled_trajs[i * samples:(i + 1) * samples]) for i in range(episodes)]
    report = EvalReport(
        model=str(cfg.agent.path or "the tiny model of the config (untrained)"), backend=cfg.agent.backend,
        env=str(cfg.env.url or cfg.env._target_ or cfg.env.id), split=tasks[0].split, tasks=episodes,
        samples=samples, max_new_tokens=cfg.agent.max_new_tokens,
        greedy=episode_stats(greedy_trajs, None) if greedy else None,
        sampled=episode_stats(sampled_trajs, temperature) if samples else None,
        pass_at_k=pass_at_ks(correct, samples, ks) if samples else {}, wall_time_s=wall)
    return report, greedy_trajs, sampled_trajs


def _check_plan(episodes: int, samples: int, ks: Sequence[int], greedy: bool, batch_tasks: int) -> None:
    if episodes < 1 or samples < 0 or batch_tasks < 1:
        raise ValueError(f"need episodes >= 1, samples >= 0 and batch_tasks >= 1; got {episodes}, {samples}, "
                         f"{batch_tasks}")
    if not greedy and not samples:
        raise ValueError("nothing to evaluate: no greedy episodes and samples=0; sample episodes (--samples N) or "
                         "keep the greedy ones")
    bad = [k for k in ks if not 1 <= k <= samples]
    if bad:
        raise ValueError(f"pass@k for k={bad} needs 1 <= k <= samples per task ({samples}); raise --samples to "
                         f"{max(bad)} or drop those k")


def _play(collector: RolloutCollector, tasks: list[Task], group_size: int, params: SamplingParams,
          batch_tasks: int, bar) -> list[Trajectory]:
    """``group_size`` episodes of each task, ``batch_tasks`` tasks per rollout batch."""
    out = []
    for start in range(0, len(tasks), batch_tasks):
        out += collector.collect(tasks[start:start + batch_tasks], group_size, params)
        bar.update(len(tasks[start:start + batch_tasks]) * group_size)
    return out


def _rewarded_by(env_fn: Callable[[], gymnasium.Env], model, tokenizer, renderer: ChatRenderer,
                 state_dict: dict) -> Callable[[], gymnasium.Env]:
    """``env_fn`` with its rewards given by the saved reward model (the verifier's in info)."""
    reward_model = RewardModel.from_policy(model, tokenizer.pad_token_id)
    reward_model.load_state_dict(state_dict)
    reward_model.eval().requires_grad_(False)
    return lambda: RewardModelReward(env_fn(), reward_model, renderer)


def episode_rows(trajectories: Sequence[Trajectory], tasks: int, mode: str) -> list[dict]:
    """One JSON-able row per episode: its task, sample index and figures (``eval_episodes.jsonl``)."""
    per_task = len(trajectories) // max(tasks, 1)
    task_list = heldout_tasks(tasks)
    return [{"mode": mode, "task_seed": task_list[i // per_task].seed, "task_id": t.task_id, "sample": i % per_task,
             "success": t.success, "reward": t.reward, "verifier_reward": t.verifier_reward, "turns": t.num_turns,
             "gen_tokens": t.num_generated_tokens, "tool_calls": t.tool_calls, "tool_errors": t.tool_errors,
             "parse_errors": t.parse_errors, "termination": t.termination}
            for i, t in enumerate(trajectories)]


def write_outputs(report: EvalReport, greedy: Sequence[Trajectory], sampled: Sequence[Trajectory],
                  out: str | Path) -> Path:
    """Write ``eval.json``, ``eval.md`` and ``eval_episodes.jsonl`` into ``out`` (created);
    returns ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(report.to_json() + "\n", encoding="utf-8")
    (out / "eval.md").write_text(report.to_markdown() + "\n", encoding="utf-8")
    rows = episode_rows(greedy, report.tasks, "greedy") + episode_rows(sampled, report.tasks, "sampled")
    (out / "eval_episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return out

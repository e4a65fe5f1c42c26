"""A run's fixed context: its processes, env factory, policy model, logger and, when it
resumes, the checkpoint it continues. Built once by ``start_run``; every later stage of
``turnrl.train.loop.train`` reads from it and nothing in it is replaced during the run."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gymnasium
import torch
import yaml
from omegaconf import OmegaConf

from turnrl.algorithms import distributed
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.models.causal_lm import load_pretrained
from turnrl.chat.renderer import ChatRenderer
from turnrl.train.factories import agent_tool_parser, build_agent, env_factory
from turnrl.train.checkpoint import (Checkpoint, checkpoint_steps, read_checkpoint, resolve_resume, restore_log,
                               set_aside_log)
from turnrl.conf.schema import Config
from turnrl.train.logger import RunLogger
from turnrl.train.trackers import chosen, open_trackers
from turnrl.train.warm_start import cached

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Processes:
    """The processes a run is spread over (one without ``trainer.accelerate``).

    Attributes:
        accelerator: the ``accelerate.Accelerator`` under ``accelerate launch``, else None.
        rank: this process's index; ``world``: how many there are.
        gather: ``gather(list) -> list`` of every process's items in rank order (None with one).
        device: where this process's modules live.
    """

    accelerator: object = None
    rank: int = 0
    world: int = 1
    gather: Callable[[list], list] | None = None
    device: str | torch.device = "cpu"

    @property
    def main(self) -> bool:
        """Whether this process writes the run's files."""
        return self.rank == 0

    @classmethod
    def start(cls, cfg: Config) -> Processes:
        """One process, or this one of ``accelerate launch``'s (``trainer.accelerate``).

        Raises:
            ValueError: If a step's tasks cannot give every process at least one.
        """
        if not cfg.trainer.accelerate:
            return cls(device=cfg.trainer.device)
        from accelerate import Accelerator
        from accelerate.utils import gather_object

        accelerator = Accelerator(cpu=cfg.trainer.device == "cpu")
        world = accelerator.num_processes
        if cfg.trainer.tasks_per_step < world:
            raise ValueError(f"trainer.tasks_per_step={cfg.trainer.tasks_per_step} < {world} processes: each process "
                             "needs at least one task per step; raise trainer.tasks_per_step or launch fewer processes")
        return cls(accelerator, accelerator.process_index, world, gather_object, accelerator.device)


@dataclass
class Run:
    """What every stage of a run shares.

    Attributes:
        cfg: the composed config; ``run_dir``: where the run writes.
        procs: the processes (``Processes``).
        env_fn: makes one env of ``cfg.env`` (evaluation always uses it: the verifier's reward).
        model, tokenizer, renderer: the policy being trained (built, loaded from ``agent.path``
            or from the resumed checkpoint), on ``procs.device``.
        policy: a ``TransformersPolicy`` over ``model`` itself, seeded ``seed + rank``.
        logger: the metrics log (this process's; the main one writes ``metrics.jsonl``).
        resumed: the checkpoint this run continues (``trainer.resume``), or None.
        warm_cached: the ``agent.warmstart.cache`` entry the model was loaded from (its warm
            start is done), or None.
    """

    cfg: Config
    run_dir: Path
    procs: Processes
    env_fn: Callable[[], gymnasium.Env]
    model: torch.nn.Module
    tokenizer: object
    renderer: ChatRenderer
    policy: TransformersPolicy
    logger: RunLogger
    resumed: Checkpoint | None = None
    warm_cached: Path | None = None


def start_run(cfg: Config, run_dir: str | Path) -> Run:
    """Processes, seeds, the env factory, the policy model and the logger of a run.

    A resumed run loads the checkpoint's model and rewrites the run's log up to it (main
    process); a fresh one builds the model (``build_agent``).

    Raises:
        ValueError: If ``trainer.resume`` names no checkpoint, or the run dir holds newer ones.
    """
    run_dir = Path(run_dir)
    resumed = checkpoint_to_resume(cfg, run_dir)
    procs = Processes.start(cfg)
    distributed.set_torch_threads(cfg.trainer.threads)
    torch.manual_seed(cfg.seed)
    env_fn = env_factory(cfg)
    warm_cached = cached(cfg) if resumed is None else None
    if warm_cached is not None:  # a run with the same settings warm-started this model
        log.info("warm start: reusing %s", warm_cached)
        model, tokenizer = load_pretrained(str(warm_cached), cfg.agent.dtype if cfg.agent.path else "float32")
    elif resumed is None:
        model, tokenizer = build_agent(cfg, env_fn)
    else:  # the policy as it was at the checkpoint, and the run's log up to it
        model, tokenizer = load_pretrained(str(resumed.model_dir), resumed.state.dtype)
        model.train(resumed.state.model_training)
        if procs.main:
            restore_log(run_dir, resumed)
    if resumed is None and cfg.trainer.resume and procs.main:  # nothing to resume yet: a fresh log
        set_aside_log(run_dir)
    model.to(procs.device)
    trackers = []
    if procs.main and chosen(cfg.logger):
        text = config_yaml(cfg)
        trackers = open_trackers(cfg.logger, run_dir, yaml.safe_load(text), text)
    logger = RunLogger(run_dir if procs.main else run_dir / f"rank{procs.rank}",
                       tensorboard=cfg.trainer.tensorboard and procs.main, trackers=trackers)
    if resumed is not None and (cfg.trainer.tensorboard or trackers):  # the restored log, into fresh TensorBoard
        # events and tracker runs
        for row in resumed.log_rows():
            step, kind = row.pop("step"), row.pop("kind")
            logger.log(step, row, prefix=kind, jsonl=False)
    log.info("model: %.2fM parameters, vocab %d", sum(p.numel() for p in model.parameters()) / 1e6, len(tokenizer))
    policy = TransformersPolicy(model, tokenizer, seed=cfg.seed + procs.rank, prefix_cache=cfg.agent.prefix_cache)
    renderer = ChatRenderer(tokenizer, cfg.agent.chat_format, cfg.agent.template_kwargs)
    chat = {"chat_format": renderer.format.name, "tool_parser": agent_tool_parser(cfg),
            "asked": {"chat_format": cfg.agent.chat_format, "tool_parser": cfg.agent.tool_parser}}
    log.info("chat format %s, tool parser %s (agent.chat_format=%s, agent.tool_parser=%s)", chat["chat_format"],
             chat["tool_parser"], cfg.agent.chat_format, cfg.agent.tool_parser)
    if procs.main:  # what `auto` chose, kept with the run
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "chat.json").write_text(json.dumps(chat, indent=1) + "\n", encoding="utf-8")
    return Run(cfg, run_dir, procs, env_fn, model, tokenizer, renderer, policy, logger, resumed, warm_cached)


def checkpoint_to_resume(cfg: Config, run_dir: Path) -> Checkpoint | None:
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
    changed = config_changes(ckpt.config_yaml, cfg)
    if changed:
        log.warning("resuming %s with a config that differs from the saved one in %s; the run will not be the one "
                    "the checkpoint was heading to", path, changed)
    return ckpt


def config_yaml(cfg: Config) -> str:
    """The config as saved beside checkpoints."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def config_changes(saved_yaml: str, cfg: Config) -> list[str]:
    """Dotted keys whose value differs between a saved config and ``cfg`` (resume and progress aside)."""
    def flat(node, prefix=""):
        if isinstance(node, dict):
            return {k: v for key, child in node.items() for k, v in flat(child, f"{prefix}{key}.").items()}
        return {prefix[:-1]: node}

    saved = flat(OmegaConf.to_container(OmegaConf.create(saved_yaml)))
    now = flat(OmegaConf.to_container(OmegaConf.create(config_yaml(cfg))))
    ignored = {"trainer.resume", "trainer.progress"}
    return sorted(k for k in saved.keys() | now.keys() if k not in ignored and saved.get(k) != now.get(k))

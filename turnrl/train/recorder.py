"""What a run keeps of each step: the metrics log, held-out evaluations, resumable
checkpoints, once-per-run warnings, and at the end the final model, curves and table.

``Recorder.begin`` starts the history (a fresh run's step-0 evaluation, or a checkpoint's
restored state), ``record`` takes one finished step, ``finish`` writes the run's outputs.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from turnrl.train import checkpoint
from turnrl.train.algorithm import Algorithm
from turnrl.algorithms.learner.learner import StepCoefs
from turnrl.algorithms.credit.assign import Credited
from turnrl.algorithms.distributed import shard_list
from turnrl.train.evaluation import evaluate, heldout_tasks
from turnrl.train.report import after_value, before_after_table, plot_curves
from turnrl.rollout.collector import RolloutCollector
from turnrl.rollout.metrics import rollout_metrics
from turnrl.rollout.pipeline import RolloutBatch
from turnrl.train.setup import Run, config_yaml
from turnrl.train.stages import PreRL

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


class Recorder:
    """Keeps the run's history and writes its files (the main process writes; every process
    takes part in evaluations and checkpoints, which gather across processes).

    Args:
        run: the run.
        stages: the pre-RL stages' output (a learned reward model is checkpointed).
        algorithm: the algorithm (checkpointed; its KL controller observes each step's KL).
        source: the rollout source (checkpointed; ``eval_policy`` samples the evaluations).
    """

    def __init__(self, run: Run, stages: PreRL, algorithm: Algorithm, source):
        self.run, self.stages, self.algorithm, self.source = run, stages, algorithm, source
        cfg, procs = run.cfg, run.procs
        self.result = TrainResult(run_dir=run.run_dir, model=run.model, tokenizer=run.tokenizer)
        self.warned: set[str] = set()
        self.eval_collector = RolloutCollector.for_run(cfg, run.env_fn, source.eval_policy, run.renderer)
        self.eval_tasks = shard_list(heldout_tasks(cfg.trainer.eval_episodes), procs.world, procs.rank)
        self.bar = None

    def begin(self) -> range:
        """Evaluate the policy before RL (fresh run) or restore the checkpoint's state
        (resumed run: the last call before the loop, since it restores the RNGs); returns the
        steps still to run, with a progress bar over them."""
        run, steps = self.run, self.run.cfg.trainer.steps
        start = 0
        if run.resumed is None:
            self.evaluate(0)
        else:
            restored = checkpoint.restore(run.resumed, algorithm=self.algorithm, source=self.source,
                                          rank=run.procs.rank, world=run.procs.world)
            self.result.train, self.result.evals = restored.train, restored.evals
            self.warned.update(restored.warned)
            start = restored.step
            log.info("resumed from %s after step %d of %d", run.resumed.path, start, steps)
        self.bar = tqdm(range(start + 1, steps + 1), initial=start, total=steps, desc="RL", unit="step",
                        disable=not run.cfg.trainer.progress)
        return self.bar

    def evaluate(self, step: int) -> None:
        """Greedy episodes on the held-out tasks (each process its share; metrics of all)."""
        metrics = evaluate(self.eval_collector, self.eval_tasks, self.run.cfg.agent.max_new_tokens,
                           self.run.procs.gather)
        self.result.evals.append((step, metrics))
        self.run.logger.log(step, metrics, prefix="eval")

    def record(self, step: int, rollouts: RolloutBatch, waited: float, credited: Credited, update: dict,
               coefs: StepCoefs, started: float) -> None:
        """Log step ``step`` (its rollouts, credit, update figures and timings since
        ``started``), then evaluate and checkpoint when due."""
        cfg, procs = self.run.cfg, self.run.procs
        trajectories = rollouts.trajectories
        if procs.gather is not None:  # every process's rollouts, for the step's figures
            trajectories = procs.gather(trajectories)
        self.algorithm.observe_kl(update["kl"], len(trajectories))
        metrics = {**rollout_metrics(trajectories), **update, "kl_coef": coefs.kl_coef, "entropy_coef": coefs.entropy_coef,
                   "temperature": coefs.temperature, **credited.metrics,
                   "policy_lag": float(rollouts.staleness), "step_time": time.perf_counter() - started,
                   "rollout_time": rollouts.rollout_time, "rollout_wait": waited}
        metrics["nonfinite_updates_total"] = nonfinite_total(self.result.train, metrics)
        self.result.train.append({"step": step, **metrics})
        self.run.logger.log(step, metrics)
        self.bar.set_postfix(reward=f"{metrics['reward']:.2f}", heldout=f"{self.result.evals[-1][1]['success']:.2f}")
        if step % cfg.trainer.eval_every == 0 or step == cfg.trainer.steps:
            self.evaluate(step)
        self._warn_once(metrics)
        if checkpoint.is_due(step, cfg.trainer.checkpoint_every):  # async: in-flight rollouts finish and are saved
            self.save(step)

    def save(self, step: int) -> None:
        """A resumable checkpoint after update ``step`` (see ``turnrl.train.checkpoint``)."""
        run, procs = self.run, self.run.procs
        extra = {} if self.stages.reward_model is None else {"reward_model": self.stages.reward_model.state_dict()}
        path = checkpoint.save(run.run_dir, step, model=run.model, tokenizer=run.tokenizer, algorithm=self.algorithm,
                               source=self.source, warned=self.warned, config_yaml=config_yaml(run.cfg),
                               keep=run.cfg.trainer.keep_checkpoints, pending=self.source.drain(step),
                               extra_modules=extra, rank=procs.rank, world=procs.world, gather=procs.gather)
        if path is not None:
            log.info("resumable checkpoint of step %d saved to %s", step, path)

    def interrupted(self) -> None:
        """Keep what was computed after Ctrl-C: evaluate the last step (the outputs follow)."""
        log.warning("interrupted after %d RL steps; evaluating and saving what there is", len(self.result.train))
        if self.result.evals[-1][0] != len(self.result.train):
            self.evaluate(len(self.result.train))

    def finish(self) -> TrainResult:
        """The run's outputs (main process): the final model and tokenizer (``checkpoint/``,
        ``trainer.save_checkpoint``), the run's config (``config.yaml``: ``turnrl eval`` reads
        it), ``curves.png``, ``summary.txt``, ``evals.json``; prints the before/after table."""
        run, result = self.run, self.result
        if self.bar is not None:
            self.bar.close()
        if run.procs.accelerator is not None:
            run.procs.accelerator.wait_for_everyone()
        if run.procs.main:
            if run.cfg.trainer.save_checkpoint:
                run.model.save_pretrained(run.run_dir / "checkpoint")
                run.tokenizer.save_pretrained(run.run_dir / "checkpoint")
            (run.run_dir / "config.yaml").write_text(config_yaml(run.cfg), encoding="utf-8")  # for turnrl eval
            plot_curves(result.train, result.evals, run.run_dir / "curves.png")
            table = before_after_table([e for _, e in result.evals])
            (run.run_dir / "summary.txt").write_text(table + "\n")
            (run.run_dir / "evals.json").write_text(json.dumps([{"step": s, **e} for s, e in result.evals], indent=1))
            print(table, flush=True)
        run.logger.close()
        return result

    def _warn_once(self, metrics: dict) -> None:
        warn_once(metrics, self.run.cfg, self.warned)


def nonfinite_total(history: list[dict], metrics: dict) -> float:
    """Optimizer steps (the policy's and a separate critic's) skipped for a NaN or inf in the
    loss or the gradient since the run began: the previous step's total in ``history`` (the
    metrics log, restored on resume) plus this step's ``nonfinite_updates`` and
    ``critic_nonfinite_updates``."""
    before = history[-1].get("nonfinite_updates_total", 0.0) if history else 0.0
    return before + metrics.get("nonfinite_updates", 0.0) + metrics.get("critic_nonfinite_updates", 0.0)


def warn_once(metrics: dict, cfg, warned: set[str]) -> None:
    """Say so (once per run) when most turns are cut, nearly every action is empty, most tool calls
    fail to parse, the infrastructure ends most episodes, or a quarter of the episodes run out of
    context."""
    policy = cfg.trainer.infra_failures
    thresholds = {"context_limit_rate": 0.25, "empty_action_rate": 0.9}  # others: 0.5
    checks = {
        "context_limit_rate": f"a quarter or more of the episodes ended at agent.max_context_tokens="
                              f"{cfg.agent.max_context_tokens} (termination context_length) before the env ended "
                              "them; the prompt (system block, tool schemas) may take most of the context: raise "
                              "agent.max_context_tokens, or shorten the prompt or the observations",
        "turn_length_cut_rate": f"over half the turns hit agent.max_new_tokens={cfg.agent.max_new_tokens} "
                                "before the end-of-turn token; raise it if replies are cut",
        "empty_action_rate": "nearly no turn reached the env: the actions were empty. With a thinking template "
                             "(the prompt opens <think>) the env reads only what follows the closing tag, so a turn "
                             "that never closes its thought does nothing; raise agent.max_new_tokens so thoughts "
                             "close, warm-start on the env's expert (agent.warmstart.steps: its targets close the "
                             "thought), or turn thinking off (agent.template_kwargs='{enable_thinking: false}')",
        "tool_parse_error_rate": f"over half the turns hold a malformed tool call (parser "
                                 f"{cfg.agent.tool_parser!r}, chat format {cfg.agent.chat_format!r}); check the call "
                                 "format the model writes",
        "infra_failure_rate": "over half the episodes were ended by the infrastructure (env_error, tool_error, "
                              f"step_timeout), which trainer.infra_failures={policy!r} "
                              + ("trains on with the reward they got" if policy == "keep" else "leaves out of the "
                                 "gradient, so few episodes train") + "; each trajectory's error says what failed",
    }
    for key, message in checks.items():
        if metrics.get(key, 0.0) > thresholds.get(key, 0.5) and key not in warned:
            warned.add(key)
            log.warning("%s (%s=%.2f)", message, key, metrics[key])

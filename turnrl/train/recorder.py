"""What a run keeps of each step: the metrics log, held-out evaluations, the episodes token by
token (``RUN/rollouts/``, ``turnrl.runs``) and their page (``view.html``), resumable checkpoints,
the collapse watch's warnings (``turnrl.runs.watch``), and at the end the final model, curves and
table; the experiment trackers (``logger``) get the metrics, sample episodes and the page.

``Recorder.begin`` starts the history (a fresh run's step-0 evaluation, or a checkpoint's
restored state), ``record`` takes one finished step, ``finish`` writes the run's outputs.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from turnrl.train import checkpoint
from turnrl.train.algorithm import Algorithm
from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.learner.learner import StepCoefs, TokenView
from turnrl.algorithms.credit.assign import Credited
from turnrl.algorithms.distributed import shard_list
from turnrl.train.evaluation import evaluate, heldout_tasks
from turnrl.train.report import after_value, before_after_table, plot_curves
from turnrl.rollout.collector import RolloutCollector
from turnrl.rollout.metrics import rollout_metrics
from turnrl.rollout.pipeline import RolloutBatch
from turnrl.rollout.trajectory import Trajectory
from turnrl.runs import store
from turnrl.runs.keep import Pieces, episode_records, whole_groups
from turnrl.runs.view import ViewCache, build_view
from turnrl.runs.watch import Watch
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
        self.watch = Watch(cfg, run.run_dir if procs.main else None)  # the collapse watch's warnings
        self.eval_collector = RolloutCollector.for_run(cfg, run.env_fn, source.eval_policy, run.renderer)
        self.eval_tasks = shard_list(heldout_tasks(cfg.trainer.eval_episodes), procs.world, procs.rank)
        self.keep = cfg.trainer.rollouts
        self.pieces = Pieces(run.tokenizer)
        self.view_cache = ViewCache()
        # sample episodes go to the experiment trackers as tables (logger.episodes)
        self.tables = bool(run.logger.trackers) and cfg.logger.episodes > 0
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
            self.watch.warned.update(restored.warned)
            self.watch.resume(start)
            start = restored.step
            if run.procs.main:  # the steps after the checkpoint are written again
                store.drop_after(run.run_dir, start)
            log.info("resumed from %s after step %d of %d", run.resumed.path, start, steps)
        self.bar = tqdm(range(start + 1, steps + 1), initial=start, total=steps, desc="RL", unit="step",
                        disable=not run.cfg.trainer.progress)
        return self.bar

    def evaluate(self, step: int) -> None:
        """Greedy episodes on the held-out tasks (each process its share; metrics of all)."""
        metrics, trajectories = evaluate(self.eval_collector, self.eval_tasks, self.run.cfg.agent.max_new_tokens,
                                         self.run.procs.gather)
        self.result.evals.append((step, metrics))
        self.run.logger.log(step, metrics, prefix="eval")
        kept = self.keep.eval and self.keep.every > 0
        if self.run.procs.main and (kept or self.tables):
            rows = whole_groups(trajectories, self.keep.episodes)
            records = episode_records(trajectories, kind="eval", step=step, pieces=self.pieces, rows=rows,
                                      max_tokens=self.keep.tokens)
            if kept:
                store.write_step(self.run.run_dir, "eval", step, records)
            self.run.logger.episodes("eval", step, records[:self.run.cfg.logger.episodes])

    def token_view(self, step: int, batch: TrainBatch) -> TokenView | None:
        """An empty ``TokenView`` of ``batch`` for the update to fill when step ``step``'s
        rollouts are kept (``trainer.rollouts.every``), else None."""
        every = self.keep.every
        return TokenView.empty(batch) if every > 0 and step % every == 0 else None

    def record(self, step: int, rollouts: RolloutBatch, waited: float, credited: Credited, update: dict,
               coefs: StepCoefs, started: float, view: TokenView | None = None) -> None:
        """Log step ``step`` (its rollouts, credit, update figures and timings since
        ``started``), keep its episodes (with ``view``, the update's per-token figures), then
        evaluate and checkpoint when due."""
        cfg, procs = self.run.cfg, self.run.procs
        if view is not None:
            self.keep_rollouts(step, rollouts.trajectories, credited, view)
        trajectories = rollouts.trajectories
        if procs.gather is not None:  # every process's rollouts, for the step's figures
            trajectories = procs.gather(trajectories)
        self.algorithm.observe_kl(update["kl"], len(trajectories))
        metrics = {**rollout_metrics(trajectories), **update, "kl_coef": coefs.kl_coef, "entropy_coef": coefs.entropy_coef,
                   "temperature": coefs.temperature, **credited.metrics,
                   "policy_lag": float(rollouts.staleness), "step_time": time.perf_counter() - started,
                   "rollout_time": rollouts.rollout_time, "rollout_wait": waited, **self.source.sampler_metrics()}
        metrics["nonfinite_updates_total"] = nonfinite_total(self.result.train, metrics)
        self.result.train.append({"step": step, **metrics})
        self.run.logger.log(step, metrics)
        self.bar.set_postfix(reward=f"{metrics['reward']:.2f}", heldout=f"{self.result.evals[-1][1]['success']:.2f}")
        if step % cfg.trainer.eval_every == 0 or step == cfg.trainer.steps:
            self.evaluate(step)
        self.watch.observe(self.result.train)
        if self.keep.every > 0 and self.keep.view_every > 0 and step % self.keep.view_every == 0 and procs.main:
            self.write_view()
        if checkpoint.is_due(step, cfg.trainer.checkpoint_every):  # async: in-flight rollouts finish and are saved
            self.save(step)

    def keep_rollouts(self, step: int, trajectories: list[Trajectory], credited: Credited, view: TokenView) -> None:
        """Write step ``step``'s episodes with their per-token figures (each process makes the
        records of its own rows, its share of ``trainer.rollouts.episodes``; the main process
        writes them all)."""
        procs, limit = self.run.procs, self.keep.episodes
        if limit is not None and procs.world > 1:
            limit = -(-limit // procs.world)
        batch = credited.batch
        records = episode_records(trajectories, kind="train", step=step, pieces=self.pieces,
                                  rows=whole_groups(trajectories, limit), advantages=credited.advantages.cpu(),
                                  learner_logprobs=view.learner_logprobs, entropy=view.entropy,
                                  importance_weights=view.importance_weights, loss_mask=batch.loss_mask.cpu(),
                                  max_tokens=self.keep.tokens)
        if procs.gather is not None:
            records = procs.gather(records)
        if procs.main:
            for index, r in enumerate(records):
                r.index = index
            store.write_step(self.run.run_dir, "train", step, records)
            if self.tables and step % self.run.cfg.logger.episodes_every == 0:
                self.run.logger.episodes("train", step, records[:self.run.cfg.logger.episodes])

    def write_view(self) -> None:
        """Rewrite ``RUN/view.html`` from the episodes kept so far (main process)."""
        build_view(self.run.run_dir, cache=self.view_cache, warnings=[asdict(w) for w in self.watch.warnings],
                   checks=self.watch.checks_line())

    def save(self, step: int) -> None:
        """A resumable checkpoint after update ``step`` (see ``turnrl.train.checkpoint``)."""
        run, procs = self.run, self.run.procs
        extra = {} if self.stages.reward_model is None else {"reward_model": self.stages.reward_model.state_dict()}
        path = checkpoint.save(run.run_dir, step, model=run.model, tokenizer=run.tokenizer, algorithm=self.algorithm,
                               source=self.source, warned=self.watch.warned, config_yaml=config_yaml(run.cfg),
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
            plot_curves(result.train, result.evals, run.run_dir / "curves.png",
                        [(w.step, w.key) for w in self.watch.warnings])
            table = before_after_table([e for _, e in result.evals])
            (run.run_dir / "summary.txt").write_text(table + "\n")
            (run.run_dir / "evals.json").write_text(json.dumps([{"step": s, **e} for s, e in result.evals], indent=1))
            if self.keep.every > 0:
                self.write_view()
                run.logger.file(run.run_dir / "view.html")
            run.logger.file(run.run_dir / "curves.png")
            print(table, flush=True)
        run.logger.close()
        return result



def nonfinite_total(history: list[dict], metrics: dict) -> float:
    """Optimizer steps (the policy's and a separate critic's) skipped for a NaN or inf in the
    loss or the gradient since the run began: the previous step's total in ``history`` (the
    metrics log, restored on resume) plus this step's ``nonfinite_updates`` and
    ``critic_nonfinite_updates``."""
    before = history[-1].get("nonfinite_updates_total", 0.0) if history else 0.0
    return before + metrics.get("nonfinite_updates", 0.0) + metrics.get("critic_nonfinite_updates", 0.0)

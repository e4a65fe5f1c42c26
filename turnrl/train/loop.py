"""The RL loop: collect B x G multi-turn rollouts, assign credit, update, record.

``train`` reads top to bottom: set up the run, run the stages before RL, then per step:
next rollouts -> batch -> credit (KL in the reward, values, advantages) -> update -> publish
the weights to the sampler -> record (metrics, the episodes kept, evaluation, checkpoint). Each part lives in
its own module: ``turnrl.train.setup`` (processes, model, logger), ``turnrl.train.stages`` (warm start,
reward model, DPO), ``turnrl.train.algorithm`` (coefficients, credit, update),
``turnrl.train.rollout_source`` (samplers and the sync/async pipelines), ``turnrl.train.recorder``
(history, evaluation, checkpoints, outputs).

Resuming (``trainer.resume``) restores a checkpoint of ``turnrl.train.checkpoint`` in place of the
stages before RL, and the loop goes on from the checkpoint's step: the metrics log, the
held-out history, every module, optimizer and RNG state are those of the uninterrupted run at
that step, so the rest of the run is the same, step for step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from turnrl.train.algorithm import Algorithm
from turnrl.algorithms.batch import collate
from turnrl.conf.schema import Config
from turnrl.conf.validate import validate
from turnrl.train.recorder import Recorder, TrainResult
from turnrl.train.rollout_source import rollout_source
from turnrl.train.setup import start_run
from turnrl.train.stages import pre_rl_stages

__all__ = ["TrainResult", "train"]


def train(cfg: Config, run_dir: str | Path, on_rl_start: Callable[[object], None] | None = None,
          on_step_end: Callable[[int], None] | None = None) -> TrainResult:
    """Run the stages before RL and RL as configured; write logs, curves, table and
    checkpoints to ``run_dir``.

    Args:
        cfg: the composed config.
        run_dir: output folder (the Hydra run dir from the CLI).
        on_rl_start: called with the model after the stages before RL (or after loading a
            checkpoint), before this process's first RL step.
        on_step_end: called with the step's number after each RL step is recorded (its
            metrics, episodes, evaluation and checkpoint when due).

    Raises:
        ValueError: On an invalid config (before any work), or a ``trainer.resume`` that
            names no checkpoint or conflicts with newer checkpoints in ``run_dir``.
    """
    validate(cfg)                                   # every config problem, before any work
    run = start_run(cfg, run_dir)                   # processes, seeds, env factory, model, logger
    stages = pre_rl_stages(run)                     # warm start, reward model, DPO
    algorithm = Algorithm(cfg, run.model, run.procs.device, run.procs.accelerator)
    source = rollout_source(run, stages, algorithm.sampling)
    recorder = Recorder(run, stages, algorithm, source)
    if on_rl_start is not None:
        on_rl_start(run.model)
    try:
        for step in recorder.begin():               # evaluate before RL, or restore the checkpoint
            started = time.perf_counter()
            coefs = algorithm.coefs(step)
            rollouts, waited = source.next(step)
            batch = collate(rollouts.trajectories, run.tokenizer.pad_token_id, cfg.algorithm.state_similarity,
                            cfg.trainer.infra_failures)
            credited = algorithm.credit(batch, coefs)
            view = recorder.token_view(step, batch)  # per-token figures, on the steps whose episodes are kept
            update = algorithm.update(credited, coefs, view)
            source.after_update(step, run.model)    # the sampler gets the new weights
            recorder.record(step, rollouts, waited, credited, update, coefs, started, view)
            if on_step_end is not None:
                on_step_end(step)
    except KeyboardInterrupt:                        # keep what was computed: evaluate, save and report
        recorder.interrupted()
    except BaseException:
        run.logger.close()                          # the trackers end their runs; the log is complete so far
        raise
    finally:
        source.close()
    return recorder.finish()

"""Experiment trackers: Weights & Biases, MLflow and Trackio (``logger=...``, schema
``LoggerConfig``), each a small adapter behind one protocol that ``RunLogger`` reports to.

A tracker gets, from the main process: the run's config once, every metric row the run logs
(``"<kind>/<name>"``: ``train/reward``, ``eval/success``, ``dpo/loss``; each kind on its own
step axis), sample episodes (``episodes``: a W&B table, an MLflow JSON table artifact, Trackio
traces) and files (the run page ``view.html`` at the end). A tracker that fails mid-run is
dropped with a warning (``RunLogger``): ``metrics.jsonl`` keeps every figure, the run goes on.

The libraries are optional (``pip install 'turnrl[trackers]'``; ``turnrl.conf.validate``
names a missing one before any work) and imported only when a tracker is opened.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable, Protocol, Sequence

from turnrl.conf.schema import TRACKER_PACKAGES, LoggerConfig, MlflowConfig, TrackioConfig, WandbConfig
from turnrl.runs.rollouts import EpisodeRecord

COLUMNS = ["step", "kind", "index", "group", "task", "reward", "success", "termination", "turns", "tool_calls",
           "conversation"]
"""The columns of an episode table (``episode_rows``)."""


class Tracker(Protocol):
    """One experiment tracker's run."""

    name: str

    def log(self, kind: str, step: int, metrics: dict[str, float]) -> None:
        """Metrics of ``kind`` (``train``, ``eval``, ...) at ``step`` of that kind."""

    def episodes(self, kind: str, step: int, records: Sequence[EpisodeRecord]) -> None:
        """Sample episodes of ``kind`` at ``step``."""

    def file(self, path: Path) -> None:
        """A file of the run (the run page) as an artifact."""

    def close(self) -> None:
        """End the tracker's run (flushes what is pending)."""


def conversation(record: EpisodeRecord) -> str:
    """An episode's messages as text, one ``[role] content`` block each."""
    return "\n\n".join(f"[{m.get('role', '?')}] {m.get('content', '')}" for m in record.messages)


def episode_rows(records: Sequence[EpisodeRecord]) -> list[list]:
    """One row (``COLUMNS``) per episode."""
    return [[r.step, r.kind, r.index, r.group_id, r.task_id, r.reward, r.success, r.termination,
             len(r.turn_rewards), r.tool_calls, conversation(r)] for r in records]


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics that are finite numbers, as floats (MLflow and Trackio refuse NaN and inf;
    ``metrics.jsonl`` and TensorBoard keep them)."""
    out = {}
    for key, value in metrics.items():
        try:
            value = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(value):
            out[key] = value
    return out


# ------------------------------------------------------------------------------- W&B
class WandbTracker:
    """A W&B run (``mode=offline`` writes ``RUN/wandb/`` only, for ``wandb sync``)."""

    name = "wandb"

    def __init__(self, cfg: WandbConfig, run_dir: Path, config: dict):
        import wandb  # optional dependency (the trackers extra)

        self._wandb = wandb
        try:
            self.run = wandb.init(project=cfg.project, entity=cfg.entity, mode=cfg.mode, name=cfg.name or run_dir.name,
                                  group=cfg.group, tags=list(cfg.tags) or None, dir=str(run_dir), config=config,
                                  reinit="create_new")
        except Exception as e:
            raise RuntimeError(f"logger.wandb: could not start a W&B run ({type(e).__name__}: {e}); log in "
                               "(`wandb login` or WANDB_API_KEY), or set logger.wandb.mode=offline") from e
        self._kinds: set[str] = set()

    def _axis(self, kind: str) -> None:
        if kind not in self._kinds:  # each kind on its own step axis (DPO steps, then RL steps from 1)
            self.run.define_metric(f"{kind}/step")
            self.run.define_metric(f"{kind}/*", step_metric=f"{kind}/step")
            self._kinds.add(kind)

    def log(self, kind: str, step: int, metrics: dict[str, float]) -> None:
        self._axis(kind)
        self.run.log({f"{kind}/step": step, **{f"{kind}/{k}": v for k, v in metrics.items()}})

    def episodes(self, kind: str, step: int, records: Sequence[EpisodeRecord]) -> None:
        self._axis(kind)
        table = self._wandb.Table(columns=COLUMNS, data=episode_rows(records))
        self.run.log({f"{kind}/step": step, f"{kind}/episode_table": table})

    def file(self, path: Path) -> None:
        artifact = self._wandb.Artifact(f"{self.run.id}-{path.stem}", type="run-page" if path.suffix == ".html" else "file")
        artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def close(self) -> None:
        self.run.finish()


# ------------------------------------------------------------------------------- MLflow
class MlflowTracker:
    """An MLflow run: config as params (dotted keys) and ``config.yaml``, metrics, episode tables
    as ``episodes/<kind>/step-NNNNNN.json`` artifacts, files under the artifact root."""

    name = "mlflow"
    MAX_PARAM = 6000  # MLflow's limit on a param's value

    def __init__(self, cfg: MlflowConfig, run_dir: Path, config: dict, config_text: str):
        from mlflow.entities import Metric, Param  # optional dependency (the trackers extra)
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        try:
            self.client = MlflowClient(tracking_uri=cfg.tracking_uri)
            experiment = self.client.get_experiment_by_name(cfg.experiment)
            experiment_id = (experiment.experiment_id if experiment is not None else
                             self.client.create_experiment(cfg.experiment, artifact_location=cfg.artifact_location))
            self.run_id = self.client.create_run(experiment_id, run_name=cfg.run_name or run_dir.name).info.run_id
        except Exception as e:
            raise RuntimeError(f"logger.mlflow: could not start an MLflow run at tracking URI "
                               f"{cfg.tracking_uri or '(MLflow default)'} ({type(e).__name__}: {e}); set "
                               "logger.mlflow.tracking_uri (e.g. sqlite:////abs/path/mlflow.db or http://host:5000)") from e
        params = [Param(k, str(v)[:self.MAX_PARAM]) for k, v in _flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.client.log_text(self.run_id, config_text, "config.yaml")

    def log(self, kind: str, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        rows = [self._metric(f"{kind}/{k}", v, now, step) for k, v in _finite(metrics).items()]
        for i in range(0, len(rows), 1000):  # MLflow takes at most 1000 metrics a batch
            self.client.log_batch(self.run_id, metrics=rows[i:i + 1000])

    def episodes(self, kind: str, step: int, records: Sequence[EpisodeRecord]) -> None:
        rows = episode_rows(records)
        self.client.log_dict(self.run_id, {"columns": COLUMNS, "data": rows}, f"episodes/{kind}/step-{step:06d}.json")

    def file(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flatten(config: dict, prefix: str = "") -> dict[str, object]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    out: dict[str, object] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


# ------------------------------------------------------------------------------- Trackio
class TrackioTracker:
    """A Trackio run (its local database is under ``TRACKIO_DIR``); episodes as traces."""

    name = "trackio"

    def __init__(self, cfg: TrackioConfig, run_dir: Path, config: dict):
        import trackio  # optional dependency (the trackers extra)

        self._trackio = trackio
        try:
            self.run = trackio.init(project=cfg.project, name=cfg.name or run_dir.name, group=cfg.group, config=config,
                                    embed=False, auto_log_cpu=False, auto_log_gpu=False)
        except Exception as e:
            raise RuntimeError(f"logger.trackio: could not start a Trackio run ({type(e).__name__}: {e})") from e

    def log(self, kind: str, step: int, metrics: dict[str, float]) -> None:
        self.run.log({f"{kind}/{k}": v for k, v in _finite(metrics).items()}, step=step)

    def episodes(self, kind: str, step: int, records: Sequence[EpisodeRecord]) -> None:
        traces = [self._trackio.Trace(messages=[{"role": m.get("role", "?"), "content": str(m.get("content", ""))}
                                                for m in r.messages],
                                      metadata={c: v for c, v in zip(COLUMNS[:-1], row[:-1])})
                  for r, row in zip(records, episode_rows(records))]
        self.run.log({f"{kind}/episode_table": traces}, step=step)

    def file(self, path: Path) -> None:
        self.run.log_artifact(str(path), name=path.stem, type="run-page" if path.suffix == ".html" else "file")

    def close(self) -> None:
        self.run.finish()


TRACKERS: dict[str, Callable[..., Tracker]] = {
    "wandb": lambda cfg, run_dir, config, text: WandbTracker(cfg, run_dir, config),
    "mlflow": lambda cfg, run_dir, config, text: MlflowTracker(cfg, run_dir, config, text),
    "trackio": lambda cfg, run_dir, config, text: TrackioTracker(cfg, run_dir, config),
}
"""name (a ``LoggerConfig`` field, a ``TRACKER_PACKAGES`` key) -> its factory ``(cfg, run_dir,
config dict, config yaml)``."""


def chosen(logger: LoggerConfig) -> list[str]:
    """The trackers ``logger`` turns on, in ``TRACKER_PACKAGES`` order."""
    return [name for name in TRACKER_PACKAGES if getattr(logger, name) is not None]


def open_trackers(logger: LoggerConfig, run_dir: Path, config: dict, config_text: str) -> list[Tracker]:
    """Start a run in each chosen tracker (those started are closed if a later one fails).

    Raises:
        RuntimeError: When a tracker cannot start (the message says what to set).
    """
    opened: list[Tracker] = []
    try:
        for name in chosen(logger):
            opened.append(TRACKERS[name](getattr(logger, name), run_dir, config, config_text))
    except BaseException:
        for tracker in opened:
            tracker.close()
        raise
    return opened

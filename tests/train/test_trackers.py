"""The experiment trackers (``logger=[wandb,mlflow,trackio]``), each in its real library's local
mode: W&B offline (read back from the run's transaction log), MLflow on a SQLite store, Trackio's
local database. One real training run (``python -m turnrl.train``, the Hydra path) reports to
all three; each must hold the config, every metric the run logged (equal to ``metrics.jsonl``),
sample episodes and the run page."""

import glob
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers import small_guess_config

from turnrl.conf.schema import Config, MlflowConfig, TrackioConfig, WandbConfig
from turnrl.conf.validate import problems
from turnrl.train.logger import RunLogger
from turnrl.train.trackers import COLUMNS, MlflowTracker

ROOT = Path(__file__).resolve().parents[2]


def _wandb_records(path: str):
    """The records of a W&B transaction log (``run-*.wandb``): a 7-byte file header, then
    32 KiB blocks of chunks (crc32 4 bytes, length 2, type 1: full 1, first 2, middle 3, last 4)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, parts, block = 7, [], 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # padding at the end of a block
            pos += left
            continue
        parts.append(data[pos + 7:pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """A 4-step real run reporting to W&B (offline), MLflow (SQLite) and Trackio (local)."""
    tmp = tmp_path_factory.mktemp("tracked")
    run_dir, trackio_dir = tmp / "run", tmp / "trackio"
    command = [sys.executable, "-m", "turnrl.train", "logger=[wandb,mlflow,trackio]", "logger.wandb.mode=offline",
               f"logger.mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db", f"logger.mlflow.artifact_location={tmp}/mlruns",
               "logger.trackio.project=turnrl-test", "logger.episodes=5", "logger.episodes_every=2",
               "env.kwargs={n: 6, n_min: 4}", "agent.max_new_tokens=8", "agent.warmstart.steps=20",
               "agent.tokenizer.corpus_episodes=20", "agent.model.hidden_size=64", "agent.model.intermediate_size=128",
               "trainer.steps=4", "trainer.tasks_per_step=2", "trainer.group_size=4", "trainer.eval_episodes=6",
               "trainer.eval_every=2", "trainer.threads=1", "trainer.env_workers=1", "trainer.progress=false",
               "trainer.tensorboard=false", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "TRACKIO_DIR": str(trackio_dir), "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"tmp": tmp, "run_dir": run_dir, "trackio_dir": trackio_dir, "rows": rows, "env": env}


def _expected(rows, kind):
    """step -> the finite metrics of ``kind`` that ``metrics.jsonl`` holds."""
    return {r["step"]: {k: v for k, v in r.items() if k not in ("step", "kind") and isinstance(v, (int, float))
                        and v == v and abs(v) != float("inf")}
            for r in rows if r["kind"] == kind}


pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_wandb_offline_holds_the_config_every_metric_the_episodes_and_the_page(tracked_run):
    (log,) = glob.glob(str(tracked_run["run_dir"] / "wandb" / "offline-run-*" / "run-*.wandb"))
    history, artifacts, config = [], [], {}
    for record in _wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
            assert record.run.display_name == "run" and record.run.project == "turnrl"
        elif kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
        elif kind == "artifact":
            artifacts.append((record.artifact.type, [entry.path for entry in record.artifact.manifest.contents]))
    assert config["trainer"]["steps"] == 4 and config["logger"]["episodes"] == 5
    def is_table(h):
        return any("/episode_table" in key for key in h)

    for kind in ("train", "eval"):
        logged = {h[f"{kind}/step"]: {k.split("/", 1)[1]: v for k, v in h.items() if k.startswith(f"{kind}/")
                                      and k != f"{kind}/step"}
                  for h in history if f"{kind}/step" in h and not is_table(h)}
        expected = _expected(tracked_run["rows"], kind)
        assert sorted(logged) == sorted(expected) == ([1, 2, 3, 4] if kind == "train" else [0, 2, 4])
        for step, metrics in expected.items():
            assert {k: logged[step][k] for k in metrics} == pytest.approx(metrics, rel=1e-12)
    tables = {(h["train/step"] if "train/step" in h else h["eval/step"], "train" if "train/step" in h else "eval")
              for h in history if is_table(h)}
    assert tables == {(2, "train"), (4, "train"), (0, "eval"), (2, "eval"), (4, "eval")}
    (path,) = [h["train/episode_table/path"] for h in history if is_table(h) and h.get("train/step") == 2]
    table = json.loads((Path(log).parent / "files" / path).read_text())
    assert table["columns"] == COLUMNS and len(table["data"]) == 5
    assert all(row[0] == 2 and row[1] == "train" and row[-1].startswith("[system]") for row in table["data"])
    assert ("run-page", ["view.html"]) in artifacts and ("file", ["curves.png"]) in artifacts


def test_mlflow_holds_the_config_every_metric_the_episode_tables_and_the_page(tracked_run):
    from mlflow.tracking import MlflowClient

    tmp = tracked_run["tmp"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("turnrl").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.params["trainer.steps"] == "4" and run.data.params["env.id"] == "turnrl/GuessNumber-v0"
    for kind in ("train", "eval"):
        for key in ("reward", "success"):
            history = client.get_metric_history(run.info.run_id, f"{kind}/{key}")
            expected = _expected(tracked_run["rows"], kind)
            assert {m.step: m.value for m in history} == pytest.approx({s: e[key] for s, e in expected.items()})
    paths = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "view.html", "curves.png", "episodes"} <= paths
    assert [a.path for a in client.list_artifacts(run.info.run_id, "episodes/train")] == [
        "episodes/train/step-000002.json", "episodes/train/step-000004.json"]
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "episodes/train/step-000004.json",
                                                      str(tmp / "dl"))).read_text())
    assert table["columns"] == COLUMNS and len(table["data"]) == 5 and {row[0] for row in table["data"]} == {4}


def test_trackio_holds_the_config_every_metric_the_episode_traces_and_the_page(tracked_run):
    # Trackio reads TRACKIO_DIR when it is imported: read it back in a process of its own
    script = textwrap.dedent("""
        import json
        from trackio.sqlite_storage import SQLiteStorage as S
        print(json.dumps({"logs": S.get_logs("turnrl-test", "run"), "config": S.get_run_config("turnrl-test", "run"),
                          "traces": S.get_traces("turnrl-test", "run"),
                          "artifacts": [a["name"] for a in S.list_artifacts("turnrl-test")]}, default=str))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=tracked_run["env"])
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["config"]["trainer"]["steps"] == 4
    for kind in ("train", "eval"):
        expected = _expected(tracked_run["rows"], kind)
        logged = {log["step"]: log for log in data["logs"] if f"{kind}/reward" in log}
        assert sorted(logged) == sorted(expected)
        for step, metrics in expected.items():
            assert {k: logged[step][f"{kind}/{k}"] for k in metrics} == pytest.approx(metrics)
    traces = [t for t in data["traces"] if t["key"] == "train/episode_table"]
    assert sorted({t["step"] for t in traces}) == [2, 4] and len(traces) == 10
    assert "view" in data["artifacts"]


def _mlflow_config(tmp_path) -> MlflowConfig:
    return MlflowConfig(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_location=str(tmp_path / "mlruns"))


def test_a_tracker_failing_mid_run_is_dropped_with_a_warning_and_the_log_goes_on(tmp_path, caplog):
    tracker = MlflowTracker(_mlflow_config(tmp_path), tmp_path, {"seed": 0}, "seed: 0\n")
    logger = RunLogger(tmp_path, tensorboard=False, trackers=[tracker])
    logger.log(1, {"reward": 0.5})
    tracker.client.delete_run(tracker.run_id)  # MLflow refuses to log to a deleted run
    logger.log(2, {"reward": 0.75})
    logger.log(3, {"reward": 1.0})
    logger.close()
    assert logger.trackers == [] and "tracker mlflow failed in log" in caplog.text
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in rows] == [0.5, 0.75, 1.0]
    history = tracker.client.get_metric_history(tracker.run_id, "train/reward")
    assert [(m.step, m.value) for m in history] == [(1, 0.5)]


def test_a_tracker_that_cannot_start_says_what_to_set(tmp_path):
    with pytest.raises(RuntimeError, match="set logger.mlflow.tracking_uri"):
        MlflowTracker(MlflowConfig(tracking_uri="nosuchscheme://x"), tmp_path, {}, "")


def test_a_missing_library_or_a_bad_mode_fails_before_any_work_naming_the_extra(monkeypatch):
    cfg = small_guess_config()
    cfg.logger.wandb = WandbConfig(mode="sometimes")
    cfg.logger.trackio = TrackioConfig()
    monkeypatch.setitem(sys.modules, "trackio", None)  # how Python marks a package as not importable
    found = problems(OmegaConf.to_object(cfg))
    assert any("logger.trackio is chosen but the trackio package is not installed; pip install 'turnrl[trackers]'"
               in p for p in found)
    assert any("logger.wandb.mode='sometimes' is not one of ['online', 'offline', 'disabled']" in p for p in found)
    assert not any("logger" in p for p in problems(OmegaConf.to_object(OmegaConf.structured(Config))))


def test_a_resumed_run_sends_its_new_tracker_run_the_restored_log_first(tmp_path):
    from mlflow.tracking import MlflowClient

    from turnrl.train.loop import train

    cfg = small_guess_config(steps=2, checkpoint_every=2)
    cfg.logger.mlflow = _mlflow_config(tmp_path)
    run_dir = tmp_path / "run"
    train(OmegaConf.to_object(cfg), run_dir)
    cfg.trainer.update(dict(steps=4, resume="true"))
    train(OmegaConf.to_object(cfg), run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    expected = {r["step"]: r["reward"] for r in rows if r["kind"] == "train"}
    assert sorted(expected) == [1, 2, 3, 4]
    client = MlflowClient(tracking_uri=_mlflow_config(tmp_path).tracking_uri)
    first, resumed = sorted(client.search_runs([client.get_experiment_by_name("turnrl").experiment_id]),
                            key=lambda r: r.info.start_time)
    histories = [{m.step: m.value for m in client.get_metric_history(r.info.run_id, "train/reward")}
                 for r in (first, resumed)]
    assert histories == [{s: expected[s] for s in (1, 2)}, expected]

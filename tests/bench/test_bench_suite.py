"""``turnrl bench --suite``: the suite file is checked before anything runs, every cell's
config is composed first with equal sample budgets, finished runs are skipped on a rerun, and
the reports' numbers agree with the runs they summarise."""

import csv
import json
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from turnrl.bench import record
from turnrl.bench import suite as bench_suite
from turnrl.bench.report import RunRecord, records_from_csv
from turnrl.bench.suite import SuiteError, load_suite, parse_suite, plan_cells, write_reports
from turnrl.cli import main as cli_main

FAST = ["trainer.steps=2", "trainer.eval_every=1", "trainer.eval_episodes=8", "trainer.tasks_per_step=2",
        "trainer.group_size=2", "agent.warmstart.steps=5", "agent.tokenizer.corpus_episodes=20",
        "trainer.threads=1", "trainer.tensorboard=false", "trainer.save_checkpoint=false"]
TINY = {"shared": ["trainer.progress=false"], "seeds": [0, 1], "baseline": "grpo", "threshold": 0.3,
        "envs": {"guess": ["env=guess_number"]}, "methods": {"grpo": ["algorithm=grpo"], "rloo": []}}


def _suite(**changes) -> dict:
    return {**yaml.safe_load(yaml.safe_dump(TINY)), **changes}


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ------------------------------------------------------------------------- the suite file
def test_the_credit_suite_runs_every_method_with_ten_seeds_and_one_aggregation_against_grpo():
    suite = load_suite("credit")
    assert [m.name for m in suite.methods][:10] == ["grpo", "rloo", "turn_returns", "gigpo", "mt_grpo", "turn_gae",
                                                    "bilevel_gae", "turn_ppo", "gspo", "cispo"]
    assert suite.baseline == "grpo" and suite.seeds == tuple(range(10)) and len(suite.envs) == 3
    # the aggregation is held fixed; the methods that change it are the declared factor's levels
    assert "algorithm.loss_agg=token-mean" in suite.shared and suite.factors == ("algorithm.loss_agg",)
    factor_levels = [m for m in suite.methods if any(o.startswith("algorithm.loss_agg=") for o in m.overrides)]
    assert [m.name for m in factor_levels] == ["grpo_seq_mean", "turn_returns_seq_mean", "turn_gae_seq_mean",
                                               "turn_ppo_turn_mean"]
    assert [e.name for e in suite.envs] == ["guess_number_long", "frozen_lake_long", "key_door_long"]
    for env in suite.envs:  # each env states its sample budget in its entry
        keys = {o.split("=")[0] for o in env.overrides}
        assert {"env", "trainer.tasks_per_step", "trainer.group_size", "trainer.steps"} <= keys, env.name
    assert "agent.warmstart.seed=0" in suite.shared  # one warm start per env, shared by every seed


def test_a_method_is_an_algorithm_config_plus_overrides_named_by_its_own_name_by_default():
    suite = parse_suite(_suite(methods={"grpo": [], "rloo_tm": ["algorithm=rloo", "algorithm.loss_agg=token-mean"]}),
                        "tiny")
    assert [(m.name, m.algorithm) for m in suite.methods] == [("grpo", "grpo"), ("rloo_tm", "rloo")]
    assert suite.methods[0].overrides == ("algorithm=grpo",)
    lake = parse_suite(_suite(envs={"lake": {"overrides": ["env=frozen_lake"], "threshold": 0.2}}), "tiny")
    assert lake.thresholds == {"lake": 0.2}


@pytest.mark.parametrize("change, message", [
    ({"methods": {"grpo": [], "fancy": ["algorithm=no_such_algo"]}}, r"no algorithm config 'no_such_algo'.*'grpo'"),
    ({"methods": {"gspo_like": []}}, r"no algorithm config 'gspo_like'"),
    ({"baseline": "ppo"}, r"baseline 'ppo' is not one of the methods \['grpo', 'rloo'\]"),
    ({"envs": {"guess": ["env.kwargs.n=8"]}}, r"envs.guess: choose the env's config with env=NAME"),
    ({"envs": {"guess": ["env=no_such_env"]}}, r"no env config 'no_such_env'"),
    ({"methods": {"grpo": ["seed=3"]}}, r"methods.grpo may not set seed or env"),
    ({"shared": ["algorithm=rloo"]}, r"shared may not set seed or env or algorithm"),
    ({"seeds": [0, 0]}, r"distinct integers"),
    ({"threshold": 50}, r"threshold must be a held-out success rate in \[0, 1\]"),
    ({"methods": {"grpo": "algorithm=grpo"}}, r"methods.grpo must be a list of Hydra overrides"),
    ({"method": {}}, r"unknown keys \['method'\]"),
    ({"envs": {"a b": ["env=guess_number"]}}, r"'a b' is no valid name"),
])
def test_a_bad_suite_file_is_refused_with_what_to_fix(change, message):
    with pytest.raises(SuiteError, match=message):
        parse_suite(_suite(**change), "tiny", "tiny.yaml")


def test_the_documented_suite_file_is_a_valid_suite():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text()
    example = docs.split("### The suite file\n\n```yaml\n", 1)[1].split("```", 1)[0]
    suite = parse_suite(yaml.safe_load(example), "example", "docs/benchmarks.md")
    assert [m.algorithm for m in suite.methods] == ["grpo", "grpo"] and suite.thresholds == {"frozen_lake": 0.3}


def test_a_missing_key_or_suite_is_named():
    data = _suite()
    del data["baseline"]
    with pytest.raises(SuiteError, match=r"missing keys \['baseline'\]"):
        parse_suite(data, "tiny")
    with pytest.raises(SuiteError, match=r"no suite 'nope'.*credit"):
        load_suite("nope")


def test_a_selection_keeps_the_baseline_and_refuses_unknown_names():
    suite = load_suite("credit")
    cut = suite.select(envs=["frozen_lake_long"], methods=["gigpo"], seeds=[3, 3, 1])
    assert [m.name for m in cut.methods] == ["grpo", "gigpo"] and cut.seeds == (3, 1)
    assert [e.name for e in cut.envs] == ["frozen_lake_long"]
    with pytest.raises(SuiteError, match=r"no env \['maze'\]"):
        suite.select(envs=["maze"])


# ------------------------------------------------------------------------- planning (composes, trains nothing)
def test_every_cell_is_composed_with_its_seed_env_and_method(tmp_path):
    cells = plan_cells(parse_suite(_suite(), "tiny"), tmp_path, ["trainer.steps=3"])
    assert [(c.env, c.method, c.seed) for c in cells] == [("guess", m, s) for m in ("grpo", "rloo") for s in (0, 1)]
    assert [c.cfg.seed for c in cells] == [0, 1, 0, 1]
    assert [c.cfg.algorithm.advantage for c in cells] == ["grpo", "grpo", "rloo", "rloo"]
    assert all(c.cfg.trainer.steps == 3 and c.record is None for c in cells)
    assert cells[3].run_dir == tmp_path / "guess" / "rloo" / "seed1"


def test_methods_with_unequal_sample_budgets_or_bad_overrides_fail_before_any_run(tmp_path):
    unequal = parse_suite(_suite(methods={"grpo": [], "rloo": ["trainer.group_size=4"]}), "tiny")
    with pytest.raises(SuiteError, match=r"env guess: the methods differ in sample budget.*trainer.group_size=4"):
        plan_cells(unequal, tmp_path)
    with pytest.raises(SuiteError, match=r"env guess, method grpo: .*stepz"):
        plan_cells(parse_suite(_suite(), "tiny"), tmp_path, ["trainer.stepz=1"])
    with pytest.raises(SuiteError, match="may not set seed"):
        plan_cells(parse_suite(_suite(), "tiny"), tmp_path, ["seed=4"])
    assert not any(tmp_path.iterdir())


@pytest.mark.slow  # composes every method's config (Hydra): seconds
def test_a_method_that_changes_more_than_its_credit_is_refused_unless_the_key_is_a_declared_factor(tmp_path):
    methods = {"grpo": [], "gigpo": ["algorithm.advantage_kwargs.omega=0.5"], "gspo": [],
               "rloo": ["algorithm=rloo", "algorithm.loss_agg=token-mean", "trainer.lr=1e-4"]}
    with pytest.raises(SuiteError, match=r"env guess: methods change settings beside their credit method.*"
                                         r"rloo: algorithm.loss_agg: 'seq-mean-token-mean' -> 'token-mean', "
                                         r"trainer.lr: 0.0003 -> 0.0001, against grpo\).*factors:"):
        plan_cells(parse_suite(_suite(methods=methods), "tiny"), tmp_path)
    methods["rloo"] = ["algorithm=rloo", "algorithm.loss_agg=token-mean"]  # gigpo, gspo: credit keys only
    suite = parse_suite(_suite(methods=methods, factors=["algorithm.loss_agg"]), "tiny")
    cells = plan_cells(suite, tmp_path)
    settings = bench_suite.cell_settings(suite, cells)
    assert {m: v["algorithm.loss_agg"] for m, v in settings["guess"].items()} == {
        "grpo": "seq-mean-token-mean", "gigpo": "seq-mean-token-mean", "gspo": "seq-mean-token-mean",
        "rloo": "token-mean"}
    assert "`algorithm.loss_agg` seq-mean-token-mean (grpo, gigpo, gspo), token-mean (rloo)" in \
        bench_suite.controls_note(suite, settings)
    # the shipped credit suite holds everything but the credit method fixed (or declared)
    credit = load_suite("credit").select(envs=["guess_number_long"])
    configs = {c.method: c.cfg for c in plan_cells(credit, tmp_path / "credit") if c.seed == 0}
    assert bench_suite.uncontrolled_keys(configs, "grpo", credit.factors) == {}
    assert {c.algorithm.loss_agg for m, c in configs.items() if not m.endswith(("_seq_mean", "_turn_mean"))} == \
        {"token-mean"}


# ------------------------------------------------------------------------- the reports, on hand-made runs
def _record(method, seed, curve, env="guess"):
    after = statistics.fmean(s for _, s in curve[-3:])
    return RunRecord(method, seed, curve[0][1], after, curve, 5.0 + seed, f"runs/{method}/{seed}", env=env,
                     episodes_per_step=4, sampled_episodes=4 * curve[-1][0], sampled_tokens=100 * (seed + 1))


RECORDS = [_record("grpo", 0, [(0, 0.1), (1, 0.2), (2, 0.4)]), _record("grpo", 1, [(0, 0.1), (1, 0.3), (2, 0.2)]),
           _record("rloo", 0, [(0, 0.1), (1, 0.5), (2, 0.6)]), _record("rloo", 1, [(0, 0.1), (1, 0.1), (2, 0.2)])]


def test_the_reports_hold_every_run_and_differences_consistent_with_them(tmp_path):
    suite = parse_suite(_suite(), "tiny")
    summaries = write_reports(suite, RECORDS, tmp_path)
    runs = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [(r["method"], r["seed"]) for r in runs] == [("grpo", "0"), ("grpo", "1"), ("rloo", "0"), ("rloo", "1")]
    assert [r["episodes_to_threshold"] for r in runs] == ["8", "4", "4", ""]  # threshold 0.3, 4 episodes per step
    diffs = [float(r["final_minus_baseline"]) for r in runs[2:]]
    assert diffs == pytest.approx([float(runs[2]["final"]) - float(runs[0]["final"]),
                                   float(runs[3]["final"]) - float(runs[1]["final"])])
    assert runs[0]["final_minus_baseline"] == ""
    summary = {r["method"]: r for r in csv.DictReader((tmp_path / "summary.csv").open())}
    assert float(summary["rloo"]["diff_mean"]) == pytest.approx(statistics.fmean(diffs))
    assert summaries[1].diff.mean == pytest.approx(statistics.fmean(diffs))
    table = (tmp_path / "table.md").read_text()
    assert "## guess" in table and "| grpo | 2 | 0.22 [" in table and "| baseline |" in table
    assert "| seeds ahead / behind |" in table and "| baseline |  |" in table
    assert (summary["rloo"]["seeds_ahead"], summary["rloo"]["seeds_behind"]) == ("1", "1")
    assert "episodes to 0.3 (seeds reached)" in table and "| 6 (2/2) |" in table and "| not reached (1/2) |" in table
    page = (tmp_path / "report.html").read_text()
    assert "data:image/png;base64," in page and "runs/rloo/1" in page and "bootstrap" in page
    assert (tmp_path / "curves.png").stat().st_size > 1000
    # one row per env x method x seed x evaluation, beside the suite as it ran
    evals = list(csv.DictReader((tmp_path / "evals.csv").open()))
    assert len(evals) == 4 * 3 and evals[5] == {"env": "guess", "method": "grpo", "seed": "1", "step": "2",
                                                 "sampled_episodes": "8", "success": "0.2"}
    ran = yaml.safe_load((tmp_path / "suite.yaml").read_text())
    assert ran["seeds"] == [0, 1] and ran["methods"]["rloo"] == ["algorithm=rloo"] and ran["baseline"] == "grpo"


def test_tables_rebuilt_from_the_per_seed_csvs_equal_the_reports(tmp_path):
    suite = parse_suite(_suite(), "tiny")
    write_reports(suite, RECORDS, tmp_path)
    rebuilt = records_from_csv(tmp_path / "results.csv", tmp_path / "evals.csv")
    assert [(r.algorithm, r.seed, r.evals, r.after) for r in rebuilt] == \
        [(r.algorithm, r.seed, r.evals, pytest.approx(r.after)) for r in RECORDS]
    assert bench_suite.records_table(rebuilt, "grpo", suite.thresholds) in (tmp_path / "table.md").read_text()
    rows = (tmp_path / "evals.csv").read_text().splitlines()
    (tmp_path / "evals.csv").write_text("\n".join(r.replace(",0.6", ",0.9") for r in rows))
    with pytest.raises(ValueError, match=r"\('guess', 'rloo', 0\): final .* is not the mean of its last 3"):
        records_from_csv(tmp_path / "results.csv", tmp_path / "evals.csv")


def test_a_table_refuses_methods_with_different_seeds():
    with pytest.raises(ValueError, match=r"the methods ran different seeds .*'rloo': \[0\]"):
        bench_suite.records_table(RECORDS[:3], "grpo", {"guess": 0.3})


def test_the_cli_subcommand_runs_the_chosen_part_of_the_suite(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_run_suite(suite, out, overrides, progress, workers):
        seen.update(methods=[m.name for m in suite.methods], seeds=suite.seeds, overrides=overrides, workers=workers)
        out.mkdir(parents=True)
        write_reports(suite, RECORDS, out)

    monkeypatch.setattr(bench_suite, "run_suite", fake_run_suite)
    path = _write(tmp_path, _suite())
    code = cli_main(["bench", "--suite", str(path), "--methods", "rloo", "--seeds", "0", "1", "--out",
                     str(tmp_path / "out"), "--workers", "2", "--", "trainer.steps=3"])
    assert code == 0 and seen == {"methods": ["grpo", "rloo"], "seeds": (0, 1), "overrides": ["trainer.steps=3"],
                                  "workers": 2}
    assert "| rloo | 2 |" in capsys.readouterr().out
    assert cli_main(["bench", "--suite", str(path), "--envs", "maze"]) == 2
    assert "has no env ['maze']" in capsys.readouterr().err


def test_an_interrupted_run_is_not_recorded_and_the_command_exits_130(tmp_path, monkeypatch, capsys):
    # train() returns, rather than raises, on Ctrl-C: a run that stopped short of trainer.steps
    monkeypatch.setattr(bench_suite, "train_cell", lambda cfg, run_dir, label, env: RECORDS[0])
    monkeypatch.setattr(bench_suite, "fill_warm_start_cache", lambda cfg, progress: None)  # not this test's subject
    path = _write(tmp_path, _suite())
    code = cli_main(["bench", "--suite", str(path), "--out", str(tmp_path / "out"), "--no-progress", "--",
                     "trainer.steps=5"])
    assert code == 130 and "run the same command again" in capsys.readouterr().err
    assert not list((tmp_path / "out").rglob(bench_suite.RECORD_FILE))


@pytest.mark.slow  # composes every cell (Hydra): seconds
@pytest.mark.parametrize("shared_seed, warm_starts", [([], [0, 1]), (["agent.warmstart.seed=0"], [0])])
def test_cells_run_seed_by_seed_after_one_warm_start_per_cache_entry(tmp_path, monkeypatch, shared_seed, warm_starts):
    order, made = [], []

    def train_cell(cfg, run_dir, label, env):
        order.append((label, cfg.seed))
        return replace(RECORDS[0], algorithm=label, seed=cfg.seed, env=env)

    monkeypatch.setattr(bench_suite, "train_cell", train_cell)
    monkeypatch.setattr(bench_suite, "fill_warm_start_cache", lambda cfg, progress: made.append(cfg.seed))
    path = _write(tmp_path, _suite())
    assert cli_main(["bench", "--suite", str(path), "--out", str(tmp_path / "out"), "--no-progress", "--", *FAST,
                     *shared_seed]) == 0
    assert order == [("grpo", 0), ("rloo", 0), ("grpo", 1), ("rloo", 1)]
    assert made == warm_starts  # each cache entry once (a cell's entry: its env, agent and warm start seed)


# ------------------------------------------------------------------------- end to end: 1 env x 2 methods x 2 seeds
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A tiny suite run to the end once: (suite file, out dir)."""
    root = tmp_path_factory.mktemp("suite")
    path = _write(root, _suite())
    assert cli_main(["bench", "--suite", str(path), "--out", str(root / "out"), "--no-progress", "--", *FAST]) == 0
    return path, root / "out"


@pytest.mark.slow
@pytest.mark.e2e
def test_the_suite_trains_every_cell_and_writes_every_report(finished):
    _, out = finished
    for name in ("results.csv", "evals.csv", "suite.yaml", "summary.csv", "table.md", "curves.png", "report.html",
                 "suite.json"):
        assert (out / name).is_file(), name
    runs = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["env"], r["method"], r["seed"]) for r in runs] == [("guess", m, s) for m in ("grpo", "rloo")
                                                                  for s in ("0", "1")]
    assert all(r["episodes_per_step"] == "4" and r["sampled_episodes"] == "8" and int(r["sampled_tokens"]) > 0
               for r in runs)  # equal budgets: 2 steps x 2 tasks x 2 samples
    final = {(r["method"], r["seed"]): float(r["final"]) for r in runs}
    for r in runs[2:]:
        paired = final[("rloo", r["seed"])] - final[("grpo", r["seed"])]
        assert float(r["final_minus_baseline"]) == pytest.approx(paired)
    summary = {r["method"]: r for r in csv.DictReader((out / "summary.csv").open())}
    assert float(summary["rloo"]["diff_mean"]) == pytest.approx(
        statistics.fmean(float(r["final_minus_baseline"]) for r in runs[2:]))
    assert summary["grpo"]["diff_mean"] == ""
    record = json.loads((out / "guess" / "rloo" / "seed1" / bench_suite.RECORD_FILE).read_text())
    assert [step for step, _ in record["record"]["evals"]] == [0, 1, 2]
    # one warm start per seed, made once and loaded by both methods: they start RL from one model
    assert len([p for p in (out / bench_suite.WARM_START_DIR).iterdir() if (p / "warmstart.json").is_file()]) == 2
    assert {(r["seed"], r["before"]) for r in runs[:2]} == {(r["seed"], r["before"]) for r in runs[2:]}


@pytest.mark.slow
@pytest.mark.e2e
def test_a_rerun_skips_finished_cells_and_trains_only_the_missing_one(finished, monkeypatch):
    path, out = finished
    monkeypatch.setattr(bench_suite, "train_cell", lambda *a, **k: pytest.fail("a finished cell was trained again"))
    assert cli_main(["bench", "--suite", str(path), "--out", str(out), "--no-progress", "--", *FAST]) == 0

    missing = out / "guess" / "rloo" / "seed0"
    saved = json.loads((missing / bench_suite.RECORD_FILE).read_text())["record"]
    (missing / bench_suite.RECORD_FILE).unlink()
    trained = []

    def train_cell(cfg, run_dir, label, env):
        trained.append((env, label, cfg.seed))
        return RunRecord(**{**saved, "evals": [tuple(e) for e in saved["evals"]]})

    monkeypatch.setattr(bench_suite, "train_cell", train_cell)
    assert cli_main(["bench", "--suite", str(path), "--out", str(out), "--no-progress", "--", *FAST]) == 0
    assert trained == [("guess", "rloo", 0)] and (missing / bench_suite.RECORD_FILE).is_file()
    assert len(list(csv.DictReader((out / "results.csv").open()))) == 4


@pytest.mark.slow
@pytest.mark.e2e
def test_a_rerun_with_another_config_refuses_the_finished_runs(finished, capsys):
    path, out = finished
    assert cli_main(["bench", "--suite", str(path), "--out", str(out), "--", *FAST, "trainer.eval_episodes=4"]) == 2
    assert "differs in ['trainer.eval_episodes']" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.e2e
def test_report_only_rebuilds_the_reports_from_finished_runs_whatever_their_config(finished, tmp_path, capsys,
                                                                                     monkeypatch):
    path, finished_out = finished
    out = tmp_path / "out"
    shutil.copytree(finished_out, out)
    before = list(csv.DictReader((out / "results.csv").open()))
    for name in ("results.csv", "summary.csv", "table.md", "curves.png", "report.html"):
        (out / name).unlink()
    (out / "guess" / "rloo" / "seed1" / bench_suite.RECORD_FILE).unlink()
    monkeypatch.setattr(bench_suite, "train_cell", lambda *a, **k: pytest.fail("--report-only trained a cell"))
    # a config that differs from the runs' (a rerun refuses it) does not block the report
    assert cli_main(["bench", "--suite", str(path), "--out", str(out), "--report-only", "--", *FAST,
                       "trainer.eval_episodes=4"]) == 0
    captured = capsys.readouterr()
    assert "1 cell(s) not run, left out: guess/rloo/seed1" in captured.err and "(3 runs)" in captured.out
    for name in ("summary.csv", "table.md", "curves.png", "report.html"):
        assert (out / name).is_file(), name
    after = list(csv.DictReader((out / "results.csv").open()))
    assert after == [r for r in before if (r["method"], r["seed"]) != ("rloo", "1")]
    # a record compares methods on the same seeds: not with rloo's seed 1 missing
    target = tmp_path / "record.json"
    assert cli_main(["bench", "--suite", str(path), "--out", str(out), "--report-only", "--json", str(target)]) == 2
    assert "no record written: the methods ran different seeds" in capsys.readouterr().err and not target.exists()
    # nothing finished: a clear error
    assert cli_main(["bench", "--suite", str(path), "--out", str(tmp_path / "empty"), "--report-only"]) == 2
    assert "holds no finished run" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.e2e
def test_json_writes_a_record_that_rebuilds_the_suites_tables(finished, tmp_path, monkeypatch):
    path, out = finished
    monkeypatch.setattr(bench_suite, "train_cell", lambda *a, **k: pytest.fail("--report-only trained a cell"))
    target = tmp_path / "results" / "suite.json"
    assert cli_main(["bench", "--suite", str(path), "--out", str(out), "--report-only", "--json", str(target),
                     "--", *FAST]) == 0
    saved = record.load(target)
    assert saved.command.startswith("python ") and len(saved.commit or "") == 40
    result = saved.result
    assert result["baseline"] == "grpo" and result["thresholds"] == {"guess": 0.3} and result["missing"] == []
    assert result["envs"] == {"guess": ["env=guess_number"]}  # each env's budget and evaluation, as the suite set them
    assert [(r["algorithm"], r["seed"]) for r in result["runs"]] == [("grpo", 0), ("grpo", 1), ("rloo", 0), ("rloo", 1)]
    table = (out / "table.md").read_text()
    assert bench_suite.record_table(result) in table
    assert bench_suite.record_table(result, "guess") in table and "| rloo | 2 |" in table


@pytest.mark.slow
@pytest.mark.e2e
def test_workers_and_a_shared_warm_start_give_the_serial_runs_results(tmp_path):
    """``--workers 2`` trains cells in two processes; with ``agent.warmstart.cache`` and a fixed
    ``agent.warmstart.seed`` the suite makes the one warm start first and every cell loads it.
    The records equal a serial suite's (each run's figures depend only on its config)."""
    path = _write(tmp_path, _suite())
    shared = [*FAST, f"agent.warmstart.cache={tmp_path / 'cache'}", "agent.warmstart.seed=0"]
    assert cli_main(["bench", "--suite", str(path), "--out", str(tmp_path / "par"), "--no-progress", "--workers", "2", "--",
                       *shared]) == 0
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1 and (entries[0] / "warmstart.json").is_file()
    assert cli_main(["bench", "--suite", str(path), "--out", str(tmp_path / "ser"), "--no-progress", "--", *shared]) == 0

    def rows(out):
        return [{k: r[k] for k in ("env", "method", "seed", "before", "final", "sampled_tokens")}
                for r in csv.DictReader((out / "results.csv").open())]

    assert rows(tmp_path / "par") == rows(tmp_path / "ser") and len(rows(tmp_path / "ser")) == 4
    # every cell started RL from the same warm-started model: the same held-out success before RL
    assert len({r["before"] for r in rows(tmp_path / "ser")}) == 1

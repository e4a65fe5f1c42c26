"""The credit-method benchmark: a real 2 x 1 grid of tiny runs, and its table / plot / HTML."""

import json

import pytest

from turnrl.bench.grid import compose_run, main
from turnrl.bench.report import RunRecord, markdown_table

FAST = ["trainer.steps=2", "trainer.eval_every=1", "trainer.eval_episodes=8", "trainer.tasks_per_step=2",
        "trainer.group_size=2", "agent.warmstart.steps=5", "agent.tokenizer.corpus_episodes=20",
        "trainer.threads=1", "trainer.progress=false", "trainer.tensorboard=false", "trainer.save_checkpoint=false"]


@pytest.mark.slow
@pytest.mark.e2e
def test_a_grid_trains_every_cell_and_writes_the_reports(tmp_path, capsys):
    assert main(["--algorithms", "grpo", "rloo", "--seeds", "3", "--out", str(tmp_path), *FAST]) == 0
    runs = json.loads((tmp_path / "bench.json").read_text())
    assert [(r["algorithm"], r["seed"]) for r in runs] == [("grpo", 3), ("rloo", 3)]
    assert all([step for step, _ in r["evals"]] == [0, 1, 2] for r in runs)
    table = (tmp_path / "table.md").read_text()
    assert "| grpo | 1 |" in table and "| rloo | 1 |" in table
    html = (tmp_path / "report.html").read_text()
    assert "data:image/png;base64," in html and "rloo" in html
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert "report:" in capsys.readouterr().out


def test_summary_is_mean_and_std_over_seeds():
    records = [RunRecord("gigpo", 0, 0.1, 0.5, [(0, 0.1), (10, 0.5)]), RunRecord("gigpo", 1, 0.1, 0.7, [(0, 0.1), (10, 0.7)])]
    # after: mean .6, std sqrt(((.1)^2 + (.1)^2) / 1) = .14; AUC: runs .3 and .4 -> .35 ± .07
    assert "| gigpo | 2 | 0.10 ± 0.00 | 0.60 ± 0.14 | 0.35 ± 0.07 |" in markdown_table(records)


def test_a_bad_override_fails_before_any_run():
    with pytest.raises(Exception, match="stepz"):
        compose_run("grpo", 0, ["trainer.stepz=1"])


@pytest.mark.slow
@pytest.mark.e2e
def test_variants_run_every_algorithm_under_each_named_set_of_overrides(tmp_path):
    async1 = "trainer.async_rollouts=true trainer.max_staleness=1 algorithm.tis=token"
    assert main(["--algorithms", "grpo", "--seeds", "0", "--out", str(tmp_path), "--variant", "sync", "",
                 "--variant", "async_k1", async1, *FAST]) == 0
    runs = json.loads((tmp_path / "bench.json").read_text())
    assert [r["algorithm"] for r in runs] == ["grpo [sync]", "grpo [async_k1]"]
    lags = [[json.loads(line).get("policy_lag") for line in (tmp_path / "grpo" / v / "seed0" / "metrics.jsonl")
             .read_text().splitlines() if '"kind": "train"' in line] for v in ("sync", "async_k1")]
    assert lags == [[0.0, 0.0], [0.0, 1.0]]  # the variant's overrides reached its runs only
    assert "| grpo [async_k1] | 1 |" in (tmp_path / "table.md").read_text()
    with pytest.raises(SystemExit):
        main(["--variant", "a b", "", "--out", str(tmp_path), *FAST])

"""``turnrl credit-lab`` end to end on a small sweep: every method of every cell reported."""

import csv

from turnrl.cli import main
from turnrl.bench.credit_lab.estimate import lab_methods


def test_credit_lab_writes_its_report(tmp_path, capsys):
    out = tmp_path / "lab"
    assert main(["credit-lab", "--sweeps", "ragged", "--batches", "40", "--workers", "1", "--out", str(out),
                 "--no-progress"]) == 0
    for name in ("results.csv", "tables.md", "lab.png", "report.html"):
        assert (out / name).stat().st_size > 0
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 3 * len(lab_methods())
    assert {r["x"] for r in rows} == {"stop=0", "stop=0.1", "stop=0.2"}
    for r in rows:
        assert -1.0 <= float(r["cosine"]) <= 1.0 and 0.0 <= float(r["angle"]) <= 180.0
        assert 1 / 5000 <= float(r["p_direction"]) <= 1.0 and 0.0 <= float(r["p_scale"]) <= 1.0
        assert float(r["bias2"]) >= 0.0 and float(r["variance"]) >= 0.0
        assert int(r["batches"]) == 40
    printed = capsys.readouterr().out
    assert "### ragged" in printed and "| turn_returns |" in printed and "report.html" in printed
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "turn_mean_incl_self" in html


def test_unknown_sweep_is_a_usage_error(tmp_path, capsys):
    assert main(["credit-lab", "--sweeps", "horizon", "depth", "--out", str(tmp_path)]) == 2
    assert "unknown sweeps ['depth']" in capsys.readouterr().err

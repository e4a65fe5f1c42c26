"""``scripts/reliability_report.py`` (load and faults against the real parts, on loopback) runs
its cheap cases end to end, prints its table and writes a record whose every case passed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "reliability_report.py"


@pytest.mark.slow
@pytest.mark.e2e
def test_the_report_runs_the_tool_and_hostile_client_cases_and_records_them(tmp_path):
    record, page = tmp_path / "record.json", tmp_path / "reliability.md"
    cases = ["tools", "hostile_clients"]
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--cases", ",".join(cases), "--json", str(record),
                           "--markdown", str(page)], capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(record.read_text())
    assert [c["case"] for c in got["cases"]] == cases
    for case in got["cases"]:
        assert case["passed"] and case["checks"] and case["error"] is None, case
        assert all(check["passed"] for check in case["checks"])
    assert got["passed"] and got["quick"]
    assert got["command"] == f"python scripts/reliability_report.py --quick --cases tools,hostile_clients " \
                             f"--json {record} --markdown {page}"
    assert got["machine"]["cores"] >= 1 and got["machine"]["python"] and "commit" in got["git"]
    for case in cases:  # a table row each, on stdout and on the page; a progress line each on stderr
        assert any(line.startswith(case) and line.rstrip().endswith("pass") for line in proc.stdout.splitlines())
        assert f"| `{case}` |" in page.read_text()
        assert f"{case}]: start:" in proc.stderr
    tools = got["cases"][0]["figures"]["episodes"]
    assert {name: ep["termination"] for name, ep in tools.items()} == {
        "hang": "tool_error", "explode": "terminated", "flood": "env_error", "down": "tool_error"}


def test_an_unknown_case_is_a_usage_error():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import reliability_report
    finally:
        sys.path.remove(str(SCRIPT.parent))
    with pytest.raises(SystemExit) as exit_:
        reliability_report.parse_args(["--cases", "load,no_such_case"])
    assert exit_.value.code == 2
    opts = reliability_report.parse_args(["--quick", "--cases", "load"])
    assert (opts.sessions, opts.seconds, opts.cases) == (32, 5.0, ["load"])
    assert opts.json.parent.name == "reliability" and "docs" not in opts.json.parts  # a quick run leaves docs/ alone
    full = reliability_report.parse_args([])
    assert (full.sessions, full.seconds) == (200, 60.0) and full.json == ROOT / "docs" / "reliability" / "record.json"

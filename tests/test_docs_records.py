"""Figures in the README and docs come from committed records: each table here is rebuilt from
its record and must equal the text the page shows."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_demo_table_is_its_record():
    record = json.loads((ROOT / "docs/results/readme_demo.json").read_text())
    table = _script("readme_demo").table(record["rows"])
    assert table in (ROOT / "README.md").read_text(), f"README's demo table differs from its record:\n{table}"
    assert not record["git"]["dirty"] and len(record["git"]["commit"]) == 40
    assert {"cores", "cpu_model", "torch", "transformers"} <= set(record["machine"])


def test_the_reliability_page_shows_its_records_figures():
    record = json.loads((ROOT / "docs/reliability/record.json").read_text())
    page = (ROOT / "docs/reliability.md").read_text()
    for case in record["cases"]:
        row = next((line for line in page.splitlines() if line.startswith(f"| `{case['case']}` |")), None)
        assert row is not None, case["case"]
        assert case["figure"] in row and ("pass" if case["passed"] else "FAIL") in row, (case["case"], row)

"""Figures in the README and docs come from committed records: each table here is rebuilt from
its record and must equal the text the page shows."""

import importlib.util
import json
import re
import sys
from pathlib import Path

from turnrl.bench.record import load

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_measured_table_in_the_pages_equals_its_record():
    """Each ``<!-- record-table NAME -->`` block is exactly what its record gives now."""
    doc_tables = _script("doc_tables")
    assert doc_tables.sync(check=True) == [], "run: .venv/bin/python scripts/doc_tables.py"


def test_every_record_is_shown_and_says_what_it_measured():
    """No record sits unused, none is made of uncommitted code, each names its machine."""
    doc_tables = _script("doc_tables")
    shown = doc_tables.shown()
    assert set(shown) == set(doc_tables.TABLES), set(shown) ^ set(doc_tables.TABLES)
    assert shown["readme_demo"] == ["README.md"]
    used = {file for table in doc_tables.TABLES.values() for file in table.records}
    assert used == {p.name for p in (ROOT / "docs/results").glob("*.json")}
    for name in sorted(used):
        record = load(ROOT / "docs/results" / name)
        assert re.fullmatch(r"[0-9a-f]{40}", record.commit or "") and not record.dirty, name
        assert (ROOT / record.script).is_file() and record.command.startswith(
            (f"python {record.script}", "python -m turnrl ")), name
        assert {"cores", "cpu_model", "torch", "load_average_at_end"} <= set(record.machine) or \
            name == "readme_demo.json", name


def test_a_table_that_differs_from_its_record_is_found(tmp_path, monkeypatch):
    doc_tables = _script("doc_tables")
    page = tmp_path / "README.md"
    good = f"<!-- record-table readme_demo -->\n{doc_tables.render('readme_demo')}\n<!-- /record-table -->"
    page.write_text("intro\n" + good.replace("| 0 | 0.23 |", "| 0 | 0.24 |") + "\nend\n")
    monkeypatch.setattr(doc_tables, "ROOT", tmp_path)
    assert doc_tables.sync(check=True) == ["README.md: readme_demo"]
    assert "0.24" in page.read_text()  # --check changes nothing
    assert doc_tables.sync() == ["README.md: readme_demo"]
    assert page.read_text() == "intro\n" + good + "\nend\n" and doc_tables.sync(check=True) == []


def test_the_reliability_page_shows_its_records_figures():
    record = json.loads((ROOT / "docs/reliability/record.json").read_text())
    page = (ROOT / "docs/reliability.md").read_text()
    for case in record["cases"]:
        row = next((line for line in page.splitlines() if line.startswith(f"| `{case['case']}` |")), None)
        assert row is not None, case["case"]
        assert case["figure"] in row and ("pass" if case["passed"] else "FAIL") in row, (case["case"], row)

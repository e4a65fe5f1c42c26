"""Minimal Google-style docstring reader: summary paragraph and ``Args:`` entries."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters)\s*:\s*$")
_ENTRY = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


@dataclass(frozen=True)
class Docstring:
    """The parts of a Google-style docstring that tool schemas need.

    Attributes:
        summary: First paragraph, lines joined by single spaces ("" if no docstring).
        args: Parameter name -> description (continuation lines joined by spaces).
    """

    summary: str
    args: dict[str, str] = field(default_factory=dict)


def parse_docstring(doc: str | None) -> Docstring:
    """Parse a cleaned docstring (as returned by ``inspect.getdoc``).

    Args:
        doc: The docstring, or None.

    Returns:
        The summary paragraph and the ``Args:`` section entries. An entry is
        ``name: text`` or ``name (type): text``; more-indented lines continue it;
        a line indented no deeper than the ``Args:`` header ends the section.
    """
    if not doc:
        return Docstring(summary="")
    lines = doc.strip("\n").splitlines()
    summary_lines: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line):
            break
        summary_lines.append(line.strip())
    return Docstring(summary=" ".join(summary_lines), args=_parse_args(lines))


def _parse_args(lines: list[str]) -> dict[str, str]:
    args: dict[str, str] = {}
    start = next((i for i, line in enumerate(lines) if _SECTION.match(line)), None)
    if start is None:
        return args
    header_indent = len(_SECTION.match(lines[start]).group(1))
    entry_indent: int | None = None
    current: str | None = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= header_indent:
            break
        if entry_indent is None:
            entry_indent = indent
        match = _ENTRY.match(line.strip())
        if indent == entry_indent and match:
            current = match.group(1).lstrip("*")
            args[current] = match.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {line.strip()}".strip()
    return args

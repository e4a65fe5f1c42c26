"""Reading integers out of free-form model text."""

from __future__ import annotations

import re

MAX_DIGITS = 18
"""Longer digit runs are treated as unreadable (avoids huge int conversions)."""

INTEGER = re.compile(r"-?\d+")


def first_int(text: str, pattern: re.Pattern[str] = INTEGER) -> int | None:
    """The integer in the first match of ``pattern`` (its group 1 if any, else the match).

    Args:
        text: Model text.
        pattern: A regex whose first group (or whole match) is ``-?\\d+``.

    Returns:
        The integer, or None if there is no match or it has over ``MAX_DIGITS`` digits.
    """
    match = pattern.search(text)
    if match is None:
        return None
    digits = match.group(1) if pattern.groups else match.group(0)
    if len(digits.lstrip("-")) > MAX_DIGITS:
        return None
    return int(digits)

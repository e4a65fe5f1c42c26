"""Schedules of a coefficient over training steps (entropy bonus, sampling temperature).

A schedule is a pure function ``fn(start, end, step, total) -> value`` with ``step`` in
``0..total``: ``value(0) = start`` and ``value(total) = end``.
"""

from __future__ import annotations

import math

from turnrl.registry import Registry

SCHEDULES: Registry = Registry("schedule")


@SCHEDULES.register("constant")
def constant(start: float, end: float, step: int, total: int) -> float:
    """Always ``start`` (``end`` is ignored)."""
    return start


@SCHEDULES.register("linear")
def linear(start: float, end: float, step: int, total: int) -> float:
    """Straight line from ``start`` to ``end``."""
    return start + (end - start) * min(max(step / max(total, 1), 0.0), 1.0)


@SCHEDULES.register("cosine")
def cosine(start: float, end: float, step: int, total: int) -> float:
    """Half a cosine from ``start`` to ``end``: slow at both ends."""
    frac = min(max(step / max(total, 1), 0.0), 1.0)
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * frac))

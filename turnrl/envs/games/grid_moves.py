"""Moves on a text grid (``up/down/left/right``): reading them from model text, drawing random ones.

Shared by the grid-puzzle envs (``frozen_lake``, ``sokoban``). A reply's moves are its
direction words in order, case-insensitive, as whole words (``"Up, then left"`` is
``("up", "left")``). When the reply holds an ``<answer>...</answer>`` block (the RAGEN
format), only the first block is read, so reasoning around it is ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

__all__ = ["DIRECTIONS", "MOVES", "MoveParse", "moves_instruction", "parse_moves", "random_moves"]

MOVES: tuple[str, ...] = ("up", "down", "left", "right")
DIRECTIONS = MappingProxyType({"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)})
"""Move name -> ``(row delta, column delta)``; row 0 is the top row."""

MOVE_WORD = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)
ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class MoveParse:
    """The moves read from one reply.

    Attributes:
        moves: The moves to play, in order (at most the limit; empty when none was found).
        dropped: How many further moves the reply named beyond the limit (ignored).
    """

    moves: tuple[str, ...]
    dropped: int = 0


def parse_moves(text: str, limit: int) -> MoveParse:
    """Read up to ``limit`` moves from ``text`` (see the module docstring for the rule).

    Args:
        text: The assistant turn.
        limit: The most moves played per turn (a positive int).

    Raises:
        ValueError: If ``limit`` is not a positive int.
    """
    if not isinstance(limit, (int, np.integer)) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    block = ANSWER_BLOCK.search(text)
    words = [m.lower() for m in MOVE_WORD.findall(block.group(1) if block else text)]
    return MoveParse(tuple(words[:limit]), max(0, len(words) - limit))


def random_moves(rng: np.random.Generator, count: int) -> str:
    """``count`` uniformly random moves joined by ``", "`` (e.g. ``"left, up"``)."""
    return ", ".join(MOVES[int(i)] for i in rng.integers(len(MOVES), size=count))


def moves_instruction(moves_per_turn: int) -> str:
    """The reply format sentence for ``moves_per_turn`` moves per turn."""
    if moves_per_turn == 1:
        return "Reply with one move: up, down, left or right."
    return f"Reply with up to {moves_per_turn} moves in order, e.g. \"up, left\" (each up, down, left or right)."

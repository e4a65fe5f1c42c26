"""Sokoban levels: the board, a move-optimal BFS solver, and a reverse-play level generator.

A ``Level`` is a rectangular board (walls around the floor, which fits in a ``size x size``
area; the board is cropped to the floor plus one wall border) with targets, boxes and the
player; cells are flat indices ``row * width + col`` (row 0 is the top).

``generate_level`` follows the gym-sokoban recipe: carve a room with a random walk of small
masks, put the boxes on their targets (the solved state), then play backwards (the player
walks and sometimes pulls a box behind it). A pull is the exact inverse of a push, so every
generated level is solvable; ``solve`` then finds the optimal (fewest moves) solution, and
levels whose solution is shorter than ``min_moves`` or longer than ``max_moves`` are rejected.

Text symbols (``SYMBOLS``): ``#`` wall, ``_`` floor, ``O`` target, ``X`` box, ``*`` box on a
target, ``P`` player, ``S`` player on a target.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from turnrl.envs.games.grid_moves import MOVES

__all__ = ["Level", "SYMBOLS", "dead_cells", "generate_level", "parse_level", "push", "solve"]

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "*", "P", "S"
SYMBOLS = MappingProxyType({
    WALL: "wall", FLOOR: "floor", TARGET: "target", BOX: "box", BOX_ON_TARGET: "box on a target",
    PLAYER: "player", PLAYER_ON_TARGET: "player on a target",
})
TEST_BUCKETS = 4  # one hash bucket in four is the test split
SOLVER_MAX_STATES = 200_000
"""The solver gives up (returns None) after visiting this many states."""
ROOM_MASKS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)
"""Cells (row, col offsets) carved around the walker at each step (gym-sokoban's masks)."""
ROOM_TURN_PROB = 0.35
PULL_PROB = 0.8
"""Probability that a backward step pulls the box behind the player along."""

State = tuple[int, frozenset[int]]
"""``(player cell, box cells)``."""


@dataclass(frozen=True)
class Level:
    """A Sokoban board and its starting state.

    Attributes:
        width: Columns, walls included.
        height: Rows, walls included.
        walls: Wall cells (the border is always wall).
        targets: Target cells (as many as boxes).
        boxes: Box cells at the start.
        player: The player's cell at the start.
        solution: An optimal (fewest moves) solution from the start, as move names.
    """

    width: int
    height: int
    walls: frozenset[int]
    targets: frozenset[int]
    boxes: frozenset[int]
    player: int
    solution: tuple[str, ...] = ()

    def offset(self, move: str) -> int:
        """The flat-index step of ``move``."""
        return {"up": -self.width, "down": self.width, "left": -1, "right": 1}[move]

    def render(self, player: int | None = None, boxes: frozenset[int] | None = None) -> str:
        """The board as text rows (``SYMBOLS``) with the player and boxes given (default: the start)."""
        player = self.player if player is None else player
        boxes = self.boxes if boxes is None else boxes
        rows = []
        for r in range(self.height):
            row = []
            for i in range(r * self.width, (r + 1) * self.width):
                on_target = i in self.targets
                if i in self.walls:
                    row.append(WALL)
                elif i == player:
                    row.append(PLAYER_ON_TARGET if on_target else PLAYER)
                elif i in boxes:
                    row.append(BOX_ON_TARGET if on_target else BOX)
                else:
                    row.append(TARGET if on_target else FLOOR)
            rows.append("".join(row))
        return "\n".join(rows)

    @property
    def text(self) -> str:
        """The starting board with rows joined by ``/`` (the split hash and the task id use it)."""
        return self.render().replace("\n", "/")

    @property
    def split(self) -> str:
        return "test" if zlib.crc32(self.text.encode()) % TEST_BUCKETS == 0 else "train"


def parse_level(text: str, max_states: int = SOLVER_MAX_STATES) -> Level:
    """A solvable level from text rows (split by ``/`` or newlines) in the ``SYMBOLS`` legend,
    with its optimal solution (``solve``).

    Raises:
        ValueError: If the rows differ in length, a symbol is unknown, the border is not all
            wall, there is not exactly one player, no box, or boxes and targets differ in
            number, or the solver finds no solution (within ``max_states`` states).
    """
    if not isinstance(text, str):
        raise TypeError(f"a level must be a str of rows split by '/' or newlines, got {type(text).__name__}")
    rows = [row for row in text.replace("/", "\n").split("\n") if row.strip()]
    width = len(rows[0]) if rows else 0
    if len(rows) < 3 or width < 3 or any(len(row) != width for row in rows):
        raise ValueError(f"level {text!r} must have at least 3 rows of one length (at least 3)")
    unknown = set("".join(rows)) - set(SYMBOLS)
    if unknown:
        raise ValueError(f"level {text!r} has unknown symbols {sorted(unknown)}; legend: {dict(SYMBOLS)}")
    border = rows[0] + rows[-1] + "".join(row[0] + row[-1] for row in rows)
    if set(border) != {WALL}:
        raise ValueError(f"level {text!r} must be closed: its first and last rows and columns must be {WALL!r}")
    cells = {symbol: frozenset(i for i, c in enumerate("".join(rows)) if c == symbol) for symbol in SYMBOLS}
    players = cells[PLAYER] | cells[PLAYER_ON_TARGET]
    boxes = cells[BOX] | cells[BOX_ON_TARGET]
    targets = cells[TARGET] | cells[BOX_ON_TARGET] | cells[PLAYER_ON_TARGET]
    if len(players) != 1 or not boxes or len(boxes) != len(targets):
        raise ValueError(f"level {text!r} needs one player, at least one box, and as many targets as boxes; "
                         f"has {len(players)} player(s), {len(boxes)} box(es), {len(targets)} target(s)")
    level = Level(width, len(rows), cells[WALL], targets, boxes, next(iter(players)))
    solution = solve(level, max_states=max_states)
    if solution is None:
        raise ValueError(f"level {text!r} is unsolvable (or needs more than {max_states} solver states)")
    return Level(level.width, level.height, level.walls, targets, boxes, level.player, solution)


def push(level: Level, state: State, move: str) -> tuple[State, str]:
    """Apply one move by the push rules; returns the new state and what happened.

    What happened is ``"moved"``, ``"pushed"`` (a box moved one cell), ``"wall"`` (a wall is
    in the way) or ``"stuck"`` (a box that cannot move, blocked by a wall or another box);
    the state is unchanged in the last two cases.
    """
    player, boxes = state
    d = level.offset(move)
    nxt = player + d
    if nxt in level.walls:
        return state, "wall"
    if nxt not in boxes:
        return (nxt, boxes), "moved"
    beyond = nxt + d
    if beyond in level.walls or beyond in boxes:
        return state, "stuck"
    return (nxt, (boxes - {nxt}) | {beyond}), "pushed"


@functools.lru_cache(maxsize=1024)
def dead_cells(width: int, height: int, walls: frozenset[int], targets: frozenset[int]) -> frozenset[int]:
    """Floor cells from which a lone box can never be pushed onto any target."""
    offsets = (-width, width, -1, 1)
    floor = {i for i in range(width * height) if i not in walls}
    live, queue = set(targets), list(targets)
    while queue:  # a box can reach a live cell y from x = y - d if the player can stand at x - d
        y = queue.pop()
        for d in offsets:
            x = y - d
            if x in floor and x - d in floor and x not in live:
                live.add(x)
                queue.append(x)
    return frozenset(floor - live)


def solve(level: Level, player: int | None = None, boxes: frozenset[int] | None = None,
          max_moves: int | None = None, max_states: int = SOLVER_MAX_STATES) -> tuple[str, ...] | None:
    """A fewest-moves solution from ``(player, boxes)`` (default: the level's start) by BFS.

    Ties are broken by the order of ``MOVES``, so the answer is deterministic. Pushes of a
    box onto a dead cell (``dead_cells``) are pruned; they can never lead to a solution.

    Returns:
        The moves, ``()`` when already solved, or None when there is no solution within
        ``max_moves`` moves (unsolvable, too long, or over ``max_states`` states visited).
    """
    start: State = (level.player if player is None else player, level.boxes if boxes is None else boxes)
    targets = level.targets
    if start[1] == targets:
        return ()
    walls, dead = level.walls, dead_cells(level.width, level.height, level.walls, targets)
    steps = tuple((move, level.offset(move)) for move in MOVES)
    parents: dict[State, tuple[State, str] | None] = {start: None}
    frontier, depth = [start], 0
    while frontier and (max_moves is None or depth < max_moves) and len(parents) <= max_states:
        depth += 1
        following = []
        for state in frontier:
            p, bx = state
            for move, d in steps:
                q = p + d
                if q in walls:
                    continue
                if q in bx:
                    b = q + d
                    if b in walls or b in bx or b in dead:
                        continue
                    new: State = (q, (bx - {q}) | {b})
                else:
                    new = (q, bx)
                if new in parents:
                    continue
                parents[new] = (state, move)
                if new[1] == targets:
                    return _path(parents, new)
                following.append(new)
        frontier = following
    return None


def _path(parents: dict[State, tuple[State, str] | None], state: State) -> tuple[str, ...]:
    moves = []
    while (link := parents[state]) is not None:
        state, move = link
        moves.append(move)
    return tuple(reversed(moves))


def carve_room(rng: np.random.Generator, size: int) -> frozenset[tuple[int, int]]:
    """Floor cells ``(row, col)`` (1-based inside the wall border) carved by a random walk."""
    steps = int(1.7 * 2 * size)
    r, c = (int(x) for x in rng.integers(1, size + 1, size=2))
    dr, dc = ((-1, 0), (1, 0), (0, -1), (0, 1))[int(rng.integers(4))]
    floor: set[tuple[int, int]] = set()
    for _ in range(steps):
        if rng.random() < ROOM_TURN_PROB:
            dr, dc = ((-1, 0), (1, 0), (0, -1), (0, 1))[int(rng.integers(4))]
        r, c = min(max(r + dr, 1), size), min(max(c + dc, 1), size)
        for mr, mc in ROOM_MASKS[int(rng.integers(len(ROOM_MASKS)))]:
            if 1 <= r + mr <= size and 1 <= c + mc <= size:
                floor.add((r + mr, c + mc))
    return frozenset(floor)


def generate_level(rng: np.random.Generator, size: int, num_boxes: int, min_moves: int, max_moves: int,
                   reverse_steps: int | None = None) -> Level | None:
    """One draw of a level (see the module docstring); None when the draw is rejected.

    Args:
        rng: The only source of randomness.
        size: Side of the square area the room is carved in (the board is the room's bounding
            box plus a wall border, at most ``size + 2`` wide and high).
        num_boxes: Boxes (and targets).
        min_moves: Shortest accepted optimal solution, in moves.
        max_moves: Longest accepted optimal solution, in moves.
        reverse_steps: Length of the backward walk; default ``2 * max_moves``.
    """
    cells = carve_room(rng, size)
    if len(cells) < num_boxes + 3:
        return None
    top, left = min(r for r, _ in cells) - 1, min(c for _, c in cells) - 1
    height, width = max(r for r, _ in cells) - top + 2, max(c for _, c in cells) - left + 2
    floor = sorted((r - top) * width + (c - left) for r, c in cells)
    picks = rng.choice(len(floor), size=num_boxes + 1, replace=False)
    player, targets = floor[int(picks[0])], frozenset(floor[int(i)] for i in picks[1:])
    walls = frozenset(range(width * height)) - frozenset(floor)
    boxes = set(targets)
    offsets = (-width, width, -1, 1)
    for _ in range(2 * max_moves if reverse_steps is None else reverse_steps):
        d = offsets[int(rng.integers(4))]
        nxt = player + d
        if nxt in walls or nxt in boxes:
            continue
        behind = player - d
        if behind in boxes and rng.random() < PULL_PROB:
            boxes.remove(behind)
            boxes.add(player)
        player = nxt
    if boxes & targets:
        return None
    level = Level(width, height, walls, targets, frozenset(boxes), player)
    solution = solve(level, max_moves=max_moves)
    if solution is None or len(solution) < min_moves:
        return None
    return Level(width, height, walls, targets, frozenset(boxes), player, solution)

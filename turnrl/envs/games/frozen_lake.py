"""FrozenLake: walk across a procedurally generated frozen lake to the goal without falling in.

Description:
    A task is a ``size x size`` map (default 4, up to 8) with a start, a goal and holes. The
    start and goal are distinct uniformly drawn cells; every other cell is a hole with
    probability ``hole_prob`` (default 0.25). A map is kept only when its shortest start-goal
    path (BFS) has between ``size - 1`` (or ``min_path`` when set) and ``2 * size + 2`` moves,
    so every map is solvable and none is trivial. This is our own text version (not
    gymnasium's ``FrozenLake-v1`` with its fixed corners), in the spirit of the RAGEN benchmark.

Action Space:
    The assistant's text; its direction words ``up/down/left/right`` in order are the moves
    (``turnrl.envs.games.grid_moves``: whole words, any case, only inside ``<answer>...</answer>``
    when the reply has such a block). Up to ``moves_per_turn`` moves (default 1) are played
    per turn; further ones are ignored (and the reply says so). With ``is_slippery=True`` a
    move goes the intended way with probability 1/3 and to each perpendicular side with 1/3,
    as in gymnasium, drawn from the env's ``np_random`` (seeded by ``reset``).

Observation Space:
    System prompt: the rules and the legend ``P`` player, ``.`` frozen ice, ``O`` hole,
    ``G`` goal (row 1 is the top; a move off the edge leaves the player in place). The first
    user message shows the map and the reply format. After each turn one user message: one
    line per move played (``"right: moved"``, ``"up: blocked by the edge, stayed"``, with
    ``" (slipped left)"`` after the move name when the ice slipped, ``"down: fell into a
    hole"``, ``"left: reached the goal"``) and then the map, or the verdict when the episode
    ends. A reply without a move gets ``"No move found. <format>"``; the turn still counts.

    ``view="local"`` shows, instead of the map, where the goal lies and what is next to the
    player: ``"Goal: 2 down, 3 right. Next to you: up edge, down ice, left hole, right
    ice."`` (cells ``ice``, ``hole``, ``goal``, ``edge``), about 20 tokens a turn instead of a
    whole map. It is partially observable (a dead end behind a wall of holes is not seen) and
    keeps long episodes short in tokens. ``view="toward"`` shows the same cells ordered the way
    a player heading for the goal reads them: the goal's directions first, the larger offset
    first, each with the cell one step that way, then the other moves: ``"Goal: 3 right
    (hole), 2 down (ice). Else: up edge, left ice."`` (the move to play is the first one, or
    the second when the first is a hole: a choice read off fixed places in the text).

Rewards:
    1.0 on the turn the player reaches the goal, 0.0 otherwise (also for falling in a hole).

Episode End:
    Terminated on reaching the goal (success) or falling into a hole (failure); truncated
    after ``max_turns`` turns, by default ``ceil((2 * size + 2) / moves_per_turn) + 2`` (12 for
    the 4x4 default, ``2 * size + 4`` with one move per turn): the path cap plus 2 turns, so
    the expert's shortest path fits on every map.

Splits:
    A map is test when ``crc32(map text) % 4 == 0`` (map rows joined by ``/`` with ``S``
    start, ``G`` goal, ``O`` holes, ``.`` ice), else train; maps are drawn by rejection.
    With fixed ``maps`` (e.g. gymnasium's ``"SFFF/FHFH/FFFH/HFFG"``) each split draws from
    the given maps in its bucket.
    ``task_id = "frozen_lake-" + map text``. ``state_key`` is the player's ``(row, col)``
    (the map is implied by the task).

Scripted players:
    ``expert_action`` on firm ice plays the first ``moves_per_turn`` moves of a BFS shortest
    path from the player's cell: it solves every map within ``max_turns``. On slippery ice no
    player can be sure to win, so the checker's "expert solves every seed" holds only for the
    default ``is_slippery=False``; there the expert plays one move per turn, the one that
    maximises the chance to reach the goal in the turns left (``slippery_plan``, exact dynamic
    programming). ``random_action`` plays ``moves_per_turn`` uniformly random moves;
    ``weak_expert_action`` (map view) plays the expert's moves with p=0.4, else random ones.
    ``local_action`` is the best a player seeing only the local view can do without memory:
    a step toward the goal that is not a hole (the larger offset first), else a sideways one;
    ``toward_action`` steps toward the goal along the larger offset even into a hole. Under
    ``view="local"`` and ``"toward"`` the weak player mixes them (``local_action`` with
    p=``weak_skill``, default 0.3), since the expert's moves cannot be read off those views:
    imitating them teaches noise.
    Measured with ``python -m turnrl baselines turnrl/FrozenLake-v0 --episodes 200`` (default
    kwargs), success (mean turns): test random 0.11 (6.1), weak 0.52 (6.2), expert 1.00
    (3.9); train random 0.07, weak 0.52, expert 1.00. Other settings (seeds 0..199 of both
    splits): ``is_slippery=True`` random 0.09, weak 0.19, expert 0.37 (0.65 with
    ``max_turns=30``); ``size=8`` random 0.00, weak 0.12, expert 1.00;
    ``size=5, min_path=8`` (test) random 0.00, weak 0.09, expert 1.00 (8.7 turns).

Version History:
    v0: initial version.
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.envs.games.grid_moves import DIRECTIONS, MOVES, moves_instruction, parse_moves, random_moves
from turnrl.tools import ParseResult, ToolResult

__all__ = ["FrozenLakeEnv", "LakeMap", "generate_map", "local_move", "local_solves", "parse_map", "shortest_path",
           "slippery_plan"]

START, GOAL, HOLE, ICE, PLAYER = "S", "G", "O", ".", "P"
VIEWS = ("map", "local", "toward")
CELL_WORDS = {ICE: "ice", START: "ice", HOLE: "hole", GOAL: "goal"}
MIN_SIZE, MAX_SIZE = 3, 8
TEST_BUCKETS = 4  # one hash bucket in four is the test split
MAX_DRAWS = 10_000
WEAK_FOLLOW_PROB = 0.4
"""Probability that ``weak_expert_action`` plays the expert's move (else a random one)."""
LOCAL_WEAK_AROUND_PROB = 0.3
"""Under the local view, probability that ``weak_expert_action`` steps around holes
(``local_action``) rather than straight toward the goal (``toward_action``)."""
PERPENDICULAR = {"up": ("left", "right"), "down": ("left", "right"), "left": ("up", "down"), "right": ("up", "down")}

Pos = tuple[int, int]


@dataclass(frozen=True)
class LakeMap:
    """A square map: ``rows`` of ``S`` start, ``G`` goal, ``O`` hole and ``.`` ice cells."""

    rows: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def text(self) -> str:
        """The rows joined by ``/`` (the split hash and the task id use it)."""
        return "/".join(self.rows)

    @property
    def start(self) -> Pos:
        return self._find(START)

    @property
    def goal(self) -> Pos:
        return self._find(GOAL)

    @property
    def split(self) -> str:
        return "test" if zlib.crc32(self.text.encode()) % TEST_BUCKETS == 0 else "train"

    def cell(self, pos: Pos) -> str:
        return self.rows[pos[0]][pos[1]]

    def render(self, player: Pos) -> str:
        """The map as the model sees it: ``P`` on the player's cell, the start shown as ice."""
        lines = []
        for r, row in enumerate(self.rows):
            cells = [ICE if c == START else c for c in row]
            if r == player[0]:
                cells[player[1]] = PLAYER
            lines.append("".join(cells))
        return "\n".join(lines)

    def render_local(self, player: Pos) -> str:
        """The local view: the goal's offset and the four neighbouring cells, e.g.
        ``"Goal: 2 down, 3 right. Next to you: up edge, down ice, left hole, right ice."``"""
        (gr, gc), (r, c) = self.goal, player
        offsets = [f"{abs(d)} {name}" for d, name in ((gr - r, "down" if gr > r else "up"),
                                                      (gc - c, "right" if gc > c else "left")) if d]
        around = []
        for move in MOVES:
            nxt = step_pos(self.size, player, move)
            around.append(f"{move} {'edge' if nxt == player else CELL_WORDS[self.cell(nxt)]}")
        return f"Goal: {', '.join(offsets) or 'here'}. Next to you: {', '.join(around)}."

    def render_toward(self, player: Pos) -> str:
        """The toward view: the local view's cells, ordered the way a player heading for the goal
        reads them. The goal's directions come first, the larger offset first (vertical on a
        tie), each with the cell one step that way; then the other moves in ``MOVES`` order, e.g.
        ``"Goal: 3 right (hole), 2 down (ice). Else: left ice, up edge."``"""
        toward = toward_moves(self.goal, player)
        cells = {move: ("edge" if (nxt := step_pos(self.size, player, move)) == player
                        else CELL_WORDS[self.cell(nxt)]) for move in MOVES}
        goal = [f"{d} {move} ({cells[move]})" for d, move in toward if d]
        other = [f"{move} {cells[move]}" for move in MOVES if move not in {m for d, m in toward if d}]
        return f"Goal: {', '.join(goal) or 'here'}. Else: {', '.join(other)}."

    def safe_toward(self, player: Pos) -> str:
        """The moves toward the goal that step onto no hole, the larger offset first (vertical on a
        tie): ``"Safe toward the goal: down."``, ``"... down, right."`` or ``"... none."``."""
        toward = toward_moves(self.goal, player)
        safe = [move for d, move in toward if d and self.cell(step_pos(self.size, player, move)) != HOLE]
        return f"Safe toward the goal: {', '.join(safe) or 'none'}."

    def _find(self, symbol: str) -> Pos:
        for r, row in enumerate(self.rows):
            if symbol in row:
                return r, row.index(symbol)
        raise ValueError(f"map {self.text!r} has no {symbol!r} cell")


def toward_moves(goal: Pos, pos: Pos) -> list[tuple[int, str]]:
    """``(distance, move)`` along each axis toward ``goal``, the larger offset first (vertical on
    a tie); a distance of 0 means the player is level with the goal on that axis."""
    (gr, gc), (r, c) = goal, pos
    return sorted(((abs(gr - r), "down" if gr > r else "up"), (abs(gc - c), "right" if gc > c else "left")),
                  key=lambda t: -t[0])


def step_pos(size: int, pos: Pos, move: str) -> Pos:
    """The cell one ``move`` away from ``pos``; ``pos`` itself when that leaves the map."""
    dr, dc = DIRECTIONS[move]
    r, c = pos[0] + dr, pos[1] + dc
    return (r, c) if 0 <= r < size and 0 <= c < size else pos


def shortest_path(lake: LakeMap, start: Pos) -> tuple[str, ...] | None:
    """A shortest move sequence from ``start`` to the goal avoiding holes (BFS, ties broken
    by the order of ``MOVES``); None when the goal cannot be reached."""
    goal = lake.goal
    parents: dict[Pos, tuple[Pos, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if pos == goal:
            path = []
            while parents[pos] is not None:
                pos, move = parents[pos]
                path.append(move)
            return tuple(reversed(path))
        for move in MOVES:
            nxt = step_pos(lake.size, pos, move)
            if nxt not in parents and lake.cell(nxt) != HOLE:
                parents[nxt] = (pos, move)
                queue.append(nxt)
    return None


def slippery_plan(lake: LakeMap, horizon: int) -> list[dict[Pos, tuple[float, str]]]:
    """The optimal player on slippery ice, by finite-horizon dynamic programming.

    Returns:
        ``plan[t][pos] = (p, move)``: with ``t`` moves left (``0 <= t <= horizon``) at a safe cell
        ``pos``, ``move`` maximises the probability ``p`` of reaching the goal in time (ties
        go to the earlier move of ``MOVES``).
    """
    safe = [(r, c) for r in range(lake.size) for c in range(lake.size) if lake.cell((r, c)) not in (HOLE, GOAL)]
    plan: list[dict[Pos, tuple[float, str]]] = [{pos: (0.0, MOVES[0]) for pos in safe}]
    for _ in range(horizon):
        before, best = plan[-1], {}
        for pos in safe:
            options = []
            for move in MOVES:
                value = 0.0
                for actual in (move, *PERPENDICULAR[move]):
                    nxt = step_pos(lake.size, pos, actual)
                    cell = lake.cell(nxt)
                    value += 1.0 if cell == GOAL else 0.0 if cell == HOLE else before[nxt][0]
                options.append((value / 3, move))
            best[pos] = max(options, key=lambda option: option[0])
        plan.append(best)
    return plan


def path_bounds(size: int) -> tuple[int, int]:
    """``(min, max)`` shortest-path length of an accepted ``size x size`` map."""
    return size - 1, 2 * size + 2


def parse_map(text: str) -> LakeMap:
    """A solvable map from text: rows split by ``/`` or newlines, of ``S`` start, ``G`` goal,
    ``O`` hole and ``.`` ice (gymnasium's ``F`` ice and ``H`` hole are read too).

    Raises:
        ValueError: If the map is not square (at least 2x2), has another symbol, not exactly
            one ``S`` and one ``G``, or no path from start to goal.
    """
    if not isinstance(text, str):
        raise TypeError(f"a map must be a str of rows split by '/' or newlines, got {type(text).__name__}")
    rows = tuple(row.strip().replace("F", ICE).replace("H", HOLE) for row in text.replace("/", "\n").split("\n"))
    rows = tuple(row for row in rows if row)
    if len(rows) < 2 or any(len(row) != len(rows) for row in rows):
        raise ValueError(f"map {text!r} must be square with at least 2 rows, e.g. 'S..O/.O../..../O..G'")
    symbols = set("".join(rows))
    if not symbols <= {START, GOAL, HOLE, ICE}:
        raise ValueError(f"map {text!r} has symbols {sorted(symbols - {START, GOAL, HOLE, ICE})}; "
                         f"use {START} start, {GOAL} goal, {HOLE} hole, {ICE} ice")
    joined = "".join(rows)
    if joined.count(START) != 1 or joined.count(GOAL) != 1:
        raise ValueError(f"map {text!r} needs exactly one {START} and one {GOAL}")
    lake = LakeMap(rows)
    if shortest_path(lake, lake.start) is None:
        raise ValueError(f"map {text!r} is unsolvable: no path from {START} to {GOAL} avoids the holes")
    return lake


def generate_map(rng: np.random.Generator, size: int, hole_prob: float, min_path: int | None = None) -> LakeMap | None:
    """One draw of a map (see the module docstring); None when it is rejected
    (unsolvable, or its shortest path is outside ``path_bounds(size)``, or shorter than
    ``min_path`` when given)."""
    cells = np.where(rng.random((size, size)) < hole_prob, HOLE, ICE)
    start, goal = (divmod(int(i), size) for i in rng.choice(size * size, size=2, replace=False))
    cells[start], cells[goal] = START, GOAL
    lake = LakeMap(tuple("".join(row) for row in cells))
    path = shortest_path(lake, start)
    low, high = path_bounds(size)
    low = low if min_path is None else max(low, min_path)
    return lake if path is not None and low <= len(path) <= high else None


def local_move(lake: LakeMap, pos: Pos) -> str:
    """The memoryless player of the local and toward views: a move toward the goal onto a cell
    that is not a hole (along the larger offset first), else the first such move of ``MOVES``
    that moves the player (sideways or back); ``MOVES[0]`` when every neighbour is a hole."""
    preferred = [move for d, move in toward_moves(lake.goal, pos) if d]
    for move in (*preferred, *MOVES):
        nxt = step_pos(lake.size, pos, move)
        if nxt != pos and lake.cell(nxt) != HOLE:
            return move
    return MOVES[0]


def local_solves(lake: LakeMap, max_turns: int) -> bool:
    """Whether ``local_move``, played one move a turn from the start on firm ice, reaches the goal
    within ``max_turns`` turns (it fails by walking in a loop: it has no memory)."""
    pos = lake.start
    for _ in range(max_turns):
        pos = step_pos(lake.size, pos, local_move(lake, pos))
        if pos == lake.goal:
            return True
    return False


class FrozenLakeEnv(MultiTurnEnv):
    """Walk from the start to the goal of a text map without stepping into a hole.

    Args:
        size: Side of the square map, 3..8.
        hole_prob: Probability that a cell other than start and goal is a hole, in [0, 0.6].
        is_slippery: Whether moves slip sideways (p=1/3 each side) as in gymnasium.
        moves_per_turn: Most moves played per assistant turn (RAGEN's actions per turn).
        maps: Fixed maps to draw from instead of generated ones (``parse_map`` text, e.g.
            gymnasium's ``"SFFF/FHFH/FFFH/HFFG"``); each split holds the maps of its hash
            bucket, and ``size``/``hole_prob`` are unused.
        max_turns: Turn limit; default ``ceil(L / moves_per_turn) + 2`` where ``L`` is the
            path cap ``2 * size + 2`` (with ``maps``: of the largest map, or its longest
            shortest path if longer).
        min_path: Shortest accepted start-goal path (moves) of a generated map, in
            ``[size - 1, 2 * size + 2]``; None (default) is ``size - 1``. Raising it makes every
            episode long (``min_path=8``: the expert needs 8+ turns) without a larger map.
        view: What each observation shows: ``"map"`` (default) the whole map, ``"local"`` the
            goal's offset and the four neighbouring cells, ``"toward"`` the same cells with the
            goal's directions first (see Observation Space).
        weak_skill: Probability that ``weak_expert_action`` plays the better player's move (the
            expert's on the map view, ``local_action``'s on the others); None (default) is 0.4
            on the map view and 0.3 on the others.
        show_safe: With ``view="local"`` or ``"toward"``, end each view with the moves toward the
            goal that step onto no hole: ``"Safe toward the goal: down."`` (``none`` when both
            are holes). The first one is ``local_move``'s move whenever there is one, so stepping
            around a hole is a word copied from a fixed place, not a rule read off the cells: it
            takes the reading out of the game and leaves the strategy (which cue to follow,
            learned from the outcome reward alone), as ``GuessNumberEnv(show_middle=True)`` does.
        local_solvable: Keep only maps on which ``local_move`` (the memoryless player of the
            local and toward views) reaches the goal within ``max_turns`` (firm ice only). On the
            other maps that player walks in a loop behind a wall of holes, which the local and
            toward views do not show, so they cap what any policy reading only the current view
            can win (0.78 on ``frozen_lake_long``'s maps without this); with it every failure is
            a hole stepped into or a loop walked that the view could have avoided.
        tool_parser: Parser name (the env has no tools; calls get "unknown tool").
    """

    def __init__(self, size: int = 4, hole_prob: float = 0.25, *, is_slippery: bool = False,
                 moves_per_turn: int = 1, maps: Sequence[str] | None = None, max_turns: int | None = None,
                 min_path: int | None = None, view: str = "map", weak_skill: float | None = None,
                 show_safe: bool = False, local_solvable: bool = False, tool_parser: str = "hermes") -> None:
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or not MIN_SIZE <= size <= MAX_SIZE:
            raise ValueError(f"size must be an int in [{MIN_SIZE}, {MAX_SIZE}], got {size!r}")
        if not isinstance(hole_prob, (int, float)) or isinstance(hole_prob, bool) or not 0 <= hole_prob <= 0.6:
            raise ValueError(f"hole_prob must be a number in [0, 0.6], got {hole_prob!r}")
        if not isinstance(is_slippery, bool):
            raise TypeError(f"is_slippery must be a bool, got {type(is_slippery).__name__}")
        if not isinstance(moves_per_turn, (int, np.integer)) or isinstance(moves_per_turn, bool) or moves_per_turn < 1:
            raise ValueError(f"moves_per_turn must be a positive int, got {moves_per_turn!r}")
        if view not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
        self.view = view
        if weak_skill is not None and (not isinstance(weak_skill, (int, float)) or isinstance(weak_skill, bool)
                                       or not 0 <= weak_skill <= 1):
            raise ValueError(f"weak_skill must be None or a probability in [0, 1], got {weak_skill!r}")
        default_skill = WEAK_FOLLOW_PROB if view == "map" else LOCAL_WEAK_AROUND_PROB
        self.weak_skill = default_skill if weak_skill is None else float(weak_skill)
        if isinstance(maps, str) or (maps is not None and not maps):
            raise ValueError(f"maps must be a non-empty sequence of map strings or None, got {maps!r}")
        self.maps = tuple(parse_map(m) for m in maps) if maps is not None else None
        if not isinstance(local_solvable, bool):
            raise TypeError(f"local_solvable must be a bool, got {type(local_solvable).__name__}")
        if local_solvable and is_slippery:
            raise ValueError("local_solvable=True needs firm ice (is_slippery=False): on slippery ice no "
                             "player's walk is fixed by the map")
        self.local_solvable = local_solvable
        if not isinstance(show_safe, bool):
            raise TypeError(f"show_safe must be a bool, got {type(show_safe).__name__}")
        if show_safe and view == "map":
            raise ValueError("show_safe=True needs view='local' or 'toward' (the map view shows every cell)")
        self.show_safe = show_safe
        low, high = path_bounds(int(size))
        if min_path is not None and (not isinstance(min_path, (int, np.integer)) or isinstance(min_path, bool)
                                     or not low <= min_path <= high):
            raise ValueError(f"min_path must be None or an int in [{low}, {high}] for size {size}, got {min_path!r}")
        self.min_path = None if min_path is None else int(min_path)
        self.size, self.hole_prob = int(size), float(hole_prob)
        self.is_slippery, self.moves_per_turn = is_slippery, int(moves_per_turn)
        longest = path_bounds(self.size)[1]
        if self.maps is not None:
            longest = max(max(path_bounds(m.size)[1], len(shortest_path(m, m.start) or ())) for m in self.maps)
        default_turns = math.ceil(longest / self.moves_per_turn) + 2
        super().__init__(tool_parser=tool_parser, max_turns=default_turns if max_turns is None else max_turns)
        self._pos: Pos = (0, 0)
        self._slippery_plan: list[dict[Pos, tuple[float, str]]] | None = None

    @property
    def position(self) -> Pos:
        """The player's ``(row, col)``; row 0 is the top."""
        return self._pos

    def system_prompt(self) -> str:
        """The rules, the legend and (when slippery) how the ice slips."""
        slip = (" The ice is slippery: a move goes the intended way with probability 1/3 and to each "
                "side (perpendicular) with probability 1/3." if self.is_slippery else "")
        legend = (f"Legend: {PLAYER} player, {ICE} frozen ice (safe), {HOLE} hole (falling in ends the game), "
                  f"{GOAL} goal.\n" if self.view == "map" else
                  "You do not see the map: each turn says how far the goal is and what is next to you "
                  "(ice is safe, a hole ends the game, edge is the end of the map).\n")
        return (
            "You are playing FrozenLake. Walk the player to the goal across the frozen lake without "
            "stepping into a hole.\n"
            f"{legend}"
            "Moves: up, down, left, right (up is toward the first row). A move off the edge of the map "
            f"leaves you in place.{slip}\n{moves_instruction(self.moves_per_turn)}"
        )

    # ----------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> LakeMap:
        if self.maps is not None:
            pool = [m for m in self.maps if m.split == split and self._accepts(m)]
            if not pool:
                kept = " that local_move solves (local_solvable=True)" if self.local_solvable else ""
                raise ValueError(f"none of the {len(self.maps)} given maps{kept} is in the {split!r} split "
                                 f"(a map is test when crc32(map text) % {TEST_BUCKETS} == 0)")
            return pool[int(rng.integers(len(pool)))]
        for _ in range(MAX_DRAWS):
            lake = generate_map(rng, self.size, self.hole_prob, self.min_path)
            if lake is not None and lake.split == split and self._accepts(lake):
                return lake
        raise RuntimeError(f"no {split!r} map found in {MAX_DRAWS} draws (size={self.size}, "
                           f"hole_prob={self.hole_prob}, local_solvable={self.local_solvable}); lower hole_prob")

    def _accepts(self, lake: LakeMap) -> bool:
        """Whether a map passes ``local_solvable`` (every map does when it is off)."""
        return not self.local_solvable or local_solves(lake, self.max_turns)

    def _task_id(self, task: LakeMap) -> str:
        return f"frozen_lake-{task.text}"

    def _start_episode(self, task: LakeMap) -> list[Message]:
        self._pos, self._slippery_plan = task.start, None
        return [
            {"role": "system", "content": self.system_prompt()},
            {"role": "user", "content": f"{self._observe()}\n{moves_instruction(self.moves_per_turn)}"},
        ]

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        moves = parse_moves(action, self.moves_per_turn)
        if not moves.moves:
            return TurnOutcome(messages=(_user(f"No move found. {moves_instruction(self.moves_per_turn)}"),))
        lake: LakeMap = self._task
        lines = []
        for move in moves.moves:
            actual = self._slip(move)
            nxt = step_pos(lake.size, self._pos, actual)
            name = move if actual == move else f"{move} (slipped {actual})"
            if nxt == self._pos:
                lines.append(f"{name}: blocked by the edge, stayed")
                continue
            self._pos = nxt
            if lake.cell(nxt) == HOLE:
                lines.append(f"{name}: fell into a hole\nYou fell into a hole. Game over.")
                return TurnOutcome(messages=(_user("\n".join(lines)),), terminated=True)
            if lake.cell(nxt) == GOAL:
                lines.append(f"{name}: reached the goal\nYou reached the goal!")
                return TurnOutcome(messages=(_user("\n".join(lines)),), reward=1.0, terminated=True, success=True)
            lines.append(f"{name}: moved")
        if moves.dropped:
            lines.append(f"(only the first {self.moves_per_turn} move(s) were played)")
        lines.append(self._observe())
        return TurnOutcome(messages=(_user("\n".join(lines)),))

    def _observe(self) -> str:
        """The view of the current cell: the map (``view="map"``), the local view or the toward view."""
        lake: LakeMap = self._task
        if self.view == "map":
            return f"Map:\n{lake.render(self._pos)}"
        view = lake.render_local(self._pos) if self.view == "local" else lake.render_toward(self._pos)
        return f"{view} {lake.safe_toward(self._pos)}" if self.show_safe else view

    def _state_key(self) -> Pos:
        return self._pos

    def _slip(self, move: str) -> str:
        """The move actually made: ``move``, or on slippery ice one of its sides (p=1/3 each)."""
        if not self.is_slippery:
            return move
        k = int(self.np_random.integers(3))
        return move if k == 0 else PERPENDICULAR[move][k - 1]

    # --------------------------------------------------------------- players
    def expert_action(self) -> str:
        """On firm ice, the first ``moves_per_turn`` moves of a BFS shortest path from the
        player's cell. On slippery ice, one move per turn (seeing where each move lands): the
        move that maximises the chance to reach the goal in the turns left (``slippery_plan``)."""
        self._require_active("expert_action()")
        if self.is_slippery:
            if self._slippery_plan is None:
                self._slippery_plan = slippery_plan(self._task, self.max_turns)
            return self._slippery_plan[self.max_turns - self._turn][self._pos][1]
        path = shortest_path(self._task, self._pos) or MOVES[:1]
        return ", ".join(path[: self.moves_per_turn])

    def local_action(self) -> str:
        """The memoryless player of the local view (``local_move``); one move per call."""
        self._require_active("local_action()")
        return local_move(self._task, self._pos)

    def toward_action(self) -> str:
        """One move straight toward the goal along the larger offset, whatever lies there (the
        local player without its look at the cell it steps onto)."""
        self._require_active("toward_action()")
        (gr, gc), (r, c) = self._task.goal, self._pos
        if abs(gr - r) >= abs(gc - c):
            return "down" if gr > r else "up"
        return "right" if gc > c else "left"

    def random_action(self, rng: np.random.Generator) -> str:
        """``moves_per_turn`` uniformly random moves."""
        self._require_active("random_action()")
        return random_moves(rng, self.moves_per_turn)

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """A warm-start player. On the map view: the expert's moves with p=``weak_skill``
        (default ``WEAK_FOLLOW_PROB`` = 0.4), else random ones. On the local and toward views,
        where the expert's moves cannot be read off the observation: ``local_action`` with
        p=``weak_skill`` (default ``LOCAL_WEAK_AROUND_PROB`` = 0.3), else ``toward_action``, so
        its most likely move walks into a hole in the way (a model that imitates it plays that
        greedily) and the one that steps around it is also seen.

        Args:
            rng: The player's own generator (the env's ``np_random`` is not touched).
        """
        self._require_active("weak_expert_action()")
        if self.view != "map":
            return self.local_action() if rng.random() < self.weak_skill else self.toward_action()
        return self.expert_action() if rng.random() < self.weak_skill else self.random_action(rng)


def _user(content: str) -> Message:
    return {"role": "user", "content": content}

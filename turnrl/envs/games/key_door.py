"""KeyDoor: walk a corridor to the key at one end, then back to the door at the other end.

Description:
    A corridor of cells ``0..L``: the key lies at cell 0, the door is cell ``L``. A task is
    ``(L, start)``: ``L`` is ``length``, or drawn from ``[min_length, length]`` when
    ``min_length`` is set, and the start cell is drawn from the middle band
    ``ceil(start_band[0] * L) .. floor(start_band[1] * L)`` (clipped to ``1..L-1``); the player
    starts without the key. The text version of the credit lab's ``key_door`` MDP
    (``turnrl.bench.credit_lab.mdp``): the state is (cell, has key), so a success passes its
    start cells twice (without the key, then with it), the samples of a group meet in the same
    states (GiGPO's anchor states), and one sparse reward at the door pays for ``start + L``
    moves.

Action Space:
    The assistant's text; its first whole word ``left`` or ``right`` (any case) is the move. A
    move toward cell 0 is ``left``. With ``slip > 0`` a move goes the other way with probability
    ``slip``, drawn from the env's ``np_random`` (seeded by ``reset``).

Observation Space:
    System prompt: the rules (``"You are in a corridor of cells 0 to 16. The key lies at cell
    0. The door at cell 16 opens only with the key. ..."``). Every user message ends with the
    state line, the first one too: ``"Cell 9 of 0-16. No key."``, ``"Cell 9 of 0-16. Key
    held."`` once the key is taken (about 10 tokens: an episode of 40 turns is mostly the chat
    template's role lines). Before it, when something happened: ``"Slipped right."`` (the move
    went the other way), ``"Took the key."``, ``"Locked."`` (a move onto the door without the
    key: the player stays), ``"Wall."`` (a move left of cell 0: the player stays). A reply
    without ``left`` or ``right`` gets ``"Reply with left or right."`` and the state line; the
    turn still counts. Opening the door ends the episode with ``"You opened the door!"``.

Rewards:
    1.0 on the turn the door opens (the outcome). With ``progress_reward`` (default 0: off),
    that much on the turn the key is taken, once per episode, so methods that credit each turn
    with its own reward (MT-GRPO) have something to credit.

Episode End:
    Terminated when the door opens (success); truncated after ``max_turns`` turns, by default
    ``2 * length + 2`` (22 for the default ``length=10``, 40 for ``length=19``), so the longest
    task's ``start + L`` moves fit with room to spare.

Splits:
    A task is held out (``test``) when ``crc32(f"{L}:{start}") % 4 == 0``, else ``train``; the
    constructor refuses settings whose task set leaves a split empty. ``task_id =
    f"key_door-{L}-{start}"``. ``state_key`` is ``"cell9"`` without the key, ``"cell9+key"``
    with it (the lab's state names) and ``"open"`` once the door is open.

Scripted players:
    ``expert_action`` goes left until it holds the key, then right: it solves every task in
    ``start + L`` turns (without slips). ``near_end_action`` is a plausible wrong plan: without
    the key, head for the nearer end of the corridor (the key's on a tie), which is the locked
    door from past the middle; with the key, right. ``weak_expert_action`` plays the expert's
    move with p=``weak_skill`` (default 0.3), else ``near_end_action``'s. The two agree on every
    cell but those past the middle without the key, where the weak player goes left with p=0.3
    only: a model that imitates it walks to the locked door from every start past the middle
    when it plays greedily (its held-out success is the share of starts at or before the
    middle), and RL has to flip exactly those states' decisions. With ``weak_random`` (default
    0) the weak player first plays a random move with that probability: noise in every state.
    ``random_action`` is ``left`` or ``right`` with p=1/2.
    Measured with ``python -m turnrl baselines turnrl/KeyDoor-v0 --episodes 200`` (default
    kwargs: ``L`` in 6..10, 22 turns), success (mean turns): test random 0.03 (21.9), weak
    0.69 (16.1), expert 1.00 (12.9); train random 0.01, weak 0.62, expert 1.00. Under
    ``env=key_door_long`` (``L`` in 15..19, 40 turns; seeds 0..1999 of each split, player rng
    ``default_rng(10_000 + seed)``): test random 0.00, weak 0.44 (33.8), ``near_end_action``
    alone 0.27, expert 1.00 (26.4); train weak 0.54, ``near_end_action`` 0.44. The wrong plan
    alone solves 2 of the 8 held-out tasks (0.25 of them).

Version History:
    v0: initial version.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence

import numpy as np

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.tools import ParseResult, ToolResult

__all__ = ["KeyDoorEnv", "is_held_out", "tasks"]

LEFT, RIGHT = "left", "right"
MOVE_WORD = re.compile(r"\b(left|right)\b", re.IGNORECASE)
INVALID_REPLY = "Reply with left or right."
HELD_OUT_BUCKETS = 4  # one hash bucket in four is the test split
WEAK_SKILL = 0.3
"""Default probability that ``weak_expert_action`` plays the expert's move."""
MIN_LENGTH = 2


def is_held_out(length: int, start: int) -> bool:
    """Whether the task ``(length, start)`` belongs to the test split (a stable hash)."""
    return zlib.crc32(f"{length}:{start}".encode()) % HELD_OUT_BUCKETS == 0


def start_cells(length: int, band: tuple[float, float]) -> range:
    """The start cells of a corridor of ``length``: ``ceil(band[0] * L) .. floor(band[1] * L)``
    clipped to ``1..L-1`` (empty when the band holds no whole cell)."""
    low = max(1, math.ceil(band[0] * length - 1e-9))
    high = min(length - 1, math.floor(band[1] * length + 1e-9))
    return range(low, high + 1)


def tasks(lengths: Sequence[int], band: tuple[float, float], split: str) -> tuple[tuple[int, int], ...]:
    """Every ``(L, start)`` task of ``split`` for the corridor lengths ``lengths``."""
    return tuple((n, s) for n in lengths for s in start_cells(n, band) if is_held_out(n, s) == (split == "test"))


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_prob(value) -> bool:
    return isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and 0 <= value <= 1


class KeyDoorEnv(MultiTurnEnv):
    """Take the key at cell 0 of a corridor, then open the door at cell ``L`` (see the module docstring).

    Args:
        length: The corridor's last cell ``L`` (the door), or the longest when ``min_length`` is set.
        min_length: When set, each task draws ``L`` from ``[min_length, length]``.
        start_band: ``(low, high)`` fractions of ``L``: the start cell is drawn from
            ``ceil(low * L) .. floor(high * L)`` (clipped to ``1..L-1``).
        slip: Probability that a move goes the other way.
        progress_reward: Reward on the turn the key is taken (0: a sparse outcome only).
        weak_skill: Probability that ``weak_expert_action`` plays the expert's move rather than
            ``near_end_action``'s (when it plays neither at random).
        weak_random: Probability that ``weak_expert_action`` plays a random move (``random_action``).
        max_turns: Turn limit; None is ``2 * length + 2``.
        tool_parser: Parser name (the env has no tools; calls get "unknown tool").

    Raises:
        ValueError: On a bad kwarg, or when the tasks leave a split empty (widen the lengths or
            the band).
    """

    def __init__(self, length: int = 10, min_length: int | None = 6, *,
                 start_band: Sequence[float] = (0.4, 0.7), slip: float = 0.0, progress_reward: float = 0.0,
                 weak_skill: float = WEAK_SKILL, weak_random: float = 0.0, max_turns: int | None = None,
                 tool_parser: str = "hermes") -> None:
        if not _is_int(length) or length < MIN_LENGTH:
            raise ValueError(f"length must be an int >= {MIN_LENGTH}, got {length!r}")
        if min_length is not None and not (_is_int(min_length) and MIN_LENGTH <= min_length <= length):
            raise ValueError(f"min_length must be None or an int in [{MIN_LENGTH}, length={length}], got {min_length!r}")
        if (isinstance(start_band, str) or not isinstance(start_band, Sequence) or len(start_band) != 2
                or not all(_is_prob(f) for f in start_band) or start_band[0] > start_band[1]):
            raise ValueError(f"start_band must be two fractions 0 <= low <= high <= 1, got {start_band!r}")
        for name, value in (("slip", slip), ("weak_skill", weak_skill), ("weak_random", weak_random)):
            if not _is_prob(value):
                raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
        if not isinstance(progress_reward, (int, float)) or isinstance(progress_reward, bool) \
                or not 0 <= progress_reward < 1:
            raise ValueError(f"progress_reward must be a number in [0, 1), got {progress_reward!r}")
        self.length = int(length)
        self.min_length = None if min_length is None else int(min_length)
        self.start_band = (float(start_band[0]), float(start_band[1]))
        self.slip, self.progress_reward = float(slip), float(progress_reward)
        self.weak_skill, self.weak_random = float(weak_skill), float(weak_random)
        lengths = range(self.length if self.min_length is None else self.min_length, self.length + 1)
        self._tasks = {split: tasks(lengths, self.start_band, split) for split in ("train", "test")}
        empty = [split for split, found in self._tasks.items() if not found]
        if empty:
            raise ValueError(f"KeyDoor(length={length}, min_length={min_length}, start_band={start_band}) has no "
                             f"{' or '.join(repr(s) for s in empty)} task (a task is test when crc32(f'{{L}}:{{start}}') "
                             f"% {HELD_OUT_BUCKETS} == 0): widen the lengths (min_length) or the start band")
        super().__init__(tool_parser=tool_parser, max_turns=2 * self.length + 2 if max_turns is None else max_turns)
        self._cell, self._has_key, self._open = 0, False, False

    def split_tasks(self, split: str) -> tuple[tuple[int, int], ...]:
        """All ``(L, start)`` tasks of a split."""
        return self._tasks[split]

    @property
    def cell(self) -> int:
        """The player's cell."""
        return self._cell

    @property
    def has_key(self) -> bool:
        """Whether the player holds the key."""
        return self._has_key

    def system_prompt(self) -> str:
        """The rules, for the current task's corridor."""
        door = self._task[0]
        return (f"You are in a corridor of cells 0 to {door}. The key lies at cell 0. The door at cell {door} "
                "opens only with the key. Take the key, then open the door. Each turn, reply with one move: "
                "left (toward cell 0) or right.")

    def state_line(self) -> str:
        """What the player sees every turn: ``"Cell 9 of 0-16. No key."`` or ``"Cell 9 of 0-16. Key held."``"""
        return f"Cell {self._cell} of 0-{self._task[0]}. {'Key held.' if self._has_key else 'No key.'}"

    # ----------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> tuple[int, int]:
        pool = self._tasks[split]
        return pool[int(rng.integers(len(pool)))]

    def _task_id(self, task: tuple[int, int]) -> str:
        return f"key_door-{task[0]}-{task[1]}"

    def _start_episode(self, task: tuple[int, int]) -> list[Message]:
        self._cell, self._has_key, self._open = task[1], False, False
        return [{"role": "system", "content": self.system_prompt()}, _user(self.state_line())]

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        match = MOVE_WORD.search(action)
        if match is None:
            return TurnOutcome(messages=(_user(f"{INVALID_REPLY} {self.state_line()}"),))
        move = match.group(1).lower()
        events = []
        if self.slip and self.np_random.random() < self.slip:
            move = RIGHT if move == LEFT else LEFT
            events.append(f"Slipped {move}.")
        door, reward = self._task[0], 0.0
        target = self._cell + (1 if move == RIGHT else -1)
        if target < 0:
            events.append("Wall.")
        elif target == door and not self._has_key:
            events.append("Locked.")
        elif target == door:
            self._cell, self._open = target, True
            events.append("You opened the door!")
            return TurnOutcome(messages=(_user(" ".join(events)),), reward=1.0, terminated=True, success=True)
        else:
            self._cell = target
            if target == 0 and not self._has_key:
                self._has_key, reward = True, self.progress_reward
                events.append("Took the key.")
        return TurnOutcome(messages=(_user(" ".join([*events, self.state_line()])),), reward=reward)

    def _state_key(self) -> str:
        if self._open:
            return "open"
        return f"cell{self._cell}{'+key' if self._has_key else ''}"

    # --------------------------------------------------------------- players
    def expert_action(self) -> str:
        """Left until the key is held, then right."""
        self._require_active("expert_action()")
        return RIGHT if self._has_key else LEFT

    def near_end_action(self) -> str:
        """The weak player's wrong plan: without the key, toward the nearer end of the corridor
        (left on a tie), so the locked door from past the middle; with the key, right."""
        self._require_active("near_end_action()")
        return RIGHT if self._has_key or 2 * self._cell > self._task[0] else LEFT

    def random_action(self, rng: np.random.Generator) -> str:
        """``left`` or ``right`` with p=1/2."""
        self._require_active("random_action()")
        return LEFT if rng.random() < 0.5 else RIGHT

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """The warm-start player: a random move with p=``weak_random``; else the expert's move with
        p=``weak_skill``, else ``near_end_action``'s.

        Args:
            rng: The player's own generator (the env's ``np_random`` is not touched).
        """
        self._require_active("weak_expert_action()")
        if self.weak_random and rng.random() < self.weak_random:
            return self.random_action(rng)
        return self.expert_action() if rng.random() < self.weak_skill else self.near_end_action()


def _user(content: str) -> Message:
    return {"role": "user", "content": content}

"""GuessNumber: find a secret integer from higher/lower hints (no tools).

Description:
    A task is an upper bound ``n`` (fixed, or drawn from ``[n_min, n]``) and a secret in
    ``[1, n]``. System prompt ``"You are playing a guessing game."``; user prompt
    ``"Guess my number between 1 and {n}. Reply with a number."``.

Action Space:
    The assistant's text; its first integer is the guess.

Observation Space:
    One user message per turn:

    * ``"higher, between {lo} and {hi}"`` if the secret is larger, ``"lower, between {lo}
      and {hi}"`` if smaller, where ``[lo, hi]`` is the interval still feasible after all
      hints so far (the game keeps score, so an interval-to-guess rule solves it); with
      ``show_middle=True`` followed by ``", middle {mid}"``, the interval's midpoint
      ``(lo + hi) // 2`` (the first prompt too: ``"between 1 and {n}, middle {mid}."``), so
      binary search is a number copied from the hint instead of one computed;
    * ``"correct"`` when guessed;
    * ``"Reply with one number between 1 and {n}."`` when no integer is found or it is
      out of range (the turn still counts).

Rewards:
    1.0 on the turn that names the secret (the outcome), 0.0 otherwise.

Episode End:
    Terminated when the secret is named; truncated after ``max_turns`` turns (default 6,
    enough for binary search up to n = 63).

Splits:
    A task ``(n, secret)`` is held out (``test``) when ``crc32(f"{n}:{secret}") % 4 == 0``;
    ``train`` holds the rest. With a range of upper bounds (``n_min``), a policy cannot
    dodge the held-out secrets without knowing this table; with one fixed ``n`` it can
    learn never to guess them (they are never rewarded in training), so held-out
    evaluation should use a range. ``task_id = f"guess-{n}-{secret}"``; ``state_key`` is
    the feasible interval ``(lo, hi)``.

Scripted players:
    ``expert_action`` is binary search (solves every task within 6 turns for n <= 63);
    ``weak_expert_action`` is mostly a linear scan upward with the expert's bisection move
    at p = 0.3. Measured weak success (n_min=16, n=32, 2000 seeds): train 0.48, test 0.49;
    the upward scan alone solves only secrets <= 6.

Version History:
    v0: initial version.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.envs.extract import first_int
from turnrl.tools import ParseResult, ToolResult

SYSTEM_PROMPT = "You are playing a guessing game."
HIGHER, LOWER, CORRECT = "higher", "lower", "correct"
HINT = "{direction}, between {lo} and {hi}"
WEAK_BISECT_PROB = 0.3
HELD_OUT_BUCKETS = 4  # one hash bucket in four is the test split


def is_held_out(n: int, secret: int) -> bool:
    """Whether the task ``(n, secret)`` belongs to the test split (a stable hash)."""
    return zlib.crc32(f"{n}:{secret}".encode()) % HELD_OUT_BUCKETS == 0


@functools.lru_cache(maxsize=64)
def _split(lowest_upper: int, n: int, is_test: bool) -> tuple[tuple[int, int], ...]:
    """The ``(upper, secret)`` tasks of one split, uppers ``lowest_upper..n``: computed once per
    range (an episode's reset reads it; hashing every task of ``n=1000`` took ~1 ms each time)."""
    return tuple((u, s) for u in range(lowest_upper, n + 1) for s in range(1, u + 1) if is_held_out(u, s) == is_test)


class GuessNumberEnv(MultiTurnEnv):
    """Guess a secret in ``[1, n]`` from higher/lower hints that state the feasible interval.

    Args:
        n: Largest upper bound of the secret's range.
        n_min: When set, each task draws its upper bound from ``[n_min, n]``; else it is ``n``.
        max_turns: Turn limit (default 6).
        show_middle: Whether each hint (and the first prompt) also states the feasible
            interval's midpoint, the expert's next guess. It takes the arithmetic out of the
            game and leaves the strategy: a tiny model copies a number from its context in a
            few steps, but has to learn which one to copy (the scan's ``lo`` or the middle)
            from the outcome reward alone.
        tool_parser: Parser name (the env has no tools; calls get "unknown tool").
    """

    default_max_turns = 6

    def __init__(self, n: int = 32, n_min: int | None = None, *, max_turns: int | None = None,
                 show_middle: bool = False, tool_parser: str = "hermes") -> None:
        if not isinstance(n, (int, np.integer)) or n < 4:
            raise ValueError(f"n must be an int >= 4, got {n!r}")
        if n_min is not None and not (isinstance(n_min, (int, np.integer)) and 2 <= n_min <= n):
            raise ValueError(f"n_min must be an int in [2, n={n}] or None, got {n_min!r}")
        self.n = int(n)
        self.n_min = int(n_min) if n_min is not None else None
        if not isinstance(show_middle, bool):
            raise TypeError(f"show_middle must be a bool, got {type(show_middle).__name__}")
        self.show_middle = show_middle
        super().__init__(tool_parser=tool_parser, max_turns=max_turns)
        self._upper, self._lo, self._hi = self.n, 1, self.n

    def split_tasks(self, split: str) -> tuple[tuple[int, int], ...]:
        """All ``(n, secret)`` tasks of a split."""
        return _split(self.n_min if self.n_min is not None else self.n, self.n, split == "test")

    @property
    def invalid_reply(self) -> str:
        """The message sent when the turn holds no in-range integer."""
        return f"Reply with one number between 1 and {self._upper}."

    # ----------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> tuple[int, int]:
        tasks = self.split_tasks(split)
        if not tasks:
            raise ValueError(f"the {split!r} split of GuessNumber(n={self.n}, n_min={self.n_min}) is empty")
        return tasks[int(rng.integers(len(tasks)))]

    def _task_id(self, task: tuple[int, int]) -> str:
        return f"guess-{task[0]}-{task[1]}"

    def _start_episode(self, task: tuple[int, int]) -> list[Message]:
        self._upper = task[0]
        self._lo, self._hi = 1, self._upper
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Guess my number between 1 and {self._upper}{self._middle()}. "
                                        "Reply with a number."},
        ]

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        guess, secret = first_int(action), self._task[1]
        if guess is None or not 1 <= guess <= self._upper:
            return TurnOutcome(messages=(_user(self.invalid_reply),))
        if guess == secret:
            self._lo = self._hi = secret
            return TurnOutcome(messages=(_user(CORRECT),), reward=1.0, terminated=True, success=True)
        if guess < secret:
            self._lo = max(self._lo, guess + 1)
            direction = HIGHER
        else:
            self._hi = min(self._hi, guess - 1)
            direction = LOWER
        hint = HINT.format(direction=direction, lo=self._lo, hi=self._hi) + self._middle()
        return TurnOutcome(messages=(_user(hint),))

    def _middle(self) -> str:
        """``", middle {mid}"`` of the feasible interval with ``show_middle``, else ``""``."""
        return f", middle {(self._lo + self._hi) // 2}" if self.show_middle else ""

    def _state_key(self) -> tuple[int, int]:
        return (self._lo, self._hi)

    # --------------------------------------------------------------- players
    def expert_action(self) -> str:
        """Binary search: the midpoint ``(lo + hi) // 2`` of the feasible interval."""
        self._require_active("expert_action()")
        return str((self._lo + self._hi) // 2)

    def random_action(self, rng: np.random.Generator) -> str:
        """A uniformly random guess in ``[1, n]`` of the task (ignores the hints)."""
        self._require_active("random_action()")
        return str(int(rng.integers(1, self._upper + 1)))

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """A weak player for warm starts: the lowest feasible value (a linear scan), or with
        p=0.3 the expert's bisection move. Imitating it gives a policy whose greedy choice is
        the scan while the better move is in its support: RL has to find out which wins.

        Args:
            rng: The player's own generator (the env's ``np_random`` is not touched).
        """
        self._require_active("weak_expert_action()")
        if rng.random() < WEAK_BISECT_PROB:
            return self.expert_action()
        return str(self._lo)


def _user(content: str) -> Message:
    return {"role": "user", "content": content}

"""GuessNumber: find a secret integer from "higher"/"lower" hints (no tools).

Prompt: system ``"You are playing a guessing game."``; user ``"Guess my number
between 1 and {n}. Reply with a number."``. Each turn the first integer in the
assistant text is the guess; the env replies with a user message:

* ``"higher"`` if the secret is larger, ``"lower"`` if smaller;
* ``"correct"`` when guessed: reward 1.0, terminated, success (the only
  non-zero reward);
* ``"Reply with one number between 1 and {n}."`` when no integer is found or it
  is out of range (the turn still counts).

Splits: test = secrets with ``secret % 4 == 0``; train = the others.
``task_id = f"guess-{secret}"``. ``state_key`` = the feasible interval
``(lo, hi)`` implied by the hints so far.

Scripted players: ``expert_action`` (binary search; solves every secret for
n=32 within 6 turns) and ``weak_expert_action`` (mostly a linear scan upward,
sometimes the expert's bisection). Measured weak success with n=32,
max_turns=6 (reset seeds 0..1999, player rng ``default_rng(10_000 + seed)``):
train 0.42, test 0.25 (the upward scan alone only solves secrets <= 6).
"""

from __future__ import annotations

import numpy as np

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.envs.extract import first_int
from turnrl.tools import ParseResult, ToolResult

SYSTEM_PROMPT = "You are playing a guessing game."
HIGHER, LOWER, CORRECT = "higher", "lower", "correct"
WEAK_BISECT_PROB = 0.3


class GuessNumberEnv(MultiTurnEnv):
    """Guess a secret in ``[1, n]`` from higher/lower hints.

    Args:
        n: Upper bound of the secret (at least 4, so both splits are non-empty).
        max_turns: Turn limit (default 6, enough for binary search up to n=63).
        tool_parser: Parser name (the env has no tools; calls get "unknown tool").
    """

    default_max_turns = 6

    def __init__(self, n: int = 32, *, max_turns: int | None = None, tool_parser: str = "hermes") -> None:
        if not isinstance(n, (int, np.integer)) or n < 4:
            raise ValueError(f"n must be an int >= 4 (test split is the multiples of 4), got {n!r}")
        self.n = int(n)
        super().__init__(tool_parser=tool_parser, max_turns=max_turns)
        self._lo, self._hi = 1, self.n

    def split_secrets(self, split: str) -> tuple[int, ...]:
        """All secrets of a split: test = multiples of 4, train = the rest."""
        is_test = split == "test"
        return tuple(s for s in range(1, self.n + 1) if (s % 4 == 0) == is_test)

    @property
    def invalid_reply(self) -> str:
        """The message sent when the turn holds no in-range integer."""
        return f"Reply with one number between 1 and {self.n}."

    # ----------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> int:
        secrets = self.split_secrets(split)
        return secrets[int(rng.integers(len(secrets)))]

    def _task_id(self, task: int) -> str:
        return f"guess-{task}"

    def _start_episode(self, task: int) -> list[Message]:
        self._lo, self._hi = 1, self.n
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Guess my number between 1 and {self.n}. Reply with a number."},
        ]

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        guess, secret = first_int(action), self._task
        if guess is None or not 1 <= guess <= self.n:
            return TurnOutcome(messages=(_user(self.invalid_reply),))
        if guess == secret:
            self._lo = self._hi = secret
            return TurnOutcome(messages=(_user(CORRECT),), reward=1.0, terminated=True, success=True)
        if guess < secret:
            self._lo = max(self._lo, guess + 1)
            return TurnOutcome(messages=(_user(HIGHER),))
        self._hi = min(self._hi, guess - 1)
        return TurnOutcome(messages=(_user(LOWER),))

    def _state_key(self) -> tuple[int, int]:
        return (self._lo, self._hi)

    # --------------------------------------------------------------- players
    def expert_action(self) -> str:
        """Binary search: the midpoint ``(lo + hi) // 2`` of the feasible interval."""
        self._require_active("expert_action()")
        return str((self._lo + self._hi) // 2)

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """A weak player for warm starts: the lowest feasible value (a linear scan), or with
        p=0.3 the expert's bisection move. Imitating it gives a policy whose greedy choice is
        the scan, while the better move is in its support: RL has to find out which wins.

        Args:
            rng: The player's own generator (the env's ``np_random`` is not touched).
        """
        self._require_active("weak_expert_action()")
        if rng.random() < WEAK_BISECT_PROB:
            return self.expert_action()
        return str(self._lo)


def _user(content: str) -> Message:
    return {"role": "user", "content": content}

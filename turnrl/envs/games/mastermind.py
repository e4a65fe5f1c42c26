"""Mastermind: find a secret code of coloured pegs from black/white peg counts (no tools).

Description:
    A task is a secret code of ``code_length`` pegs (default 4), each one of ``num_colors``
    colours (default 6), with repeated colours allowed unless ``allow_repeats=False``. Colours
    are the digits ``1``-``9`` when ``num_colors <= 9``, else the capital letters ``A``-``Z``.
    System prompt ``"You are playing Mastermind."``; the user prompt states the code's size,
    the colours, the feedback rule and the reply format (``"Reply with 4 colours, e.g. 1 2 3 4."``).

Action Space:
    The assistant's text; the guess is its last group of exactly ``code_length`` colour
    symbols, written together or apart with spaces, commas, dashes, slashes or bars between
    them: ``"1352"``, ``"1 3 5 2"``, ``"[1, 3, 5, 2]"`` and ``"Guess 3: 1-3-5-2"`` all guess
    1 3 5 2. A group is a run of digits (of capital letters for letter colours) not touching
    other letters or digits.

Observation Space:
    One user message per turn:

    * for a valid guess, ``"1 3 5 2 -> 1 black, 2 white (7 guesses left)"`` followed by
      ``"History:"`` and one line per valid guess so far (``"1. 1 1 2 2 -> 0 black, 1 white"``):
      black pegs count right colour in the right place, white pegs right colour in the wrong
      place (each secret peg is matched at most once);
    * ``"... -> 4 black, 0 white. Solved in {k} guesses."`` when the code is found, and
      ``"Out of guesses; the code was ..."`` after the last turn's line;
    * when no group of the right size is found, or it holds an unknown colour, or repeats a
      colour in a game without repeats: a message naming the problem and the reply format,
      e.g. ``"'7' is not a colour; the colours are 1-6. Reply with 4 colours, e.g. 1 2 3 4."``.
      Such a turn still counts (like a wasted guess) and is not added to the history.

Rewards:
    1.0 on the turn that names the code (the outcome), 0.0 otherwise.

Episode End:
    Terminated when the code is guessed; truncated after ``max_turns`` turns (default 10).

Splits:
    A code is held out (``test``) when ``crc32(code) % 4 == 0`` over its symbols written
    together (e.g. ``"1352"``); ``train`` holds the rest (4x6 with repeats: 972 train, 324 test
    of the 1296 codes). ``task_id = f"mastermind-{code_length}x{num_colors}-{code}"`` (``u``
    after the size when colours are unique). ``state_key`` is the set of distinct ``(guess,
    black, white)`` feedback triples so far as a sorted tuple: equal feedback, equal key,
    whatever the order it came in (invalid replies leave it unchanged). Two different feedback
    sets that happen to leave the same consistent codes get different keys (the conservative
    choice: a key never merges states a player could tell apart).

Scripted players:
    ``expert_action`` keeps the codes consistent with all feedback so far and plays the one whose
    worst-case feedback leaves the fewest consistent codes (Knuth's minimax restricted to
    consistent guesses; ties to the first in the order 1111, 1112, ...); with more than
    ``MINIMAX_LIMIT`` consistent codes it plays the first of them. Verified on every code
    (tests/envs/test_mastermind.py): 4x6 within 6 guesses (mean 4.50), 4x6 without repeats
    within 6 (mean 4.08), 3x4 within 5 (3.31), 3x4 without repeats within 4 (3.00). Larger games
    need a larger ``max_turns``: on 1000 sampled codes 4x8 took up to 9 guesses and 5x8 up to 10.
    ``random_action`` is a uniform random allowed code. ``weak_expert_action`` is a forgetful
    guesser: a uniform random code consistent with the latest feedback only, or with p = 0.07
    one consistent with all feedback (imitating it gives a policy that reads the last line; RL
    has to find out that the whole history pays). ``python -m turnrl baselines
    turnrl/Mastermind-v0 --episodes 200``, success (mean turns): test split random 0.01 (10.0),
    weak 0.47 (8.5), expert 1.00 (4.5); train split random 0.01, weak 0.54, expert 1.00
    (2000 test episodes: weak 0.50). The weak rate is tuned for 4x6 in 10 turns; smaller games
    want fewer turns to keep headroom: 3x4 with ``max_turns=5`` gives weak 0.57 (400 test
    episodes), with the default 10 about 0.89.

Version History:
    v0: initial version.
"""

from __future__ import annotations

import functools
import itertools
import re
import string
import zlib
from dataclasses import dataclass

import numpy as np

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.tools import ParseResult, ToolResult

__all__ = ["CodeSpace", "MastermindEnv", "pegs", "is_held_out"]

SYSTEM_PROMPT = "You are playing Mastermind."
DIGIT_COLORS = "123456789"
LETTER_COLORS = string.ascii_uppercase
MAX_CODE_LENGTH = 8
MAX_CODES = 1_000_000
"""Largest code space an env may have (the consistent set is kept as an index array)."""
HELD_OUT_BUCKETS = 4  # one hash bucket in four is the test split
WEAK_RECALL_PROB = 0.07
"""Probability that ``weak_expert_action`` heeds all feedback, not just the latest."""
SEPARATORS = r"[ ,;/|\-]*"
MINIMAX_LIMIT = 1500
"""The expert plays minimax while at most this many codes are consistent (cost grows as its square)."""
MAX_SHOWN = 20
"""A reply's group longer than this is cut when quoted back."""
CACHED_POSITIONS = 2048
"""Consistent sets whose minimax guess is remembered."""


def is_held_out(code: str) -> bool:
    """Whether the code (its symbols written together, e.g. ``"1352"``) is in the test split."""
    return zlib.crc32(code.encode()) % HELD_OUT_BUCKETS == 0


def pegs(guess: tuple[int, ...], secret: tuple[int, ...]) -> tuple[int, int]:
    """``(black, white)`` of ``guess`` against ``secret`` (colour indices).

    Black: right colour in the right place. White: right colour in the wrong place, each
    secret peg matched at most once (the colours both codes share, counted with
    multiplicity, less the blacks).

    Raises:
        ValueError: If the codes differ in length.
    """
    if len(guess) != len(secret):
        raise ValueError(f"guess and secret must have the same length, got {guess!r} and {secret!r}")
    black = sum(g == s for g, s in zip(guess, secret))
    shared = sum(min(guess.count(c), secret.count(c)) for c in set(guess))
    return black, shared - black


@dataclass(frozen=True, eq=False)
class CodeSpace:
    """All codes of one game size, in lexicographic order, with vectorised feedback.

    Attributes:
        code_length: Pegs per code.
        num_colors: Colours per peg.
        allow_repeats: Whether a code may repeat a colour.
        codes: ``(n, code_length)`` int8 colour indices, lexicographic order.
        counts: ``(n, num_colors)`` int8 count of each colour per code.
    """

    code_length: int
    num_colors: int
    allow_repeats: bool
    codes: np.ndarray
    counts: np.ndarray

    @property
    def symbols(self) -> str:
        """The colour symbols, colour index ``i`` is ``symbols[i]``."""
        return (DIGIT_COLORS if self.num_colors <= len(DIGIT_COLORS) else LETTER_COLORS)[: self.num_colors]

    def text(self, code: tuple[int, ...] | np.ndarray, sep: str = " ") -> str:
        """A code written with its symbols, e.g. ``"1 3 5 2"`` (or ``"1352"`` with ``sep=""``)."""
        return sep.join(self.symbols[int(c)] for c in code)

    def feedback_keys(self, guess: tuple[int, ...], rows: np.ndarray) -> np.ndarray:
        """``black * (code_length + 1) + white`` of ``guess`` against the codes at ``rows``."""
        codes = self.codes[rows]
        black = (codes == np.asarray(guess, dtype=np.int8)).sum(axis=1)
        guess_counts = np.bincount(np.asarray(guess), minlength=self.num_colors)
        shared = np.minimum(self.counts[rows], guess_counts).sum(axis=1)
        return black * (self.code_length + 1) + (shared - black)

    def key(self, black: int, white: int) -> int:
        """The ``feedback_keys`` value of ``(black, white)``."""
        return black * (self.code_length + 1) + white

    def best_guess(self, rows: np.ndarray) -> int:
        """The expert's guess (a row index) when the codes at ``rows`` (ascending) are consistent.

        With at most ``MINIMAX_LIMIT`` consistent codes: the consistent code whose worst-case
        feedback leaves the fewest consistent codes (Knuth's minimax restricted to consistent
        guesses), ties to the lexicographically first; with more, the first consistent code.
        """
        if len(rows) <= 2 or len(rows) > MINIMAX_LIMIT:
            return int(rows[0])
        return _minimax_row(self.code_length, self.num_colors, self.allow_repeats,
                            np.asarray(rows, dtype=np.int32).tobytes())


@functools.lru_cache(maxsize=16)
def code_space(code_length: int, num_colors: int, allow_repeats: bool) -> CodeSpace:
    """The (cached) ``CodeSpace`` of one game size."""
    rows = itertools.product(range(num_colors), repeat=code_length)
    if not allow_repeats:
        rows = (r for r in rows if len(set(r)) == code_length)
    codes = np.array(list(rows), dtype=np.int8).reshape(-1, code_length)
    counts = np.stack([(codes == c).sum(axis=1) for c in range(num_colors)], axis=1).astype(np.int8)
    return CodeSpace(code_length, num_colors, allow_repeats, codes, counts)


class MastermindEnv(MultiTurnEnv):
    """Guess a secret code of coloured pegs from black/white peg counts.

    Args:
        code_length: Pegs per code (1 to ``MAX_CODE_LENGTH``).
        num_colors: Colours per peg (2 to 26; digits up to 9, letters above).
        allow_repeats: Whether codes (the secret and guesses) may repeat a colour.
        max_turns: Turn limit (default 10, enough for the expert on 4x6).
        tool_parser: Parser name (the env has no tools; calls get "unknown tool").
    """

    default_max_turns = 10

    def __init__(self, code_length: int = 4, num_colors: int = 6, allow_repeats: bool = True, *,
                 max_turns: int | None = None, tool_parser: str = "hermes") -> None:
        if not _is_int(code_length) or not 1 <= code_length <= MAX_CODE_LENGTH:
            raise ValueError(f"code_length must be an int in [1, {MAX_CODE_LENGTH}], got {code_length!r}")
        if not _is_int(num_colors) or not 2 <= num_colors <= len(LETTER_COLORS):
            raise ValueError(f"num_colors must be an int in [2, {len(LETTER_COLORS)}], got {num_colors!r}")
        if not isinstance(allow_repeats, (bool, np.bool_)):
            raise TypeError(f"allow_repeats must be a bool, got {allow_repeats!r}")
        if not allow_repeats and num_colors < code_length:
            raise ValueError(f"without repeats num_colors ({num_colors}) must be at least code_length "
                             f"({code_length}); raise num_colors or set allow_repeats=True")
        if num_colors**code_length > MAX_CODES:
            raise ValueError(f"{num_colors}**{code_length} codes exceed MAX_CODES={MAX_CODES}; "
                             "use fewer colours or a shorter code")
        super().__init__(tool_parser=tool_parser, max_turns=max_turns)
        self.code_length, self.num_colors = int(code_length), int(num_colors)
        self.allow_repeats = bool(allow_repeats)
        self.space = code_space(self.code_length, self.num_colors, self.allow_repeats)
        self._splits = _split_rows(self.code_length, self.num_colors, self.allow_repeats)
        symbols = self.space.symbols
        self._group = re.compile(
            rf"(?<![0-9A-Za-z])[{_symbol_class(symbols)}](?:{SEPARATORS}[{_symbol_class(symbols)}])*(?![0-9A-Za-z])"
        )
        self._reply_format = (f"Reply with {self.code_length} colours, e.g. "
                              f"{' '.join((symbols * self.code_length)[: self.code_length])}.")
        self._consistent = np.arange(0)
        self._history: list[tuple[tuple[int, ...], int, int]] = []

    @property
    def colors_text(self) -> str:
        """The colours as the prompt names them, e.g. ``"1-6"``."""
        return f"{self.space.symbols[0]}-{self.space.symbols[-1]}"

    def split_tasks(self, split: str) -> tuple[str, ...]:
        """All secret codes of a split, written together (``"1352"``)."""
        return tuple(self.space.text(self.space.codes[r], sep="") for r in self._splits[split])

    # ----------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> tuple[int, ...]:
        rows = self._splits[split]
        if len(rows) == 0:
            raise ValueError(f"the {split!r} split of Mastermind({self.code_length}x{self.num_colors}) is empty")
        return tuple(int(c) for c in self.space.codes[rows[int(rng.integers(len(rows)))]])

    def _task_id(self, task: tuple[int, ...]) -> str:
        unique = "" if self.allow_repeats else "u"
        return f"mastermind-{self.code_length}x{self.num_colors}{unique}-{self.space.text(task, sep='')}"

    def _start_episode(self, task: tuple[int, ...]) -> list[Message]:
        self._consistent = np.arange(len(self.space.codes))
        self._history = []
        repeats = "colours may repeat" if self.allow_repeats else "no colour repeats"
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": (
                f"I picked a secret code of {self.code_length} pegs, each one of {self.num_colors} colours "
                f"{self.colors_text} ({repeats}). Guess it in {self.max_turns} tries. After each guess I tell "
                "you how many pegs are black (right colour, right place) and white (right colour, wrong "
                f"place). {self._reply_format}"
            )},
        ]

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        guess = self._read_guess(action)
        if isinstance(guess, str):
            return TurnOutcome(messages=(_user(f"{guess} {self._reply_format}"),))
        black, white = pegs(guess, self._task)
        if (guess, black, white) not in self._history:
            self._history.append((guess, black, white))
        rows = self._consistent
        self._consistent = rows[self.space.feedback_keys(guess, rows) == self.space.key(black, white)]
        line, used = f"{self.space.text(guess)} -> {black} black, {white} white", self._turn + 1
        if black == self.code_length:
            return TurnOutcome(messages=(_user(f"{line}. Solved in {used} guess{'es' if used > 1 else ''}."),),
                               reward=1.0, terminated=True, success=True)
        left = self.max_turns - used
        status = (f"Out of guesses; the code was {self.space.text(self._task)}." if left == 0
                  else f"({left} guess{'es' if left > 1 else ''} left)")
        history = "\n".join(f"{i}. {self.space.text(g)} -> {b} black, {w} white"
                            for i, (g, b, w) in enumerate(self._history, 1))
        return TurnOutcome(messages=(_user(f"{line} {status}\nHistory:\n{history}"),))

    def _state_key(self) -> tuple[tuple[str, int, int], ...]:
        return tuple(sorted((self.space.text(g, sep=""), b, w) for g, b, w in self._history))

    def _read_guess(self, action: str) -> tuple[int, ...] | str:
        """The guess in ``action`` as colour indices, or the message saying what is wrong."""
        groups = [re.sub(SEPARATORS, "", m.group(0)) for m in self._group.finditer(action)]
        fitting = [g for g in groups if len(g) == self.code_length]
        if not groups:
            return "I found no guess in your reply."
        if not fitting:
            last = groups[-1]
            shown = last if len(last) <= MAX_SHOWN else last[:MAX_SHOWN] + "..."
            return f"'{shown}' has {len(last)} colour{'s' if len(last) != 1 else ''}; the code has {self.code_length}."
        text = fitting[-1]
        symbols = self.space.symbols
        unknown = next((c for c in text if c not in symbols), None)
        if unknown is not None:
            return f"'{unknown}' is not a colour; the colours are {self.colors_text}."
        guess = tuple(symbols.index(c) for c in text)
        if not self.allow_repeats and len(set(guess)) < len(guess):
            return f"'{' '.join(text)}' repeats a colour; the code has no repeated colours."
        return guess

    # --------------------------------------------------------------- players
    def expert_action(self) -> str:
        """Minimax over the codes consistent with all feedback so far (``CodeSpace.best_guess``)."""
        self._require_active("expert_action()")
        return self.space.text(self.space.codes[self.space.best_guess(self._consistent)])

    def random_action(self, rng: np.random.Generator) -> str:
        """A uniformly random allowed code (ignores the feedback)."""
        self._require_active("random_action()")
        return self.space.text(self.space.codes[int(rng.integers(len(self.space.codes)))])

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """A forgetful guesser: a uniform random code consistent with the latest feedback only,
        or with p=``WEAK_RECALL_PROB`` (and on the first turn) one consistent with all feedback.

        Args:
            rng: The player's own generator (the env's ``np_random`` is not touched).
        """
        self._require_active("weak_expert_action()")
        rows = self._consistent
        if self._history and rng.random() >= WEAK_RECALL_PROB:
            guess, black, white = self._history[-1]
            rows = np.arange(len(self.space.codes))
            rows = rows[self.space.feedback_keys(guess, rows) == self.space.key(black, white)]
        return self.space.text(self.space.codes[rows[int(rng.integers(len(rows)))]])


@functools.lru_cache(maxsize=CACHED_POSITIONS)
def _minimax_row(code_length: int, num_colors: int, allow_repeats: bool, rows_bytes: bytes) -> int:
    """``CodeSpace.best_guess`` by minimax over the consistent rows (int32 bytes), cached."""
    space = code_space(code_length, num_colors, allow_repeats)
    rows = np.frombuffer(rows_bytes, dtype=np.int32)
    codes, counts = space.codes[rows], space.counts[rows]
    black = np.zeros((len(rows), len(rows)), dtype=np.int64)  # loops keep memory at k x k
    for p in range(code_length):
        black += codes[:, None, p] == codes[None, :, p]
    shared = np.zeros_like(black)
    for c in range(num_colors):
        shared += np.minimum(counts[:, None, c], counts[None, :, c])
    n_keys = (code_length + 1) ** 2
    cells = black * (code_length + 1) + (shared - black) + n_keys * np.arange(len(rows))[:, None]
    sizes = np.bincount(cells.ravel(), minlength=n_keys * len(rows)).reshape(len(rows), n_keys)
    return int(rows[int(np.argmin(sizes.max(axis=1)))])


@functools.lru_cache(maxsize=16)
def _split_rows(code_length: int, num_colors: int, allow_repeats: bool) -> dict[str, np.ndarray]:
    """Row indices of ``code_space(...)`` per split."""
    space = code_space(code_length, num_colors, allow_repeats)
    held_out = np.array([is_held_out(space.text(c, sep="")) for c in space.codes], dtype=bool)
    return {"train": np.flatnonzero(~held_out), "test": np.flatnonzero(held_out)}


def _symbol_class(symbols: str) -> str:
    """A regex character class body: any digit for digit colours, any capital for letter colours."""
    return "0-9" if symbols[0] in DIGIT_COLORS else "A-Z"


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _user(content: str) -> Message:
    return {"role": "user", "content": content}

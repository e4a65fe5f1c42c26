"""Wordle: find a secret 5-letter word from per-letter correct/present/absent marks (no tools).

Description:
    A task is a secret word of the env's vocabulary: the ``vocab_size`` most frequent words of
    ``turnrl.envs.games.wordlist.WORDS`` (default all 1200). Guesses must be words of the same
    vocabulary. System prompt ``"You are playing Wordle."``; the user prompt states the rules
    and asks for one word.

Action Space:
    The assistant's text; the guess is its last run of exactly 5 letters (case-insensitive),
    so ``"crane"``, ``"CRANE"`` and ``"My guess: crane."`` all guess *crane*.

Observation Space:
    One user message per turn:

    * ``"crane -> c:absent r:present a:correct n:absent e:absent (5 guesses left)"``: the
      marks of every letter, with the standard duplicate-letter rule (``feedback``): letters
      in the right place are ``correct`` first; then, left to right, a letter is ``present``
      while the secret still has an unmarked copy of it, else ``absent``. E.g. *speed* against
      *abide* reads ``s:absent p:absent e:present e:absent d:present``;
    * the marks followed by ``"Solved in {k} guesses."`` when the word is found, or by
      ``"Out of guesses; the word was {secret}."`` on the last turn;
    * ``"Reply with one 5-letter word."`` when the reply holds no 5-letter run, or
      ``"'{word}' is not in the word list; guess a common 5-letter English word."``. Such a
      turn still counts (like a wasted guess) and teaches the env nothing.

Rewards:
    1.0 on the turn that names the secret (the outcome), 0.0 otherwise.

Episode End:
    Terminated when the secret is guessed; truncated after ``max_turns`` turns (default 6).

Splits:
    A secret is held out (``test``) when ``crc32(secret) % 4 == 0`` (291 of the 1200 words);
    ``train`` holds the rest. The answers are the vocabulary words the expert solves within
    ``max_turns`` (all of them for every ``vocab_size`` with ``max_turns >= 5``: the expert
    needs at most 5 guesses on the full list). ``task_id = f"wordle-{secret}"``; ``state_key``
    is the set of distinct ``(guess, marks)`` pairs so far as a sorted tuple, with marks a
    string over ``G`` (correct), ``Y`` (present) and ``_`` (absent): equal feedback, equal key,
    whatever the order it came in (invalid replies leave it unchanged).

Scripted players:
    ``expert_action`` keeps the vocabulary words consistent with all marks so far and plays the
    vocabulary word that minimises the expected number of consistent words left (sum of squared
    partition sizes; ties to a consistent word, then to the more frequent word); with two or
    fewer consistent words it plays the more frequent. On the full list it solves every word
    (tests/envs/test_wordle.py): mean 3.30 guesses, at most 5 (1, 58, 734, 393 and 14 words
    in 1 to 5 guesses). A one-off precomputation per vocabulary (the 1200 x 1200 mark table
    and the expert's depth on every word) takes ~0.2 s; an episode then takes well under a ms.
    ``random_action`` is a uniform random vocabulary word. ``weak_expert_action`` plays a
    uniform random consistent word (a hard-mode guesser without a strategy), or with p = 0.8 a
    uniform random vocabulary word. ``python -m turnrl baselines turnrl/Wordle-v0 --episodes
    200``, success (mean turns): test split random 0.00 (6.0), weak 0.44 (5.4), expert 1.00
    (3.4); train split random 0.02, weak 0.40, expert 1.00 (2000 test episodes: weak 0.42).

Version History:
    v0: initial version.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Callable

import numpy as np

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.envs.games.wordlist import WORD_LENGTH, WORDS
from turnrl.tools import ParseResult, ToolResult

__all__ = ["WordleEnv", "WordleSolver", "feedback", "format_feedback", "is_held_out", "marks_code", "pattern_matrix",
           "solver_for"]

SYSTEM_PROMPT = "You are playing Wordle."
ABSENT, PRESENT, CORRECT = 0, 1, 2
MARK_NAMES: tuple[str, ...] = ("absent", "present", "correct")
MARK_LETTERS: tuple[str, ...] = ("_", "Y", "G")
SOLVED_CODE = 3**WORD_LENGTH - 1
"""``marks_code`` of an all-correct guess."""
HELD_OUT_BUCKETS = 4  # one hash bucket in four is the test split
MIN_VOCAB = 10
WEAK_RANDOM_PROB = 0.8
"""Probability that ``weak_expert_action`` plays a random vocabulary word instead of a consistent one."""
CACHED_POSITIONS = 4096
"""Candidate sets whose best guess a ``WordleSolver`` remembers."""
GUESS_WORD = re.compile(rf"(?<![A-Za-z])[A-Za-z]{{{WORD_LENGTH}}}(?![A-Za-z])")
NO_WORD_REPLY = f"Reply with one {WORD_LENGTH}-letter word."


def is_held_out(secret: str) -> bool:
    """Whether the secret word belongs to the test split (a stable hash)."""
    return zlib.crc32(secret.encode()) % HELD_OUT_BUCKETS == 0


def feedback(guess: str, answer: str) -> tuple[int, ...]:
    """The marks of ``guess`` against ``answer``: one of ABSENT, PRESENT, CORRECT per letter.

    Standard duplicate rule: right-place letters are CORRECT first; then, left to right, a
    letter is PRESENT while ``answer`` has a copy of it not yet marked, else ABSENT.

    Raises:
        ValueError: If the words differ in length.
    """
    if len(guess) != len(answer):
        raise ValueError(f"guess and answer must have the same length, got {guess!r} and {answer!r}")
    marks = [CORRECT if g == a else ABSENT for g, a in zip(guess, answer)]
    unmarked: dict[str, int] = {}
    for g, a in zip(guess, answer):
        if g != a:
            unmarked[a] = unmarked.get(a, 0) + 1
    for i, g in enumerate(guess):
        if marks[i] != CORRECT and unmarked.get(g, 0) > 0:
            marks[i] = PRESENT
            unmarked[g] -= 1
    return tuple(marks)


def marks_code(marks: tuple[int, ...]) -> int:
    """The marks as one base-3 number (letter ``i`` is digit ``i``), as in ``pattern_matrix``."""
    return sum(m * 3**i for i, m in enumerate(marks))


def format_feedback(guess: str, marks: tuple[int, ...]) -> str:
    """``"crane -> c:absent r:present a:correct n:absent e:absent"``."""
    return f"{guess} -> " + " ".join(f"{c}:{MARK_NAMES[m]}" for c, m in zip(guess, marks))


def pattern_matrix(guesses: tuple[str, ...], answers: tuple[str, ...]) -> np.ndarray:
    """``marks_code(feedback(g, a))`` for every guess (rows) and answer (columns), uint8."""
    g = np.array([[ord(c) for c in w] for w in guesses], dtype=np.int16)
    a = np.array([[ord(c) for c in w] for w in answers], dtype=np.int16)
    green = [g[:, None, i] == a[None, :, i] for i in range(WORD_LENGTH)]
    code = np.zeros((len(guesses), len(answers)), dtype=np.int16)
    yellow: list[np.ndarray] = []
    for i in range(WORD_LENGTH):
        # copies of guess letter i in the answer's non-green places, less the ones marked earlier
        free = sum((g[:, None, i] == a[None, :, j]) & ~green[j] for j in range(WORD_LENGTH))
        used = sum((g[:, k] == g[:, i])[:, None] & yellow[k] for k in range(i))
        yellow.append(~green[i] & (free - used > 0))
        code += (CORRECT * green[i] + PRESENT * yellow[i]).astype(np.int16) * 3**i
    return code.astype(np.uint8)


class WordleSolver:
    """The expert's strategy over one vocabulary (guesses and candidate answers alike).

    Args:
        words: The vocabulary, most frequent first (ties in the strategy go to earlier words).
    """

    def __init__(self, words: tuple[str, ...]) -> None:
        self.words = words
        self.index = {w: i for i, w in enumerate(words)}
        self.patterns = pattern_matrix(words, words)
        self._offsets = (3**WORD_LENGTH * np.arange(len(words)))[:, None]
        self.best_guess: Callable[[tuple[int, ...]], int] = functools.lru_cache(CACHED_POSITIONS)(self._best_guess)

    def __reduce__(self) -> tuple:
        """Pickle as the vocabulary (the tables and the cache are rebuilt)."""
        return (type(self), (self.words,))

    def _best_guess(self, candidates: tuple[int, ...]) -> int:
        """The word index to play when ``candidates`` (word indices, ascending) are consistent."""
        if len(candidates) <= 2:
            return candidates[0]
        n_codes = 3**WORD_LENGTH
        cells = self.patterns[:, candidates].astype(np.int64) + self._offsets
        sizes = np.bincount(cells.ravel(), minlength=n_codes * len(self.words)).reshape(-1, n_codes)
        score = 2 * (sizes.astype(np.int64) ** 2).sum(axis=1)
        score[list(candidates)] -= 1  # a tie goes to a word that may be the answer
        return int(np.argmin(score))

    def narrow(self, candidates: tuple[int, ...], guess: int, code: int) -> tuple[int, ...]:
        """The candidates consistent with ``guess`` having got the marks ``code``."""
        cands = np.asarray(candidates, dtype=np.int64)
        return tuple(int(c) for c in cands[self.patterns[guess, cands] == code])

    def depths(self) -> dict[int, int]:
        """Guesses the strategy needs for each word as the answer (word index -> depth)."""
        depth: dict[int, int] = {}
        stack = [(tuple(range(len(self.words))), 1)]
        while stack:
            candidates, d = stack.pop()
            guess = self.best_guess(candidates)
            codes = self.patterns[guess, list(candidates)]
            for code in np.unique(codes):
                group = tuple(c for c, k in zip(candidates, codes) if k == code)
                if code == SOLVED_CODE:
                    depth[group[0]] = d
                else:
                    stack.append((group, d + 1))
        return depth


@functools.lru_cache(maxsize=8)
def solver_for(vocab_size: int) -> WordleSolver:
    """The (cached) solver of the ``vocab_size`` most frequent words."""
    return WordleSolver(WORDS[:vocab_size])


@functools.lru_cache(maxsize=32)
def _answers(vocab_size: int, max_turns: int) -> dict[str, tuple[int, ...]]:
    """Answer word indices per split: the words the expert solves within ``max_turns``."""
    depth = solver_for(vocab_size).depths()
    solved = [i for i in range(vocab_size) if depth[i] <= max_turns]
    words = WORDS[:vocab_size]
    return {
        "train": tuple(i for i in solved if not is_held_out(words[i])),
        "test": tuple(i for i in solved if is_held_out(words[i])),
    }


class WordleEnv(MultiTurnEnv):
    """Guess a secret 5-letter word from per-letter correct/present/absent marks.

    Args:
        vocab_size: How many of the most frequent words of ``WORDS`` make the vocabulary of
            guesses and secrets (``MIN_VOCAB`` to ``len(WORDS)``; default all).
        max_turns: Turn limit (default 6).
        tool_parser: Parser name (the env has no tools; calls get "unknown tool").
    """

    default_max_turns = 6

    def __init__(self, vocab_size: int | None = None, *, max_turns: int | None = None,
                 tool_parser: str = "hermes") -> None:
        vocab_size = len(WORDS) if vocab_size is None else vocab_size
        if (not isinstance(vocab_size, (int, np.integer)) or isinstance(vocab_size, bool)
                or not MIN_VOCAB <= vocab_size <= len(WORDS)):
            raise ValueError(f"vocab_size must be an int in [{MIN_VOCAB}, {len(WORDS)}] or None, got {vocab_size!r}")
        super().__init__(tool_parser=tool_parser, max_turns=max_turns)
        self.vocab_size = int(vocab_size)
        self.solver = solver_for(self.vocab_size)
        self.words = self.solver.words
        self.answers = dict(_answers(self.vocab_size, self.max_turns))
        for split, answers in self.answers.items():
            if not answers:
                raise ValueError(f"the {split!r} split of Wordle(vocab_size={vocab_size}, max_turns={self.max_turns}) "
                                 "is empty; raise vocab_size or max_turns")
        self._candidates: tuple[int, ...] = ()
        self._seen: frozenset[tuple[str, str]] = frozenset()

    def split_tasks(self, split: str) -> tuple[str, ...]:
        """All secret words of a split."""
        return tuple(self.words[i] for i in self.answers[split])

    # ----------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> str:
        answers = self.answers[split]
        return self.words[answers[int(rng.integers(len(answers)))]]

    def _task_id(self, task: str) -> str:
        return f"wordle-{task}"

    def _start_episode(self, task: str) -> list[Message]:
        self._candidates = tuple(range(len(self.words)))
        self._seen = frozenset()
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": (
                f"Guess my secret {WORD_LENGTH}-letter English word in {self.max_turns} tries. After each guess "
                "I mark every letter: correct (right letter, right place), present (in the word but elsewhere) "
                "or absent (not in the word, or no more copies of it). Reply with one word."
            )},
        ]

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        found = GUESS_WORD.findall(action)
        if not found:
            return TurnOutcome(messages=(_user(NO_WORD_REPLY),))
        guess = found[-1].lower()
        if guess not in self.solver.index:
            return TurnOutcome(messages=(
                _user(f"'{guess}' is not in the word list; guess a common {WORD_LENGTH}-letter English word."),))
        marks = feedback(guess, self._task)
        self._seen = self._seen | {(guess, "".join(MARK_LETTERS[m] for m in marks))}
        self._candidates = self.solver.narrow(self._candidates, self.solver.index[guess], marks_code(marks))
        text, used = format_feedback(guess, marks), self._turn + 1
        if guess == self._task:
            return TurnOutcome(messages=(_user(f"{text}. Solved in {used} guess{'es' if used > 1 else ''}."),),
                               reward=1.0, terminated=True, success=True)
        left = self.max_turns - used
        if left == 0:
            return TurnOutcome(messages=(_user(f"{text}. Out of guesses; the word was {self._task}."),))
        return TurnOutcome(messages=(_user(f"{text} ({left} guess{'es' if left > 1 else ''} left)"),))

    def _state_key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self._seen))

    # --------------------------------------------------------------- players
    def expert_action(self) -> str:
        """The vocabulary word that minimises the expected number of consistent words left."""
        self._require_active("expert_action()")
        return self.words[self.solver.best_guess(self._candidates)]

    def random_action(self, rng: np.random.Generator) -> str:
        """A uniformly random vocabulary word (ignores the marks)."""
        self._require_active("random_action()")
        return self.words[int(rng.integers(len(self.words)))]

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """A uniform random word consistent with all marks so far, or with p=``WEAK_RANDOM_PROB``
        a uniform random vocabulary word.

        Args:
            rng: The player's own generator (the env's ``np_random`` is not touched).
        """
        self._require_active("weak_expert_action()")
        if rng.random() < WEAK_RANDOM_PROB:
            return self.random_action(rng)
        return self.words[self._candidates[int(rng.integers(len(self._candidates)))]]


def _user(content: str) -> Message:
    return {"role": "user", "content": content}

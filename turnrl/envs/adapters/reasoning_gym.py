"""ReasoningGym: reasoning-gym's procedural tasks as single- or multi-turn chat envs (no tools).

Description:
    Wraps any dataset of the ``reasoning-gym`` package (``pip install turnrl[reasoning]``;
    ``reasoning_gym.create_dataset(name, seed=, size=, **config)``). A task is one dataset
    entry ``{"question", "answer", "metadata"}``; the user prompt is its question, the
    system prompt says how to write the answer (and how many attempts there are). The
    dataset scores a reply with its own ``score_answer(answer, entry)``.

    A reset draws the task from ``self.np_random`` only: a block seed ``s`` (an int below
    2**31) builds ``create_dataset(dataset, seed=s, size=8, **dataset_kwargs)`` and the
    first of its 8 entries whose split matches is the task (a new block seed when none
    does). Same reset seed, same entry.

Action Space:
    The assistant's text. The answer is extracted by ``answer_format``:

    * ``"answer_tag"`` (default, reasoning-gym's own convention): the text inside the
      last ``<answer>...</answer>`` pair, stripped (``reasoning_gym.utils.extract_answer``);
    * ``"answer_line"``: the text after the last ``Answer:``, to the end of the reply,
      stripped (multi-line answers such as matrices fit);
    * ``"raw"``: the whole reply, stripped.

    A reply with tool calls gets an "unknown tool" message for each (the env has none).

Observation Space:
    Reset: a system message (``SYSTEM_PROMPT`` for the format, plus the attempt count when
    ``max_turns > 1``) and the question as a user message (stripped; characters outside
    the message charset become ``?``; a question over 4096 characters is cut, see
    ``turnrl.envs.messages.to_observation``). Each step, one user message:

    * ``"Correct."`` when the score is 1.0;
    * ``"No answer found. Write your final answer as <answer>...</answer>."`` (the
      format's hint) when nothing could be extracted (also on the last attempt);
    * ``"Incorrect, try again."`` while attempts remain (``" Your answer scored 0.40 of
      1."`` follows when the dataset gave partial credit);
    * ``"Incorrect."`` (with the partial score, if any) on the last attempt.

Rewards:
    Outcome only: on the final turn, the dataset's score of that turn's answer, in
    ``[0, 1]``: 1.0 when correct, a partial score when the dataset gives one (e.g.
    ``spell_backward`` scores near misses, and reasoning-gym's default scorer gives
    ``len(gold) / len(answer)`` when the answer merely contains the gold answer), 0.0
    otherwise. Earlier turns get 0.0. ``success`` is ``score == 1.0``. A scorer that raises
    scores 0.0.

Episode End:
    Terminated on a correct answer, or after the last of ``max_turns`` attempts (default
    1, i.e. single-turn) whatever it holds: the attempts are the task's own budget, so an
    episode is never truncated. A reply with no answer counts as an attempt.

Splits:
    An entry is held out (``test``) when ``crc32(question) % 5 == 0``; ``train`` holds the
    rest; draws are rejected until the split matches. ``task_id`` is
    ``f"{dataset}-{sha256(question)[:12]}"``; ``state_key`` is
    ``(sha256(question)[:12], attempts so far)`` (every reply is an attempt): the attempts
    left are the whole env state; the wrong answers given so far are not part of it.

Scripted players:
    ``expert_action`` writes the entry's gold ``answer`` in the answer format. Datasets
    whose entries carry no gold answer (``answer`` is None, e.g. ``boxnet``,
    ``graph_color``, ``propositional_logic``, ``rubiks_cube``, ``rush_hour``) have no
    expert (``expert_action`` raises NotImplementedError). ``random_action`` is a
    uniformly random answer from ``ANSWER_POOL`` other entries' answers (a fixed block of
    the dataset, seed ``ANSWER_POOL_SEED``); ``weak_expert_action`` is the default (expert
    with p=0.5, else random). Measured with ``python -m turnrl baselines
    turnrl/ReasoningGym-v0 --episodes 200`` (basic_arithmetic, single turn), test split:
    random 0.00, weak 0.54, expert 1.00 (train: the same).

Version History:
    v0: initial version (reasoning-gym 0.1.25).
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.tools import ParseResult, ToolResult

__all__ = ["ANSWER_FORMATS", "ReasoningGymEnv", "RGTask", "extract_answer", "is_held_out"]

AnswerFormat = Literal["answer_tag", "answer_line", "raw"]
ANSWER_FORMATS: tuple[str, ...] = ("answer_tag", "answer_line", "raw")
FORMAT_HINTS = {
    "answer_tag": "Write your final answer as <answer>...</answer>.",
    "answer_line": 'Write your final answer on the last line as "Answer: ...".',
    "raw": "Reply with the answer only.",
}
SYSTEM_PROMPT = "Solve the problem. {hint}"
ATTEMPTS_NOTE = " You have {n} attempts; a wrong answer gets feedback."
CORRECT, INCORRECT, RETRY = "Correct.", "Incorrect.", "Incorrect, try again."
NO_ANSWER = "No answer found. {hint}"
PARTIAL = " Your answer scored {score:.2f} of 1."
TEST_BUCKETS, TEST_BUCKET = 5, 0
BLOCK_SIZE = 8
"""Entries per block seed; a reset takes the first entry of its block in the wanted split."""
MAX_BLOCKS = 1000
ANSWER_POOL, ANSWER_POOL_SEED = 32, 1_000_003
RESERVED_KWARGS = ("seed", "size")
_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def is_held_out(question: str) -> bool:
    """Whether an entry with this question text belongs to the test split (a stable hash)."""
    return zlib.crc32(question.encode()) % TEST_BUCKETS == TEST_BUCKET


def extract_answer(text: str, answer_format: str) -> str | None:
    """The answer in ``text`` per ``answer_format`` (see the module docstring), or None.

    Raises:
        ValueError: On an unknown format.
    """
    if answer_format == "answer_tag":
        matches = _ANSWER_TAG.findall(text)
        return matches[-1].strip() if matches else None
    if answer_format == "answer_line":
        _, sep, tail = text.rpartition("Answer:")
        return tail.strip() if sep else None
    if answer_format == "raw":
        return text.strip() or None
    raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")


def format_answer(answer: str, answer_format: str) -> str:
    """``answer`` written the way ``extract_answer`` reads it back."""
    if answer_format == "answer_tag":
        return f"<answer>{answer}</answer>"
    if answer_format == "answer_line":
        return f"Answer: {answer}"
    return answer


@dataclass(frozen=True)
class RGTask:
    """One drawn reasoning-gym entry.

    Attributes:
        block_seed: The ``seed`` the dataset block was created with.
        index: The entry's index in the block.
        entry: The entry dict (``question``, ``answer``, ``metadata``).
    """

    block_seed: int
    index: int
    entry: dict = field(hash=False, compare=False, repr=False)

    @property
    def question(self) -> str:
        return self.entry["question"]

    @property
    def digest(self) -> str:
        """First 12 hex digits of the question's sha256."""
        return hashlib.sha256(self.question.encode()).hexdigest()[:12]


class ReasoningGymEnv(MultiTurnEnv):
    """A reasoning-gym dataset as a chat env; see the module docstring for the rules.

    Args:
        dataset: A reasoning-gym dataset name (``reasoning_gym.factory.DATASETS``).
        dataset_kwargs: The dataset's config fields (e.g. ``{"min_terms": 2}``), without
            ``seed``/``size`` (the env sets those).
        max_turns: Attempts per episode (1: single-turn; more: retry with feedback).
        answer_format: ``"answer_tag"``, ``"answer_line"`` or ``"raw"``.
        tool_parser: Parser name (the env has no tools; calls get "unknown tool").

    Raises:
        ImportError: If reasoning-gym is not installed.
        ValueError: On an unknown dataset, a bad config, reserved kwargs or a bad format.
    """

    default_max_turns = 1

    def __init__(self, dataset: str = "basic_arithmetic", dataset_kwargs: Mapping[str, Any] | None = None, *,
                 max_turns: int | None = None, answer_format: AnswerFormat = "answer_tag",
                 tool_parser: str = "hermes") -> None:
        try:
            import reasoning_gym
            from reasoning_gym.factory import DATASETS
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ImportError("ReasoningGymEnv needs reasoning-gym: pip install 'turnrl[reasoning]'") from e
        if not isinstance(dataset, str) or dataset not in DATASETS:
            raise ValueError(f"dataset must be a reasoning-gym dataset name, got {dataset!r}; "
                             f"known: {', '.join(sorted(DATASETS))}")
        if dataset_kwargs is not None and not isinstance(dataset_kwargs, Mapping):
            raise TypeError(f"dataset_kwargs must be a mapping of config fields, got {type(dataset_kwargs).__name__}")
        kwargs = dict(dataset_kwargs or {})
        reserved = sorted(set(kwargs) & set(RESERVED_KWARGS))
        if reserved:
            raise ValueError(f"dataset_kwargs must not set {reserved}: the env chooses seed and size per task")
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
        self.dataset = dataset
        self.dataset_kwargs = kwargs
        self.answer_format = answer_format
        self._create = reasoning_gym.create_dataset
        try:
            pool = self._block(ANSWER_POOL_SEED, ANSWER_POOL)
            answers = [pool[i]["answer"] for i in range(ANSWER_POOL)]
        except Exception as e:
            raise ValueError(f"reasoning-gym could not build {dataset!r} with dataset_kwargs={kwargs}: "
                             f"{type(e).__name__}: {e}") from e
        self.answer_pool: tuple[str, ...] = tuple(dict.fromkeys(str(a) for a in answers if a is not None))
        super().__init__(tool_parser=tool_parser, max_turns=max_turns)
        self._attempts = 0
        self._scorer: Any = None

    def _block(self, seed: int, size: int = BLOCK_SIZE) -> Any:
        return self._create(self.dataset, seed=seed, size=size, **self.dataset_kwargs)

    @property
    def format_hint(self) -> str:
        """The sentence telling the model how to write its answer."""
        return FORMAT_HINTS[self.answer_format]

    # ----------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> RGTask:
        want_test = split == "test"
        for _ in range(MAX_BLOCKS):
            seed = int(rng.integers(2**31 - 1))
            block = self._block(seed)
            for index in range(BLOCK_SIZE):
                entry = block[index]
                if is_held_out(entry["question"]) == want_test:
                    self._scorer = block
                    return RGTask(seed, index, entry)
        raise ValueError(f"no {split!r} entry of {self.dataset!r} in {MAX_BLOCKS * BLOCK_SIZE} draws; "
                         "the dataset config yields too few distinct questions for a split")

    def _task_id(self, task: RGTask) -> str:
        return f"{self.dataset}-{task.digest}"

    def _start_episode(self, task: RGTask) -> list[Message]:
        self._attempts = 0
        system = SYSTEM_PROMPT.format(hint=self.format_hint)
        if self.max_turns > 1:
            system += ATTEMPTS_NOTE.format(n=self.max_turns)
        return [{"role": "system", "content": system}, {"role": "user", "content": task.question.strip()}]

    def score(self, answer: str | None) -> float:
        """The dataset's score of ``answer`` for the current entry, clipped to [0, 1] (0.0 if it raises)."""
        if self._task is None:
            raise RuntimeError("score() called before reset(); call reset() first")
        try:
            value = float(self._scorer.score_answer(answer, self._task.entry))
        except Exception:
            return 0.0
        return min(max(value, 0.0), 1.0) if np.isfinite(value) else 0.0

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        self._attempts += 1
        last = self._attempts >= self.max_turns
        answer = extract_answer(action, self.answer_format)
        if answer is None:
            return TurnOutcome(messages=(_user(NO_ANSWER.format(hint=self.format_hint)),), terminated=last)
        score = self.score(answer)
        if score == 1.0:
            return TurnOutcome(messages=(_user(CORRECT),), reward=1.0, terminated=True, success=True)
        partial = PARTIAL.format(score=score) if score > 0 else ""
        if last:
            return TurnOutcome(messages=(_user(INCORRECT + partial),), reward=score, terminated=True)
        return TurnOutcome(messages=(_user(RETRY + partial),))

    def _state_key(self) -> Hashable:
        return (self._task.digest, self._attempts)

    # --------------------------------------------------------------- players
    def expert_action(self) -> str:
        """The entry's gold answer in the answer format.

        Raises:
            NotImplementedError: If the dataset gives no gold answer for the entry.
        """
        self._require_active("expert_action()")
        gold = self._task.entry.get("answer")
        if gold is None:
            raise NotImplementedError(f"{self.dataset!r} entries carry no gold answer; there is no scripted expert")
        return format_answer(str(gold), self.answer_format)

    def random_action(self, rng: np.random.Generator) -> str:
        """A uniformly random answer from ``answer_pool`` (other entries' answers), formatted."""
        self._require_active("random_action()")
        if not self.answer_pool:
            return format_answer("", self.answer_format)
        return format_answer(self.answer_pool[int(rng.integers(len(self.answer_pool)))], self.answer_format)


def _user(content: str) -> Message:
    return {"role": "user", "content": content}

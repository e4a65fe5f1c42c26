"""CalcMath: multi-step arithmetic (an expression or a word problem) with the ``calculator`` tool.

Description:
    Task: ``"Compute {a} {op1} {b} {op2} {c}."`` (``num_ops`` = 1 or 2 operations from
    ``+ - *``, integers in ``[2, max_operand]``), or the same problem told as a short story
    (``style="word"``, below). The intended solution takes ``num_ops + 1`` turns: one
    calculator call per operation, in standard precedence order (``a + b * c`` computes
    ``b * c`` first), then the answer; with ``tool_parser="hermes"``::

        <tool_call>
        {"name": "calculator", "arguments": {"expression": "37 * 24"}}
        </tool_call>
        ...
        Answer: 903

    The system prompt states the task and the answer format; the calculator reaches the model
    through ``info["tools"]`` and the chat template, and the expert writes its calls in the
    ``tool_parser`` format.

    Word problems (``style="word"``): the user prompt tells the same ``Problem`` as a short
    story, e.g. ``"A shop has 37 boxes with 24 pens each. It sells 5 pens. How many pens
    does the shop have now?"`` for ``37 * 24 - 5``. The problem is split into signed terms
    in standard precedence (``37 - 24 * 5`` is ``+37`` and ``-(24 * 5)``); the first term is
    the starting amount, each later term a gain (``+``) or a loss (``-``), and a term of 2 or
    3 factors reads as groups (``"24 boxes with 5 pens each"``). The operands appear in the
    text in their order, so the plan, the answer, the split, ``task_id`` and ``state_key``
    are those of the expression. Stories (``STORIES``): pens in a shop, books in a library,
    eggs on a farm, a truck's distance from its depot, ages of three people, a game score,
    an account balance and a temperature. A story whose amounts cannot go negative (stock,
    distance, ages within 1..120) is only used when no running total does; the score,
    balance and temperature stories always apply (temperature and ages only for
    single-number gains and losses). The story is picked among those that apply by
    ``zlib.crc32("word:" + problem)``, so a problem always reads the same way.

Action Space:
    The assistant's text: tool calls in the agent's format (``tool_parser``), or
    ``Answer: <int>``.

Observation Space:
    * malformed tool call (or a calculator call in another format than ``tool_parser``'s) ->
      user message ``"Error: could not parse your tool call: <reason>"`` and a well-formed call;
    * tool calls -> one ``tool`` message per call (result or ``"Error: ..."``); ``Answer:`` in
      such a turn is ignored;
    * neither a call nor an answer -> user message
      ``'Call the calculator tool or reply "Answer: <number>".'``.

Rewards:
    Outcome only: 1.0 on the turn whose first ``Answer: <int>`` is correct, else 0.0.

Episode End:
    Terminated on the first answer (right or wrong); truncated after ``max_turns`` turns
    (default ``num_ops + 3``).

Splits:
    A problem is test iff ``zlib.crc32(problem) % 5 == 0`` (1 bucket of 5); tasks are drawn
    by rejection sampling. ``task_id`` = the problem string, e.g. ``"37 + 24 * 5"``.
    ``state_key`` = the plan's intermediate results obtained from successful calculator
    calls so far, in plan order (e.g. ``()``, ``(120,)``, ``(120, 157)``).

Scripted players:
    The expert follows the plan. Weak player: per turn, p=0.35 the expert's action, else a
    direct mental answer (exact with p=0.2, otherwise with one operand off by 1..3, which is
    always wrong). Expected success ``f(k) = 0.35 f(k-1) + 0.13``, ``f(0) = 1``: 0.48 for one
    op, 0.30 for two. Measured (reset seeds 0..1999, player rng ``default_rng(10_000 +
    seed)``): num_ops=2 train 0.31, test 0.31; num_ops=1 0.49. Random player (an answer
    drawn uniformly from the range of values any operator choice could give, no tool):
    0.00; ``python -m turnrl baselines turnrl/CalcMath-v0``: random 0.00, weak 0.31,
    expert 1.00 (200 test episodes).

Version History:
    v0: initial version (the word style is a kwarg of v0: expression prompts are unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping

import itertools
import math
import operator
import re
import zlib
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.envs.extract import first_int
from turnrl.tools import ParseResult, ToolCall, ToolResult, calculator, format_call

OPS = MappingProxyType({"+": operator.add, "-": operator.sub, "*": operator.mul})
TEST_BUCKETS, TEST_BUCKET = 5, 0
ANSWER = re.compile(r"Answer:\s*(-?\d+)")
FORMAT_REMINDER = 'Call the calculator tool or reply "Answer: <number>".'
EXAMPLE_CALL = ToolCall("calculator", {"expression": "37 * 24"})
"""The call the malformed-call feedback (and a renderer's ``tools_prompt()``) shows."""
WEAK_FOLLOW_PROB, WEAK_EXACT_PROB = 0.35, 0.2
MAX_DRAWS = 10_000
STYLES: tuple[str, ...] = ("expression", "word")


@dataclass(frozen=True)
class Step:
    """One calculator step of the expert plan: ``left op right = value``."""

    left: int
    op: str
    right: int

    @property
    def expression(self) -> str:
        return f"{self.left} {self.op} {self.right}"

    @property
    def value(self) -> int:
        return OPS[self.op](self.left, self.right)


@dataclass(frozen=True)
class Problem:
    """An arithmetic problem ``operands[0] ops[0] operands[1] ...``."""

    operands: tuple[int, ...]
    ops: tuple[str, ...]

    @property
    def text(self) -> str:
        parts = [str(self.operands[0])]
        for op, x in zip(self.ops, self.operands[1:]):
            parts += [op, str(x)]
        return " ".join(parts)

    @property
    def split(self) -> str:
        return "test" if zlib.crc32(self.text.encode()) % TEST_BUCKETS == TEST_BUCKET else "train"

    def plan(self) -> tuple[Step, ...]:
        """Calculator steps in standard precedence: ``*`` first, then left to right."""
        values, ops, steps = list(self.operands), list(self.ops), []
        while ops:
            i = ops.index("*") if "*" in ops else 0
            step = Step(values[i], ops[i], values[i + 1])
            steps.append(step)
            values[i : i + 2] = [step.value]
            del ops[i]
        return tuple(steps)

    @property
    def answer(self) -> int:
        return self.plan()[-1].value

    def terms(self) -> tuple[Term, ...]:
        """The problem as a sum of signed products in standard precedence:
        ``37 - 24 * 5`` is ``(Term("+", (37,)), Term("-", (24, 5)))``."""
        terms = [Term("+", (self.operands[0],))]
        for op, x in zip(self.ops, self.operands[1:]):
            if op == "*":
                terms[-1] = Term(terms[-1].sign, (*terms[-1].factors, x))
            else:
                terms.append(Term(op, (x,)))
        return tuple(terms)


@dataclass(frozen=True)
class Term:
    """One signed product of a problem's sum: ``sign`` ("+" or "-") times ``prod(factors)``."""

    sign: str
    factors: tuple[int, ...]

    @property
    def value(self) -> int:
        return (1 if self.sign == "+" else -1) * math.prod(self.factors)


@dataclass(frozen=True)
class Story:
    """A word-problem template over a sum of terms.

    Attributes:
        name: A short label.
        amounts: Phrases for a term of 1, 2 and 3 factors (``"{0} boxes with {1} pens each"``);
            None where the story cannot say such a term.
        start: The first sentence, with ``{amount}`` (the first term; its sign is "+").
        gain: The sentence for a later ``+`` term.
        loss: The sentence for a later ``-`` term.
        question: The closing question.
        signed: Whether a negative running total makes sense (a score, a balance).
    """

    name: str
    amounts: tuple[str | None, str | None, str | None]
    start: str
    gain: str
    loss: str
    question: str
    signed: bool = False

    def render(self, terms: tuple[Term, ...]) -> str | None:
        """The story for ``terms``, or None when it cannot tell them."""
        if not self.signed and min(itertools.accumulate(t.value for t in terms)) < 0:
            return None
        sentences = []
        for i, term in enumerate(terms):
            amount = self.amounts[len(term.factors) - 1] if len(term.factors) <= len(self.amounts) else None
            if amount is None:
                return None
            template = self.start if i == 0 else self.gain if term.sign == "+" else self.loss
            sentences.append(template.format(amount=amount.format(*term.factors)))
        return " ".join([*sentences, self.question])


@dataclass(frozen=True)
class AgeStory:
    """Ages of three people: the first term is a chain of "times as old" (all its factors),
    each later term "years older/younger" than the previous person; every age in 1..120."""

    name: str = "ages"
    people: tuple[str, ...] = ("Ana", "Ben", "Cleo", "Dev")
    max_age: int = 120

    def render(self, terms: tuple[Term, ...]) -> str | None:
        """The story for ``terms``, or None when it cannot tell them."""
        first, rest = terms[0], terms[1:]
        if any(len(t.factors) > 1 for t in rest) or len(first.factors) + len(rest) > len(self.people):
            return None
        ages = list(itertools.accumulate(first.factors, operator.mul))
        ages += [ages[-1] + v for v in itertools.accumulate(t.value for t in rest)]
        if not all(1 <= age <= self.max_age for age in ages):
            return None
        names = iter(self.people)
        previous = next(names)
        sentences = [f"{previous} is {first.factors[0]} years old."]
        for factor in first.factors[1:]:
            person = next(names)
            sentences.append(f"{person} is {factor} times as old as {previous}.")
            previous = person
        for term in rest:
            person = next(names)
            relation = "older" if term.sign == "+" else "younger"
            sentences.append(f"{person} is {term.factors[0]} years {relation} than {previous}.")
            previous = person
        return " ".join([*sentences, f"How old is {previous}?"])


STORIES: tuple[Story | AgeStory, ...] = (
    Story("shop", ("{0} pens", "{0} boxes with {1} pens each", "{0} crates, each holding {1} boxes with {2} pens"),
          "A shop has {amount}.", "It receives {amount}.", "It sells {amount}.",
          "How many pens does the shop have now?"),
    Story("library", ("{0} books", "{0} shelves with {1} books each", "{0} rooms, each with {1} shelves of {2} books"),
          "A library owns {amount}.", "It buys {amount}.", "It gives away {amount}.",
          "How many books does the library own now?"),
    Story("eggs", ("{0} eggs", "{0} cartons of {1} eggs", "{0} crates, each packed with {1} cartons of {2} eggs"),
          "A farm collects {amount}.", "Then it collects another {amount}.", "Then it sells {amount}.",
          "How many eggs does the farm have now?"),
    Story("distance", ("{0} km", "{0} hours at {1} km per hour", "{0} days, {1} hours a day at {2} km per hour"),
          "A truck leaves its depot and drives {amount} along a straight road.",
          "Then it drives {amount} further along the road.", "Then it drives {amount} back toward the depot.",
          "How many km from the depot is the truck now?"),
    AgeStory(),
    Story("score", ("{0} points", "{0} rounds worth {1} points each", "{0} levels of {1} rounds worth {2} points each"),
          "In a game, Maya scores {amount}.", "Then she scores {amount}.", "Then she loses {amount}.",
          "What is Maya's score at the end (it can be negative)?", signed=True),
    Story("account", ("{0} dollars", "{0} payments of {1} dollars", "{0} months of {1} payments of {2} dollars"),
          "An account receives {amount}.", "Then it receives {amount}.", "Then {amount} are taken out.",
          "What is the balance of the account now (negative if overdrawn)?", signed=True),
    Story("temperature", ("{0} degrees", None, None),
          "At dawn the temperature is {amount}.", "It then rises by {amount}.", "It then falls by {amount}.",
          "What is the temperature now, in degrees?", signed=True),
)
"""The word-problem stories, in the order ``word_problem`` indexes them."""


def word_problem(problem: Problem) -> str:
    """``problem`` told as a story (see the module docstring); the same problem, the same text."""
    terms = problem.terms()
    told = [text for text in (story.render(terms) for story in STORIES) if text is not None]
    return told[zlib.crc32(f"word:{problem.text}".encode()) % len(told)]


def system_prompt(style: str = "expression") -> str:
    """The system message: the task and the answer format (the tool comes through the template)."""
    task = "arithmetic word problems" if style == "word" else "arithmetic"
    return (
        f"You solve {task} with the calculator tool.\n"
        "Use one call per operation. When you are done, reply: Answer: <number>"
    )


class CalcMathEnv(MultiTurnEnv):
    """Arithmetic word problems solved over several calculator turns.

    Args:
        max_operand: Largest operand (operands are drawn from ``[2, max_operand]``).
        num_ops: Number of operations, 1 or 2.
        style: ``"expression"`` (``"Compute 37 * 24 - 5."``) or ``"word"`` (the same problem
            as a word problem; see the module docstring).
        max_turns: Turn limit; default ``num_ops + 3``.
        tool_parser: Parser name for the tool-call format.
        executors: Tool name -> executor kind overriding the tool's own (e.g.
            ``{"calculator": "remote"}`` with ``executor_options={"remote": {"url": ...}}``).
        executor_options: Executor kind -> its options (``turnrl.tools.executors``).
    """

    tools = (calculator,)

    def __init__(
        self,
        max_operand: int = 99,
        num_ops: int = 2,
        *,
        style: str = "expression",
        max_turns: int | None = None,
        tool_parser: str = "hermes",
        executors: Mapping[str, str] | None = None,
        executor_options: Mapping[str, Mapping] | None = None,
    ) -> None:
        if not isinstance(max_operand, (int, np.integer)) or max_operand < 2:
            raise ValueError(f"max_operand must be an int >= 2, got {max_operand!r}")
        if num_ops not in (1, 2):
            raise ValueError(f"num_ops must be 1 or 2, got {num_ops!r}")
        if style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {style!r}")
        self.style = style
        self.max_operand, self.num_ops = int(max_operand), int(num_ops)
        default_turns = self.num_ops + 3
        super().__init__(tool_parser=tool_parser, max_turns=default_turns if max_turns is None else max_turns,
                         executors=executors, executor_options=executor_options)
        self._plan: tuple[Step, ...] = ()
        self._obtained: set[int] = set()

    # ----------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> Problem:
        for _ in range(MAX_DRAWS):
            operands = tuple(int(x) for x in rng.integers(2, self.max_operand + 1, size=self.num_ops + 1))
            ops = tuple(str(o) for o in rng.choice(list(OPS), size=self.num_ops))
            problem = Problem(operands, ops)
            if problem.split == split:
                return problem
        raise RuntimeError(
            f"no {split!r} problem found in {MAX_DRAWS} draws (max_operand={self.max_operand}, "
            f"num_ops={self.num_ops}); the split may be empty, increase max_operand"
        )

    def _task_id(self, task: Problem) -> str:
        return task.text

    def _start_episode(self, task: Problem) -> list[Message]:
        self._plan, self._obtained = task.plan(), set()
        return [
            {"role": "system", "content": system_prompt(self.style)},
            {"role": "user", "content": word_problem(task) if self.style == "word" else f"Compute {task.text}."},
        ]

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        if parse.status == "malformed":  # the base class tells the model what was wrong
            return TurnOutcome()
        if parse.calls:
            for result in tool_results:
                value = first_int(result.content) if result.ok and result.call.name == "calculator" else None
                if value is not None and result.content.strip() == str(value):
                    self._obtained.add(value)
            return TurnOutcome()
        answer = first_int(action, ANSWER)
        if answer is None:
            return TurnOutcome(messages=({"role": "user", "content": FORMAT_REMINDER},))
        correct = answer == self._task.answer
        return TurnOutcome(reward=1.0 if correct else 0.0, terminated=True, success=correct)

    def _state_key(self) -> tuple[int, ...]:
        return tuple(s.value for s in self._plan if s.value in self._obtained)

    def example_call(self) -> ToolCall:
        """``EXAMPLE_CALL``: a calculator call on two operands."""
        return EXAMPLE_CALL

    # --------------------------------------------------------------- players
    def expert_action(self) -> str:
        """Call the calculator on the next unobtained plan step, or give the answer."""
        self._require_active("expert_action()")
        final = self._plan[-1]
        pending = [s for s in self._plan if s.value not in self._obtained]
        if final.value in self._obtained or not pending:
            return f"Answer: {final.value}"
        return format_call(ToolCall("calculator", {"expression": pending[0].expression}), self.tool_parser)

    def random_action(self, rng: np.random.Generator) -> str:
        """A random answer: a uniform integer between the smallest and largest value any
        operator choice over the task's operands can give (no tool calls)."""
        self._require_active("random_action()")
        low, high = sorted(_value_range(self._task.operands))
        return f"Answer: {int(rng.integers(low, high + 1))}"

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """A weak player: p=0.35 the expert, else a mental answer, exact with p=0.2.

        A wrong mental answer evaluates the problem with one operand off by 1..3.
        Once the final result is known the player answers it.

        Args:
            rng: The player's own generator (the env's ``np_random`` is not touched).
        """
        self._require_active("weak_expert_action()")
        if self._plan[-1].value in self._obtained or rng.random() < WEAK_FOLLOW_PROB:
            return self.expert_action()
        problem: Problem = self._task
        if rng.random() < WEAK_EXACT_PROB:
            return f"Answer: {problem.answer}"
        operands = list(problem.operands)
        i = int(rng.integers(len(operands)))
        operands[i] += int(rng.choice([-3, -2, -1, 1, 2, 3]))
        return f"Answer: {Problem(tuple(operands), problem.ops).answer}"


def _value_range(operands: tuple[int, ...]) -> tuple[int, int]:
    """(min, max) over every assignment of ``+ - *`` to the gaps between ``operands``."""
    values = [Problem(operands, ops).answer for ops in _op_assignments(len(operands) - 1)]
    return min(values), max(values)


def _op_assignments(k: int) -> list[tuple[str, ...]]:
    if k == 0:
        return [()]
    return [(op, *rest) for op in OPS for rest in _op_assignments(k - 1)]

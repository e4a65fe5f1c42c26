"""CalcMath: multi-step arithmetic with the ``calculator`` tool.

Task: ``"Compute {a} {op1} {b} {op2} {c}."`` (``num_ops`` = 1 or 2 operations
from ``+ - *``, integers in ``[2, max_operand]``). The intended solution takes
``num_ops + 1`` turns: one calculator call per operation, in standard
precedence order (``a + b * c`` computes ``b * c`` first), then the answer::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37 * 24"}}
    </tool_call>
    ...
    Answer: 903

Turn rules (rewards are outcome-only):

* malformed tool call -> user message ``"Error: could not parse your tool call: <reason>"``; continue;
* tool calls -> one ``tool`` message per call (result or ``"Error: ..."``); continue;
  ``Answer:`` in such a turn is ignored;
* otherwise the first ``Answer: <int>`` is final: reward 1.0 + success if correct,
  0.0 if wrong; terminated either way;
* neither -> user message ``'Call the calculator tool or reply "Answer: <number>".'``.

Splits: a problem is test iff ``zlib.crc32(problem) % 5 == 0`` (1 bucket of 5);
tasks are drawn by rejection sampling. ``task_id`` = the problem string, e.g.
``"37 + 24 * 5"``. ``state_key`` = the plan's intermediate results obtained from
successful calculator calls so far, in plan order (e.g. ``()``, ``(120,)``,
``(120, 157)``).

Weak player: per turn, p=0.35 the expert's action, else a direct mental answer
(exact with p=0.2, otherwise with one operand off by 1..3, which is always
wrong). Expected success ``f(k) = 0.35 f(k-1) + 0.13``, ``f(0) = 1``: 0.48 for one
op, 0.30 for two. Measured (reset seeds 0..1999, player rng
``default_rng(10_000 + seed)``): num_ops=2 train 0.31, test 0.31; num_ops=1 0.49.
"""

from __future__ import annotations

import json
import operator
import re
import zlib
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.envs.extract import first_int
from turnrl.tools import ParseResult, ToolResult, calculator

OPS = MappingProxyType({"+": operator.add, "-": operator.sub, "*": operator.mul})
TEST_BUCKETS, TEST_BUCKET = 5, 0
ANSWER = re.compile(r"Answer:\s*(-?\d+)")
FORMAT_REMINDER = 'Call the calculator tool or reply "Answer: <number>".'
PARSE_ERROR_PREFIX = "Error: could not parse your tool call: "
WEAK_FOLLOW_PROB, WEAK_EXACT_PROB = 0.35, 0.2
MAX_DRAWS = 10_000


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


def system_prompt() -> str:
    """The system message: the calculator schema and the call/answer formats."""
    call = {"name": "calculator", "arguments": {"expression": "37 * 24"}}
    return (
        "You solve arithmetic with the calculator tool.\n"
        f"Tool: {json.dumps(calculator.schema())}\n"
        f"Call it like this:\n<tool_call>\n{json.dumps(call)}\n</tool_call>\n"
        "Use one call per operation. When you are done, reply: Answer: <number>"
    )


class CalcMathEnv(MultiTurnEnv):
    """Arithmetic word problems solved over several calculator turns.

    Args:
        max_operand: Largest operand (operands are drawn from ``[2, max_operand]``).
        num_ops: Number of operations, 1 or 2.
        max_turns: Turn limit; default ``num_ops + 3``.
        tool_parser: Parser name for the tool-call format.
    """

    tools = (calculator,)

    def __init__(
        self,
        max_operand: int = 99,
        num_ops: int = 2,
        *,
        max_turns: int | None = None,
        tool_parser: str = "hermes",
    ) -> None:
        if not isinstance(max_operand, (int, np.integer)) or max_operand < 2:
            raise ValueError(f"max_operand must be an int >= 2, got {max_operand!r}")
        if num_ops not in (1, 2):
            raise ValueError(f"num_ops must be 1 or 2, got {num_ops!r}")
        self.max_operand, self.num_ops = int(max_operand), int(num_ops)
        default_turns = self.num_ops + 3
        super().__init__(tool_parser=tool_parser, max_turns=default_turns if max_turns is None else max_turns)
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
            {"role": "system", "content": system_prompt()},
            {"role": "user", "content": f"Compute {task.text}."},
        ]

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        if parse.status == "malformed":
            return TurnOutcome(messages=({"role": "user", "content": PARSE_ERROR_PREFIX + str(parse.error)},))
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

    # --------------------------------------------------------------- players
    def expert_action(self) -> str:
        """Call the calculator on the next unobtained plan step, or give the answer."""
        self._require_active("expert_action()")
        final = self._plan[-1]
        pending = [s for s in self._plan if s.value not in self._obtained]
        if final.value in self._obtained or not pending:
            return f"Answer: {final.value}"
        call = {"name": "calculator", "arguments": {"expression": pending[0].expression}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

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

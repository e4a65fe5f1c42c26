"""PythonCoding: write a Python function that passes hidden tests, with a sandboxed ``run_python`` tool.

Description:
    A task is one problem of the bank in ``turnrl.envs.tasks.python_problems`` (48 problems: 24
    families such as sum of digits in base b, fizzbuzz with other divisors and words, run-length
    encoding, gcd, Caesar shift by k, rotations, bracket matching, Roman numerals...). The
    system prompt states the task and the submission format (``run_python`` comes through
    ``info["tools"]`` and the chat template); the user prompt gives the function's signature,
    its statement and three example tests. Model code only
    ever runs in the sandbox executor (bubblewrap by default; any executor that runs
    ``Program``\\ s works, via the ``executors`` kwarg).

Action Space:
    The assistant's text. A turn with tool calls (``run_python(code)``, in the parser's format)
    runs them and judges nothing else. Otherwise the first fenced block tagged ``python`` (or
    ``py``) is a *submission*: it must define the function.

Observation Space:
    * one ``tool`` message per call: ``"Exit code: ...\\nstdout: ..."`` (``RunResult.message``);
    * after a submission that fails an example: ``"Example tests: k of 3 passed."`` and one line
      per example (passed / expected vs got / the exception), or why the code could not be
      loaded, then ``"Fix the function and submit it again in a ```python block."``;
    * after a submission that passes every example: ``"All 3 example tests passed. Hidden
      tests: k of n passed."`` (the episode ends);
    * ``"Error: could not parse your tool call: ..."`` and a well-formed call for a malformed
      call (or a ``run_python`` call in another format than ``tool_parser``'s); a reminder of
      the submission format when the turn has neither a call nor a python block.

Rewards:
    1.0 on the final turn when the accepted submission passes every hidden test (they include
    edge cases the examples do not show); 0.0 otherwise.

Episode End:
    Terminated by the first submission that passes all example tests (success = it passes the
    hidden tests too); truncated after ``max_turns`` turns (default 4).

Splits:
    A problem is held out (``test``) when ``crc32(task_id) % 5 == 2``: 9 of the 48 problems
    (19%); ``train`` holds the other 39. ``task_id`` is the problem id, e.g.
    ``"fizzbuzz[a=3,b=5,wa=Fizz,wb=Buzz]"``. ``state_key`` is ``(submissions so far, pattern of
    the last submission's example results)``, the pattern a string of ``P`` (passed) / ``F``
    (failed or raised) per example, ``"!"`` when the code could not be loaded, ``""`` before any
    submission. ``run_python`` calls do not change it.

Grading:
    Each submission costs one sandbox run: the submission (``solution.py``), a harness
    (``main.py``) and the example + hidden inputs (``cases.json``) in a fresh working dir of
    their own (never the model's ``run_python`` dir, so a submission must be self-contained),
    run under the executor's limits and counted against its ``max_concurrency``. The
    harness prints each returned value as JSON; the env (outside the sandbox) compares it with
    the expected value, so a submission cannot grade itself. A value that is not JSON (a set, an
    object) fails its test; tuples compare equal to lists.

Scripted players:
    ``expert_action`` first runs the reference solution on the first example with
    ``run_python``, then submits the reference solution (2 turns, solves every problem).
    ``random_action`` submits a uniformly drawn wrong program: one of the problem's buggy
    versions or a stub returning a constant. ``weak_expert_action`` submits the reference with
    p=0.2 on its first submission and p=0.3 after a failed one, else one of the problem's buggy
    versions (a subtle bug passes the examples and fails the hidden tests, which ends the
    episode with reward 0). Measured by ``python -m turnrl baselines turnrl/PythonCoding-v0
    --episodes 200`` (test split): random 0.00 (3.0 turns), weak 0.35 (1.8), expert 1.00 (2.0);
    with ``--split train``: random 0.00 (3.0), weak 0.39 (1.9), expert 1.00 (2.0).

Version History:
    v0: initial version.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.envs.tasks.python_problems import Problem, all_problems, call_text
from turnrl.tools import (
    ParseResult,
    Program,
    RunResult,
    Tool,
    ToolCall,
    ToolResult,
    format_call,
    run_python,
    run_sync,
)

__all__ = ["PythonCodingEnv", "grade_program", "extract_submission"]

TEST_BUCKETS, TEST_BUCKET = 5, 2
WEAK_FIRST_PROB, WEAK_RETRY_PROB = 0.2, 0.3
RESULT_MARK = "@@turnrl-result@@"
SUBMISSION = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)
EXAMPLE_CALL = ToolCall("run_python", {"code": "print(sum(range(10)))"})
"""The call the malformed-call feedback (and a renderer's ``tools_prompt()``) shows."""
FORMAT_REMINDER = "Run code with the run_python tool, or submit the complete function in one ```python block."
RETRY = "Fix the function and submit it again in a ```python block."
SHOWN_VALUE = 120
DEFAULT_EXECUTOR_OPTIONS: Mapping[str, Mapping] = {
    "sandbox": {"limits": {"cpu_s": 2.0, "wall_s": 5.0, "memory_mb": 256, "output_bytes": 16_384},
                "pool": "recycle"},
}
"""Sandbox limits of both the model's ``run_python`` calls and the grading runs, and warm
sandboxes, each serving one episode's calls (or one grading run) and then wiped for the next
(``SandboxExecutor`` ``pool``: docs/sandbox.md)."""

HARNESS = """import json, sys
MARK, FUNC = {mark!r}, {func!r}
def report(record):
    sys.stdout.write(MARK + " " + json.dumps(record) + "\\n")
    sys.stdout.flush()
namespace = {{"__name__": "solution"}}
try:
    with open("solution.py") as f:
        exec(compile(f.read(), "solution.py", "exec"), namespace)
    fn = namespace[FUNC]
    if not callable(fn):
        raise TypeError(FUNC + " is not a function")
except BaseException as e:
    if isinstance(e, KeyError):
        e = NameError("the code does not define a function named " + FUNC)
    report({{"load": type(e).__name__ + ": " + str(e)}})
    sys.exit(0)
with open("cases.json") as f:
    cases = json.load(f)
for i, args in enumerate(cases):
    try:
        value = fn(*args)
    except BaseException as e:
        report({{"i": i, "error": (type(e).__name__ + ": " + str(e))[:300]}})
        continue
    try:
        report({{"i": i, "value": json.dumps(value)}})
    except (TypeError, ValueError) as e:
        report({{"i": i, "error": "returned a " + type(value).__name__ + ", which is not a JSON value"}})
"""


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one test: ``passed``, and what went wrong otherwise (``got``, ``error``, or
    ``missing`` when the program reported nothing for it)."""

    passed: bool
    got: str | None = None
    error: str | None = None
    missing: bool = False


@dataclass(frozen=True)
class Grade:
    """The outcome of one submission on the problem's tests.

    Attributes:
        load_error: Why the code could not be loaded (None when it loaded).
        visible: One result per example test.
        hidden: One result per hidden test.
        stopped: The limit sentence when the run was stopped early ("" otherwise).
    """

    load_error: str | None
    visible: tuple[CaseResult, ...]
    hidden: tuple[CaseResult, ...]
    stopped: str = ""

    @property
    def pattern(self) -> str:
        """``P``/``F`` per example, or ``"!"`` when the code did not load."""
        return "!" if self.load_error is not None else "".join("P" if r.passed else "F" for r in self.visible)


def extract_submission(text: str) -> str | None:
    """The code of the first ```python (or ```py) fenced block (trailing newlines dropped), or None."""
    match = SUBMISSION.search(text)
    return match.group(1).rstrip("\n") if match else None


def grade_program(problem: Problem, code: str) -> Program:
    """The sandbox ``Program`` that runs ``code`` on every test input of ``problem``."""
    cases = json.dumps([list(t.args) for t in problem.tests])
    return Program(("python3", "main.py"), {
        "main.py": HARNESS.format(mark=RESULT_MARK, func=problem.func),
        "solution.py": code,
        "cases.json": cases,
    })


def _short(text: str) -> str:
    return text if len(text) <= SHOWN_VALUE else text[: SHOWN_VALUE - 3] + "..."


def judge_output(problem: Problem, stdout: str, stopped: str = "") -> Grade:
    """Compare the harness's reported values with the expected ones (outside the sandbox)."""
    records: dict[int, dict] = {}
    load_error = None
    for line in stdout.splitlines():
        _, mark, rest = line.partition(RESULT_MARK)
        if not mark:
            continue
        try:
            record = json.loads(rest)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if "load" in record:
            load_error = str(record["load"])
        elif isinstance(record.get("i"), int):
            records[record["i"]] = record
    results = []
    for i, test in enumerate(problem.tests):
        record = records.get(i)
        if record is None:
            results.append(CaseResult(False, missing=True))
        elif "error" in record:
            results.append(CaseResult(False, error=str(record["error"])))
        else:
            try:
                got = json.loads(str(record.get("value")))
            except ValueError:
                results.append(CaseResult(False, error="returned a value that could not be read"))
                continue
            expected = json.dumps(test.expected, sort_keys=True)
            results.append(CaseResult(json.dumps(got, sort_keys=True) == expected, got=repr(got)))
    n = len(problem.visible)
    return Grade(load_error, tuple(results[:n]), tuple(results[n:]), stopped)


def system_prompt() -> str:
    """The system message: the task and how to submit (the tool comes through the template)."""
    return (
        "You write Python functions. You may run code in a sandbox with the run_python tool.\n"
        "When you are ready, submit the complete function in one ```python block, with no tool call in "
        "that turn. Each submission is checked on the example tests; the first one that passes them all "
        "is final and is graded on hidden tests."
    )


class PythonCodingEnv(MultiTurnEnv):
    """Write a function from a statement and examples; hidden tests decide the reward.

    Args:
        max_turns: Turn limit (default 4).
        tool_parser: Parser name for the tool-call format.
        executors: Tool name -> executor kind (default: ``run_python`` runs in ``"sandbox"``;
            grading uses the same executor).
        executor_options: Executor kind -> options; default ``DEFAULT_EXECUTOR_OPTIONS``
            (sandbox limits cpu 2 s, wall 5 s, 256 MB; warm sandboxes per episode).
    """

    tools = (run_python,)
    default_max_turns = 4

    def __init__(self, *, max_turns: int | None = None, tool_parser: str = "hermes",
                 executors: Mapping[str, str] | None = None,
                 executor_options: Mapping[str, Mapping] | None = None) -> None:
        options = DEFAULT_EXECUTOR_OPTIONS if executor_options is None else executor_options
        super().__init__(tool_parser=tool_parser, max_turns=max_turns, executors=executors, executor_options=options)
        self._submissions = 0
        self._pattern = ""
        self._ran_code = False
        self._gradings = 0

    @staticmethod
    def split_of(problem: Problem) -> str:
        """``"test"`` for a held-out problem, else ``"train"``."""
        return "test" if zlib.crc32(problem.task_id.encode()) % TEST_BUCKETS == TEST_BUCKET else "train"

    def split_tasks(self, split: str) -> tuple[Problem, ...]:
        """The problems of ``split``, in bank order."""
        return tuple(p for p in all_problems() if self.split_of(p) == split)

    # ----------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> Problem:
        tasks = self.split_tasks(split)
        return tasks[int(rng.integers(len(tasks)))]

    def _task_id(self, task: Problem) -> str:
        return task.task_id

    def _start_episode(self, task: Problem) -> list[Message]:
        self._submissions, self._pattern, self._ran_code = 0, "", False
        examples = "\n".join(f"{call_text(task.func, t.args)} == {t.expected!r}" for t in task.visible)
        user = (f"Write a Python function:\n{task.signature}\n{task.statement}\n"
                f"Examples:\n{examples}")
        return [{"role": "system", "content": system_prompt()}, {"role": "user", "content": user}]

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        if parse.status == "malformed":  # the base class tells the model what was wrong
            return TurnOutcome()
        if parse.calls:
            self._ran_code = self._ran_code or any(r.ok and r.call.name == "run_python" for r in tool_results)
            return TurnOutcome()
        code = extract_submission(action)
        if code is None:
            return TurnOutcome(messages=(_user(FORMAT_REMINDER),))
        grade = self.grade(code)
        self._submissions += 1
        self._pattern = grade.pattern
        if grade.load_error is None and all(r.passed for r in grade.visible):
            passed = sum(r.passed for r in grade.hidden)
            success = passed == len(grade.hidden)
            text = (f"All {len(grade.visible)} example tests passed. "
                    f"Hidden tests: {passed} of {len(grade.hidden)} passed.")
            return TurnOutcome(messages=(_user(text),), reward=float(success), terminated=True, success=success)
        return TurnOutcome(messages=(_user(self._feedback(grade)),))

    def _state_key(self) -> tuple[int, str]:
        return (self._submissions, self._pattern)

    def example_call(self) -> ToolCall:
        """``EXAMPLE_CALL``: run a one-line program."""
        return EXAMPLE_CALL

    # --------------------------------------------------------------- grading
    def grade(self, code: str) -> Grade:
        """Run ``code`` on the problem's tests in a fresh sandbox dir; one sandbox run."""
        self._require_active("grade()")
        problem: Problem = self._task
        program = grade_program(problem, code)
        executor = self.executor_for("run_python")
        self._gradings += 1
        session = f"{self.session}-grade-{self._gradings}"
        try:
            if hasattr(executor, "run"):  # sandbox-like executors expose the raw RunResult
                async def run_in_slot() -> RunResult:
                    async with executor.slot():  # grading counts against max_concurrency too
                        return await executor.run(program, session)

                run = run_sync(run_in_slot())
                return judge_output(problem, run.stdout, run.explanation if run.limit else "")
            grader = Tool("grade", "Run the grading program.", {"type": "object", "properties": {}, "required": []},
                          fn=lambda: program, executor=run_python.executor)
            result = run_sync(executor.arun(grader, ToolCall("grade", {}), session))
            return judge_output(problem, result.content, _short(result.content) if result.error else "")
        finally:
            executor.close_session(session)

    def _feedback(self, grade: Grade) -> str:
        problem: Problem = self._task
        if grade.load_error is not None:
            return f"Your code could not be loaded: {_short(grade.load_error)}\n{RETRY}"
        lines = [f"Example tests: {sum(r.passed for r in grade.visible)} of {len(grade.visible)} passed."]
        for test, r in zip(problem.visible, grade.visible):
            call = call_text(problem.func, test.args)
            if r.passed:
                lines.append(f"{call}: passed")
            elif r.missing:
                lines.append(f"{call}: expected {_short(repr(test.expected))}, no result")
            elif r.error is not None:
                lines.append(f"{call}: expected {_short(repr(test.expected))}, raised {_short(r.error)}")
            else:
                lines.append(f"{call}: expected {_short(repr(test.expected))}, got {_short(str(r.got))}")
        if grade.stopped:
            lines.append(grade.stopped)
        elif any(r.missing for r in grade.visible):
            lines.append("The program ended before reporting every result (did it exit or crash?).")
        lines.append(RETRY)
        return "\n".join(lines)

    # --------------------------------------------------------------- players
    def expert_action(self) -> str:
        """Run the reference solution on the first example with ``run_python``, then submit it."""
        self._require_active("expert_action()")
        problem: Problem = self._task
        if not self._ran_code:
            code = f"{problem.solution}\n\nprint({call_text(problem.func, problem.visible[0].args)})"
            return format_call(ToolCall("run_python", {"code": code}), self.tool_parser)
        return _submit(problem.solution)

    def random_action(self, rng: np.random.Generator) -> str:
        """Submit a uniformly drawn wrong program: a buggy version of the solution or a stub."""
        self._require_active("random_action()")
        problem: Problem = self._task
        stubs = tuple(f"{problem.signature}\n    return {value}" for value in ("None", "0", "''", "[]", "False"))
        choices = problem.obvious_bugs + problem.subtle_bugs + stubs
        return _submit(choices[int(rng.integers(len(choices)))])

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """Submit the reference with p=0.2 (p=0.3 after a failed submission), else a buggy version.

        Args:
            rng: The player's own generator (the env's ``np_random`` is not touched).
        """
        self._require_active("weak_expert_action()")
        problem: Problem = self._task
        bugs = problem.obvious_bugs + problem.subtle_bugs
        p_fix = WEAK_RETRY_PROB if self._submissions else WEAK_FIRST_PROB
        if not bugs or rng.random() < p_fix:
            return _submit(problem.solution)
        return _submit(bugs[int(rng.integers(len(bugs)))])


def _submit(code: str) -> str:
    return f"```python\n{code}\n```"


def _user(content: str) -> Message:
    return {"role": "user", "content": content}

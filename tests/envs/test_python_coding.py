"""PythonCoding-v0: the problem bank, sandboxed grading, the rules of a turn, players and check()."""

import json

import gymnasium
import numpy as np
import pytest

from turnrl.envs import check
from turnrl.envs.tasks.python_coding import RESULT_MARK, PythonCodingEnv, extract_submission
from turnrl.envs.tasks.python_problems import all_problems
from turnrl.tools import ToolCall, format_call
from turnrl.tools.executors import EXECUTORS, Executor, SandboxExecutor, SandboxUnavailable

from tests.helpers import BWRAP_INSTALL, missing_tool

pytestmark = pytest.mark.slow

ENV_ID = "turnrl/PythonCoding-v0"


@pytest.fixture(scope="module")
def env():
    try:
        e = PythonCodingEnv()
    except SandboxUnavailable as exc:  # only where bwrap truly cannot run
        missing_tool(f"bubblewrap sandbox unavailable: {exc}", BWRAP_INSTALL)
    yield e
    e.close()


def reset_to(env, task_id):
    """Reset to the seed whose task is ``task_id``."""
    for split in ("train", "test"):
        for seed in range(500):
            _, info = env.reset(seed=seed, options={"split": split})
            if info["task_id"] == task_id:
                return env.task
    raise AssertionError(f"no seed draws {task_id}")


def submit(code):
    return f"Here is my solution.\n```python\n{code}\n```"


def play_expert(env, seed, split):
    env.reset(seed=seed, options={"split": split})
    rewards, observations = [], []
    while True:
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        rewards.append(reward)
        observations.append(obs)
        if terminated or truncated:
            return rewards, observations, info, terminated


def test_bank_has_many_problems_with_references_and_bugs():
    problems = all_problems()
    assert len(problems) >= 40 and len({p.task_id for p in problems}) == len(problems)
    assert len({p.task_id.split("[")[0] for p in problems}) >= 20
    for p in problems:
        assert len(p.visible) == 3 and len(p.hidden) >= 6
        assert p.obvious_bugs or p.subtle_bugs, p.task_id
        assert p.signature.startswith(f"def {p.func}(")
    assert sum(bool(p.subtle_bugs) for p in problems) >= 40  # most problems have an edge case to miss


def test_splits_are_disjoint_and_cover_the_bank():
    env = PythonCodingEnv.__new__(PythonCodingEnv)  # split_tasks needs no sandbox
    train, test = PythonCodingEnv.split_tasks(env, "train"), PythonCodingEnv.split_tasks(env, "test")
    assert not {p.task_id for p in train} & {p.task_id for p in test}
    assert len(train) + len(test) == len(all_problems())
    assert 0.15 <= len(test) / len(all_problems()) <= 0.25


@pytest.mark.parametrize("split", ["train", "test"])
def test_expert_solves_both_splits_with_one_run_then_a_submission(env, split):
    for seed in range(6):
        rewards, observations, info, terminated = play_expert(env, seed, split)
        assert terminated and info["success"] and rewards == [0.0, 1.0]
        assert observations[0][0]["role"] == "tool" and observations[0][0]["content"].startswith("Exit code: 0")
        assert observations[1][0]["content"].startswith("All 3 example tests passed. Hidden tests: ")
        assert info["split"] == split


def test_same_seed_same_episode(env):
    a = play_expert(env, 7, "train")
    b = play_expert(env, 7, "train")
    assert a[1] == b[1] and a[2]["task_id"] == b[2]["task_id"]
    first = env.reset(seed=7)[0]
    assert env.reset(seed=7)[0] == first


def test_prompt_shows_signature_statement_and_examples(env):
    problem = reset_to(env, "gcd")
    system, user = env._start_episode(problem)
    assert "run_python" in system["content"] and "```python block" in system["content"]
    assert "<tool_call>" not in system["content"]  # the tool comes through info["tools"]
    prompt = user["content"]
    assert "def gcd(a: int, b: int) -> int:" in prompt and "greatest common divisor" in prompt
    for t in problem.visible:
        assert f"gcd({t.args[0]}, {t.args[1]}) == {t.expected}" in prompt


def test_obvious_bug_gets_feedback_then_fix_succeeds(env):
    problem = reset_to(env, "fib_mod[k=10]")
    obs, reward, terminated, truncated, info = env.step(submit(problem.obvious_bugs[0]))
    text = obs[0]["content"]
    assert not terminated and reward == 0.0
    assert text.startswith("Example tests: ") and "expected" in text and text.endswith("```python block.")
    assert info["state_key"][0] == 1 and "F" in info["state_key"][1]
    obs, reward, terminated, _, info = env.step(submit(problem.solution))
    assert terminated and reward == 1.0 and info["success"] and info["state_key"] == (2, "PPP")


def test_subtle_bug_passes_examples_and_fails_hidden_tests(env):
    problem = reset_to(env, "gcd")
    obs, reward, terminated, _, info = env.step(submit(problem.subtle_bugs[0]))
    assert terminated and reward == 0.0 and not info["success"]
    passed, total = obs[0]["content"].removeprefix("All 3 example tests passed. Hidden tests: ").split(" passed")[0].split(" of ")
    assert int(passed) < int(total) == len(problem.hidden)
    assert info["state_key"] == (1, "PPP")


def test_values_compare_as_json_types(env):
    reset_to(env, "is_prime")
    obs, *_ = env.step(submit("def is_prime(n):\n    return int(n in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29))"))
    assert "expected False, got 0" in obs[0]["content"] or "expected True, got 1" in obs[0]["content"]
    problem = reset_to(env, "rotate[dir=left]")
    tuple_version = problem.solution.replace("return xs[k:] + xs[:k]", "return tuple(xs[k:] + xs[:k])")
    assert tuple_version != problem.solution
    obs, reward, terminated, *_ = env.step(submit(tuple_version))  # a tuple equals its list
    assert terminated and reward == 1.0
    reset_to(env, "dedupe")
    obs, *_ = env.step(submit("def dedupe(xs):\n    return set(xs)"))
    assert "not a JSON value" in obs[0]["content"]


def test_a_submission_cannot_grade_itself(env):
    reset_to(env, "gcd")
    always_equal = "class Yes:\n    def __eq__(self, other):\n        return True\ndef gcd(a, b):\n    return Yes()"
    obs, reward, terminated, *_ = env.step(submit(always_equal))
    assert reward == 0.0 and not terminated and "not a JSON value" in obs[0]["content"]
    forged = ("import json, sys\n"
              f"for i in range(40):\n    print({RESULT_MARK!r}, json.dumps({{'i': i, 'value': '1'}}))\n"
              "sys.stdout.flush()\nimport os\nos._exit(0)\n")
    obs, reward, terminated, *_ = env.step(submit(forged))
    assert reward == 0.0 and not terminated  # forged values are still compared with the expected ones


@pytest.mark.parametrize("code, expected", [
    ("def broken(:\n    pass", "could not be loaded: SyntaxError"),
    ("def something_else():\n    return 1", "could not be loaded: NameError: the code does not define a function named gcd"),
    ("def gcd(a, b):\n    while True:\n        pass", "CPU time (limit cpu_s=2.0)"),
    ("def gcd(a, b):\n    raise ValueError('nope')", "raised ValueError: nope"),
    ("import sys\nsys.exit(3)", "could not be loaded: SystemExit: 3"),
    ("def gcd(a, b):\n    print('x' * 100000)\n    return 1", "no result"),
])
def test_bad_submissions_get_a_helpful_message(env, code, expected):
    reset_to(env, "gcd")
    obs, reward, terminated, truncated, info = env.step(submit(code))
    assert expected in obs[0]["content"] and reward == 0.0 and not terminated
    assert info["state_key"][0] == 1


def test_turn_rules_tool_calls_reminders_and_truncation(env):
    reset_to(env, "gcd")
    call = format_call(ToolCall("run_python", {"code": "print(6 * 7)"}), "hermes")
    obs, reward, terminated, truncated, info = env.step(call + "\n" + submit("def gcd(a, b):\n    return 0"))
    assert [m["content"] for m in obs] == ["Exit code: 0\nstdout:\n42"]  # a call turn submits nothing
    assert info["state_key"] == (0, "") and info["tool_calls"] == 1
    obs, *_, info = env.step("I think the answer is Euclid.")
    assert "```python block" in obs[0]["content"] and info["state_key"] == (0, "")
    obs, *_, info = env.step('<tool_call>\n{"name": "run_python", "arguments": {"code": 1}}\n</tool_call>')
    assert obs[0]["content"].startswith("Error: bad arguments") and info["tool_errors"] == 1
    obs, reward, terminated, truncated, info = env.step(submit("def gcd(a, b):\n    return 0"))
    assert truncated and not terminated and reward == 0.0 and not info["success"]


def test_unicode_output_reaches_the_model_unchanged(env):
    """Code and its output are any text: CJK, accents, emoji, \\r and tabs pass through as printed;
    a NUL the program prints is shown escaped."""
    reset_to(env, "gcd")
    text = "中文 — café 😀\r\tend"
    code = f"print({text!r}, end='')\nprint('\\x00', end='')"
    obs, *_, info = env.step(format_call(ToolCall("run_python", {"code": code}), "hermes"))
    assert obs[0]["content"] == f"Exit code: 0\nstdout:\n{text}\\x00" and info["tool_errors"] == 0
    assert obs in env.observation_space


def test_grading_runs_apart_from_the_models_working_dir(env):
    problem = reset_to(env, "gcd")
    helper = "open('helper.py', 'w').write(" + json.dumps(problem.solution) + ")\nprint('saved')"
    obs, *_ = env.step(format_call(ToolCall("run_python", {"code": helper}), "hermes"))
    assert "saved" in obs[0]["content"]
    obs, *_ = env.step(submit("from helper import gcd"))
    assert "could not be loaded: ModuleNotFoundError" in obs[0]["content"]
    obs, *_ = env.step(format_call(ToolCall("run_python", {"code": "import os\nprint(sorted(os.listdir('.')))"}), "hermes"))
    assert "['helper.py', 'main.py']" in obs[0]["content"]  # no grading files leaked into the model's dir


def test_state_key_is_equal_for_equal_states(env):
    keys = []
    for _ in range(2):
        problem = reset_to(env, "caesar[k=3]")
        env.step(format_call(ToolCall("run_python", {"code": "print(1)"}), "hermes"))
        *_, info = env.step(submit(problem.obvious_bugs[0]))
        keys.append(info["state_key"])
    assert keys[0] == keys[1] and keys[0][0] == 1 and len(keys[0][1]) == 3
    hash(keys[0])


def test_players(env):
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    action = env.random_action(rng)
    assert extract_submission(action) is not None
    problem = env.task
    assert extract_submission(action) in problem.obvious_bugs + problem.subtle_bugs + tuple(
        f"{problem.signature}\n    return {v}" for v in ("None", "0", "''", "[]", "False"))
    weak = {extract_submission(env.weak_expert_action(np.random.default_rng(s))) for s in range(40)}
    assert problem.solution in weak and len(weak) > 1


def test_check_passes():
    try:
        PythonCodingEnv()
    except SandboxUnavailable as e:
        missing_tool(f"bubblewrap sandbox unavailable: {e}", BWRAP_INSTALL)
    report = check(ENV_ID, seeds=8)
    assert report.ok, report.format()
    assert gymnasium.make(ENV_ID).unwrapped.executor_for("run_python").kind == "sandbox"


class SandboxThroughArun(Executor):
    """The real sandbox seen only through ``arun`` (as the docker and remote executors are), so
    grading reads the results from the tool message instead of a ``RunResult``."""

    kind = "sandbox_through_arun"

    def __init__(self, **options):
        super().__init__()
        self.inner = SandboxExecutor(**options)

    async def arun(self, tool, call, session):
        return await self.inner.arun(tool, call, session)

    def close_session(self, session):
        self.inner.close_session(session)


if SandboxThroughArun.kind not in EXECUTORS:
    EXECUTORS.register(SandboxThroughArun.kind)(SandboxThroughArun)


def test_grading_through_an_executor_without_run(env):
    other = PythonCodingEnv(executors={"run_python": SandboxThroughArun.kind},
                            executor_options={SandboxThroughArun.kind: {"limits": {"cpu_s": 1, "wall_s": 3}}})
    assert not hasattr(other.executor_for("run_python"), "run")
    rewards, _, info, terminated = play_expert(other, 0, "test")
    assert terminated and info["success"] and rewards == [0.0, 1.0]
    problem = reset_to(other, "gcd")
    obs, *_ = other.step(submit(problem.obvious_bugs[0]))
    assert obs[0]["content"].startswith("Example tests: ") and "expected" in obs[0]["content"]
    obs, *_ = other.step(submit("def gcd(a, b):\n    while True:\n        pass"))
    assert "no result" in obs[0]["content"] and "CPU time (limit cpu_s=1)" in obs[0]["content"]
    other.close()

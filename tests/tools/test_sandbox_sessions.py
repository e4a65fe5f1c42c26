"""Sandbox sessions, exit codes, stdin and the env wiring of a code tool (real bwrap), in every
mode of the executor (``pool``: off, call, episode, recycle)."""

import asyncio
import uuid

import pytest

from turnrl.envs.base import MultiTurnEnv, TurnOutcome
from turnrl.tools import Program, ToolCall, ToolUnavailableError, run_python, run_shell, run_sync, tool
from turnrl.tools.executors import SandboxExecutor, SandboxUnavailable, get_executor
from turnrl.tools.executors.sandbox.executor import HEADER_DIGITS, complete_pack

from tests.helpers import BWRAP_INSTALL, missing_tool

pytestmark = pytest.mark.slow

LIMITS = {"cpu_s": 1, "wall_s": 2, "memory_mb": 256}
MODES = ("off", "call", "episode", "recycle")


@pytest.fixture(scope="module", params=MODES)
def sandbox(request):
    try:
        ex = SandboxExecutor(LIMITS, pool=request.param, pool_size=2)
    except SandboxUnavailable as e:
        missing_tool(f"bubblewrap sandbox unavailable: {e}", BWRAP_INSTALL)
    yield ex
    ex.close()


def py(ex, code, session):
    return run_sync(ex.arun(run_python, ToolCall("run_python", {"code": code}), session))


def test_files_persist_within_a_session_not_across(sandbox):
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    py(sandbox, "open('notes.txt', 'w').write('kept')", a)
    assert "stdout:\nkept" in py(sandbox, "print(open('notes.txt').read())", a).content
    assert "FileNotFoundError" in py(sandbox, "print(open('notes.txt').read())", b).content
    state = sandbox.session_file(a)
    assert state.exists() and b"kept" in state.read_bytes()
    sandbox.close_session(a)
    assert not state.exists()
    assert "FileNotFoundError" in py(sandbox, "print(open('notes.txt').read())", a).content
    for session in (a, b):
        sandbox.close_session(session)


def test_overlapping_calls_of_one_session_start_from_the_last_finished_files(sandbox):
    session = uuid.uuid4().hex
    py(sandbox, "open('n.txt', 'w').write('0')", session)
    bump = "import time\nn = int(open('n.txt').read())\ntime.sleep({})\nopen('n.txt', 'w').write(str(n + 1))\nprint(n)"

    async def both():
        # the fast call holds its files 0.5 s before writing them back, so a slow call whose
        # sandbox starts late on a loaded machine (pool="call": one start per call) still
        # starts before it finishes (CI once saw it start after a 0 s call had finished)
        return await asyncio.gather(sandbox.arun(run_python, ToolCall("run_python", {"code": bump.format(1.5)}), session),
                                    sandbox.arun(run_python, ToolCall("run_python", {"code": bump.format(0.5)}), session))

    slow, fast = run_sync(both())
    assert slow.content.endswith("stdout:\n0") and fast.content.endswith("stdout:\n0")  # both saw the same files
    assert py(sandbox, "print(open('n.txt').read())", session).content.endswith("stdout:\n1")  # the last to finish won
    sandbox.close_session(session)


def test_exit_codes_stdin_and_extra_files(sandbox):
    r = py(sandbox, "import sys\nprint('bye', file=sys.stderr)\nsys.exit(3)", "s")
    assert r.error is None and r.content == "Exit code: 3\nstdout: (empty)\nstderr:\nbye"
    r = run_sync(sandbox.run(Program(("python3", "pkg/calc.py"), {"pkg/calc.py": "print(int(input()) * 2)"}, "21\n"), "s"))
    assert (r.exit_code, r.stdout, r.limit) == (0, "42\n", None)
    r = run_sync(sandbox.run(Program(("no-such-binary",)), "s"))
    assert r.exit_code == 127 and "cannot run 'no-such-binary'" in r.stderr
    r = run_sync(sandbox.arun(run_shell, ToolCall("run_shell", {"command": "echo $((6*7)); yes | head -2"}), "s"))
    assert r.content == "Exit code: 0\nstdout:\n42\ny\ny"


def test_a_call_whose_files_cannot_be_written_keeps_the_sessions_files(sandbox):
    """The launcher stops before the program runs (a program file where the session has a
    directory): the call fails saying why, and the session's files are those it had."""
    session = uuid.uuid4().hex
    py(sandbox, "import os\nos.mkdir('d')\nopen('keep.txt', 'w').write('hi')", session)
    r = run_sync(sandbox.run(Program(("python3", "-c", "print(1)"), {"d": "x"}), session))
    assert r.exit_code == 1 and "cannot write the program's files" in r.stderr and "Is a directory" in r.stderr
    assert py(sandbox, "print(open('keep.txt').read())", session).content.endswith("stdout:\nhi")
    sandbox.close_session(session)


def test_only_a_whole_cold_pack_is_saved():
    record = b"%016d" % 5 + b"abcde"
    end = b"0" * HEADER_DIGITS
    assert complete_pack(record + record + end) == record + record
    assert complete_pack(end) == b""  # no files
    for cut in (b"", record, record + end[:-1], record[:-2] + end, (record + end)[:9], b"x" * 16 + end):
        assert complete_pack(cut) is None, cut


def test_missing_bwrap_is_a_clear_error():
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        SandboxExecutor(bwrap="no-such-bwrap")


def test_sandbox_refuses_plain_tools(sandbox):
    @tool
    def plain(x: int) -> int:
        """Not a code tool.

        Args:
            x: A number.
        """
        return x

    r = run_sync(sandbox.arun(plain, ToolCall("plain", {"x": 1}), "s"))
    assert r.error == "unavailable" and "not a code tool" in r.content  # the env's setup, not the model's call


class Coder(MultiTurnEnv):
    """A one-turn env with the run_python tool."""

    tools = (run_python,)
    default_max_turns = 1

    def _new_task(self, rng, split):
        return 0

    def _task_id(self, task):
        return "t"

    def _start_episode(self, task):
        return [{"role": "user", "content": "run code"}]

    def _on_turn(self, action, parse, tool_results):
        return TurnOutcome(terminated=True, success=bool(tool_results) and tool_results[0].ok)

    def _state_key(self):
        return 0

    def expert_action(self):
        return '<tool_call>\n{"name": "run_python", "arguments": {"code": "open(\'f\', \'a\').write(\'x\')\\nprint(open(\'f\').read())"}}\n</tool_call>'


@pytest.mark.parametrize("mode", MODES)
def test_env_sessions_are_per_episode_and_closed_on_reset(mode):
    try:
        env = Coder(executor_options={"sandbox": {"limits": LIMITS, "pool": mode}})
    except SandboxUnavailable as e:
        missing_tool(f"bubblewrap sandbox unavailable: {e}", BWRAP_INSTALL)
    assert env.executor_for("run_python") is get_executor("sandbox", limits=LIMITS, pool=mode)
    env.reset(seed=0)
    obs, *_ , info = env.step(env.expert_action())
    assert obs[0]["content"] == "Exit code: 0\nstdout:\nx" and info["tool_errors"] == 0
    first_state = env.executor_for("run_python").session_file(env.session)
    env.reset(seed=0)  # a new episode: a new, empty working dir
    assert not first_state.exists()
    obs, *_ = env.step(env.expert_action())
    assert obs[0]["content"] == "Exit code: 0\nstdout:\nx"
    env.close()
    # an override sends the code tool in-process, which refuses it: the env's setup, not the model's call
    env = Coder(executors={"run_python": "inprocess"})
    env.reset(seed=0)
    with pytest.raises(ToolUnavailableError, match="cannot run in-process"):
        env.step(env.expert_action())

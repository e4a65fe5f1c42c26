"""The sandbox's launcher (pid 1, cold or warm) outlives what a program does to it: a SIGINT sent
to pid 1, a directory tree deeper than Python's recursion limit. Each call gives the program's
own result, and the session's files, old and new, are there for the next call. Real bwrap, in
every mode of the executor."""

import uuid

import pytest

from turnrl.tools import ToolCall, run_python, run_shell, run_sync
from turnrl.tools.executors import Limits, SandboxExecutor, SandboxUnavailable

from tests.helpers import BWRAP_INSTALL, missing_tool

pytestmark = pytest.mark.slow

LIMITS = Limits(cpu_s=2, wall_s=5, memory_mb=256, output_bytes=4096, max_procs=32, file_mb=4)
MODES = ("off", "call", "episode", "recycle")


@pytest.fixture(scope="module", params=MODES)
def sandbox(request):
    try:
        ex = SandboxExecutor(LIMITS, pool=request.param, pool_size=1)
    except SandboxUnavailable as e:
        missing_tool(f"bubblewrap sandbox unavailable: {e}", BWRAP_INSTALL)
    yield ex
    ex.close()


def py(ex, code, session):
    return run_sync(ex.arun(run_python, ToolCall("run_python", {"code": code}), session))


def sh(ex, command, session):
    return run_sync(ex.arun(run_shell, ToolCall("run_shell", {"command": command}), session))


@pytest.fixture
def session(sandbox):
    """A session that already holds a file, ``kept.txt``; closed after the test."""
    name = uuid.uuid4().hex
    assert py(sandbox, "open('kept.txt', 'w').write('kept')", name).error is None
    yield name
    sandbox.close_session(name)


def test_sigint_to_pid_1_is_ignored(sandbox, session):
    r = py(sandbox, "import os, signal\nopen('new.txt', 'w').write('new')\nos.kill(1, signal.SIGINT)\n"
                    "import time; time.sleep(0.2)\nprint('after')", session)
    assert (r.error, r.content) == (None, "Exit code: 0\nstdout:\nafter")
    r = sh(sandbox, "kill -INT 1; sleep 0.2; echo shell; exit 3", session)
    assert (r.error, r.content) == (None, "Exit code: 3\nstdout:\nshell")
    r = py(sandbox, "print(open('kept.txt').read(), open('new.txt').read())", session)
    assert r.content == "Exit code: 0\nstdout:\nkept new"


def test_a_tree_deeper_than_the_recursion_limit_is_kept(sandbox, session):
    r = py(sandbox, "import os\np = 'd'\nfor _ in range(1500):\n    p += '/d'\n    os.mkdir(p) if os.path.isdir(p[:-2]) "
                    "else os.makedirs(p)\nopen(p + '/leaf.txt', 'w').write('deep')\nprint('made')", session)
    assert (r.error, r.content) == (None, "Exit code: 0\nstdout:\nmade")
    r = py(sandbox, "print(open('/'.join(['d'] * 1501) + '/leaf.txt').read(), open('kept.txt').read())", session)
    assert r.content == "Exit code: 0\nstdout:\ndeep kept"
    r = sh(sandbox, "rm -r d && ls -d */ 2>/dev/null; cat kept.txt", session)  # (python 3.11's shutil.rmtree recurses too deep for it)
    assert r.content == "Exit code: 0\nstdout:\nkept"


def test_a_program_that_kills_itself_at_once_is_told_the_signal_not_a_cpu_limit(sandbox, session):
    """A SIGKILL the executor did not send is the hard CPU limit only when the run lasted long
    enough to use ``cpu_s`` of CPU; a program that SIGKILLs itself at once hears the signal."""
    for r in (py(sandbox, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", session),
              sh(sandbox, "echo before; kill -9 $$", session)):
        assert "more than 2 s of CPU time" not in r.content, r.content
        assert "killed by signal SIGKILL" in r.content, r.content


def test_a_cpu_burn_is_still_reported_as_the_cpu_limit(sandbox, session):
    r = py(sandbox, "while True:\n    pass", session)
    assert "more than 2 s of CPU time (limit cpu_s=2)" in r.content, r.content

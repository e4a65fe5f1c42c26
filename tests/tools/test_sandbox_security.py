"""Attacks on the bubblewrap sandbox: each is contained, reported in the message, and the same
executor runs a normal call right after. Real bwrap, real processes, small limits."""

import os
import socket
import time
import uuid
from pathlib import Path

import pytest

import turnrl
from turnrl.tools import ToolCall, run_python, run_shell, run_sync
from turnrl.tools.executors import Limits, SandboxExecutor, SandboxUnavailable

LIMITS = Limits(cpu_s=1, wall_s=2, memory_mb=256, output_bytes=4096, max_procs=32, file_mb=4)
PROJECT_FILE = str(Path(turnrl.__file__).resolve())


@pytest.fixture(scope="module")
def sandbox():
    try:
        ex = SandboxExecutor(LIMITS, timeout_s=20)
    except SandboxUnavailable as e:  # only where bwrap truly cannot run
        pytest.skip(f"bubblewrap sandbox unavailable: {e}")
    yield ex
    ex.close()


def run(ex, code=None, shell=None, session=None):
    session = session or uuid.uuid4().hex
    if shell is not None:
        return run_sync(ex.arun(run_shell, ToolCall("run_shell", {"command": shell}), session))
    return run_sync(ex.arun(run_python, ToolCall("run_python", {"code": code}), session))


def still_works(ex):
    r = run(ex, "print(6 * 7)")
    assert (r.error, r.content) == (None, "Exit code: 0\nstdout:\n42")


def test_infinite_loop_hits_cpu_limit(sandbox):
    r = run(sandbox, "while True: pass")
    assert r.error == "limit"
    assert "Exit code: killed" in r.content and "CPU time (limit cpu_s=1)" in r.content
    still_works(sandbox)


def test_sleeping_forever_hits_wall_limit(sandbox):
    r = run(sandbox, "import time\nwhile True: time.sleep(0.1)")
    assert r.error == "limit" and "ran longer than 2 s (limit wall_s=2)" in r.content
    still_works(sandbox)


def test_python_fork_bomb_hits_procs_limit(sandbox):
    r = run(sandbox, "import os\nwhile True: os.fork()")
    assert r.error == "limit" and "limit max_procs=32" in r.content
    still_works(sandbox)


def test_bash_fork_bomb_hits_procs_limit(sandbox):
    # The bare bomb returns at once and its processes die with the sandbox's pid namespace;
    # the shell that waits a moment lets the bomb reach the process limit first.
    r = run(sandbox, shell=":(){ :|:& };:")
    assert r.error in (None, "limit") and r.content.startswith("Exit code: ")
    r = run(sandbox, shell=":(){ :|:& };: ; sleep 1")
    assert r.error == "limit" and "limit max_procs=32" in r.content
    still_works(sandbox)


def test_memory_bomb_hits_memory_limit(sandbox):
    r = run(sandbox, "chunks = []\nwhile True: chunks.append(bytearray(10 ** 7))")
    assert r.error == "limit" and "out of memory (limit memory_mb=256)" in r.content
    still_works(sandbox)


def test_huge_output_is_cut_and_reported(sandbox):
    t = time.monotonic()
    r = run(sandbox, "while True: print('spam' * 100)")
    assert time.monotonic() - t < 1.5  # stopped at the cap, not by the 2 s wall clock
    assert r.error == "limit" and "output is truncated (limit output_bytes=4096)" in r.content
    assert "spam" in r.content and len(r.content) < 6000
    still_works(sandbox)


def test_huge_file_hits_file_limit(sandbox):
    r = run(sandbox, "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (8 << 20))")
    assert r.error == "limit" and "larger than 4 MB (limit file_mb=4)" in r.content
    r = run(sandbox, shell="head -c 8000000 /dev/zero > big.bin")
    assert r.error == "limit" and "limit file_mb=4" in r.content
    still_works(sandbox)


@pytest.mark.parametrize("target", ["/usr/evil.txt", "/etc/evil.txt", "/evil.txt", os.path.dirname(PROJECT_FILE) + "/evil.py"])
def test_writing_outside_the_working_dir_fails(sandbox, target):
    r = run(sandbox, f"open({target!r}, 'w').write('pwned')\nprint('wrote')")
    assert r.error is None and "Exit code: 1" in r.content
    assert ("Read-only file system" in r.content or "No such file or directory" in r.content
            or "Permission denied" in r.content)
    assert not os.path.exists(target) or "evil" not in open(target).read()
    still_works(sandbox)


@pytest.mark.parametrize("target", ["/etc/shadow", "/etc/passwd", "/root", PROJECT_FILE,
                                    os.path.join(os.path.dirname(os.path.dirname(PROJECT_FILE)), ".venv")])
def test_host_files_are_not_visible(sandbox, target):
    assert os.path.exists(target) or target.endswith((".venv", "/root", "passwd", "shadow"))
    r = run(sandbox, f"import os\nprint(os.path.exists({target!r}))\nprint(open({target!r}).read()[:50])")
    assert "stdout:\nFalse" in r.content
    assert "No such file or directory" in r.content
    still_works(sandbox)


def test_links_planted_by_one_call_do_not_redirect_the_next_write(sandbox, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("safe")
    session = uuid.uuid4().hex
    run(sandbox, f"import os\nos.remove('main.py')\nos.symlink({str(victim)!r}, 'main.py')", session=session)
    r = run(sandbox, "print('second')", session=session)
    assert "second" in r.content and victim.read_text() == "safe"


def test_no_network_outside_or_to_host_loopback(sandbox):
    with socket.socket() as server:  # a real host service the sandbox must not reach
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"for host, port in (('1.1.1.1', 53), ('127.0.0.1', {port})):\n"
            "    try:\n"
            "        socket.create_connection((host, port), timeout=1).close()\n"
            "        print('connected', host)\n"
            "    except OSError as e:\n"
            "        print('blocked', host, e.errno)\n"
        )
        r = run(sandbox, code)
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()
    assert "blocked 1.1.1.1" in r.content and "blocked 127.0.0.1" in r.content
    assert "connected" not in r.content
    still_works(sandbox)


def test_sandbox_runs_as_unprivileged_user_with_a_clean_environment(sandbox):
    r = run(sandbox, "import os, sys\nprint(os.getcwd(), os.environ['HOME'], sys.executable)\n"
                     "print(sorted(k for k in os.environ if k not in ('PATH', 'HOME', 'LANG', 'PYTHONDONTWRITEBYTECODE', 'PWD')))\n"
                     "print(os.getuid() != 0)")
    assert "/work /work /usr/bin/python3" in r.content
    assert "[]\nTrue" in r.content

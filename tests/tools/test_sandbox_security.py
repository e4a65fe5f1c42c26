"""Attacks on the bubblewrap sandbox: each is contained, reported in the message, and the same
executor runs a normal call right after. Real bwrap, real processes, small limits. Every attack
runs in every mode of the executor (``pool``: a cold sandbox per call, warm ones per call, warm
ones per episode, and warm ones recycled: each attack runs in its own session, closed after it,
so in that mode the next call runs in the sandbox the attack left, wiped).

Under CI (``CI=true``) a missing bubblewrap fails these tests instead of skipping them."""

import os
import re
import socket
import time
import uuid
from pathlib import Path

import pytest

import turnrl
from turnrl.tools import ToolCall, run_python, run_shell, run_sync
from turnrl.tools.executors import Limits, SandboxExecutor, SandboxUnavailable

from tests.helpers import BWRAP_INSTALL, descendants, missing_tool

pytestmark = pytest.mark.slow

LIMITS = Limits(cpu_s=1, wall_s=2, memory_mb=256, output_bytes=4096, max_procs=32, file_mb=4)
PROJECT_FILE = str(Path(turnrl.__file__).resolve())
MODES = ("off", "call", "episode", "recycle")


def sandbox_executor(limits, **options):
    """A ``SandboxExecutor``, or a skip (a failure under CI) where bwrap truly cannot run."""
    try:
        return SandboxExecutor(limits, pool_size=2, **options)
    except SandboxUnavailable as e:
        missing_tool(f"bubblewrap sandbox unavailable: {e}", BWRAP_INSTALL)


@pytest.fixture(scope="module", params=MODES)
def sandbox(request):
    ex = sandbox_executor(LIMITS, timeout_s=20, pool=request.param)
    yield ex
    ex.close()


def run(ex, code=None, shell=None, session=None):
    """One call; without ``session`` in a new session, closed after it (a finished episode)."""
    name = session or uuid.uuid4().hex
    try:
        if shell is not None:
            return run_sync(ex.arun(run_shell, ToolCall("run_shell", {"command": shell}), name))
        return run_sync(ex.arun(run_python, ToolCall("run_python", {"code": code}), name))
    finally:
        if session is None:
            ex.close_session(name)


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
    sandbox.close_session(session)
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


# ------------------------------------------------------------------ what the host leaks in
ALL_ENVIRONS = (
    "import os\n"
    "seen = {}\n"
    "for pid in os.listdir('/proc'):\n"
    "    if pid.isdigit() or pid in ('self', 'thread-self'):\n"
    "        try:\n"
    "            seen[pid] = open(f'/proc/{pid}/environ', 'rb').read()\n"
    "        except OSError:\n"
    "            pass\n"
    "print(len(seen), 'readable')\n"
    "print(b'\\n'.join(seen.values()).decode(errors='replace'))\n"
    "print(dict(os.environ))\n"
)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.mark.parametrize("mode", MODES)
def test_host_environment_reaches_no_process_inside(monkeypatch, mode):
    """bwrap itself (pid 1 inside without --as-pid-1) used to carry the parent's environment."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-turnrl-test-secret-4242")
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/libgomp-preloaded.so")  # what importing vLLM sets
    before = descendants()
    ex = sandbox_executor(LIMITS, timeout_s=20, pool=mode)  # started with the secret in the environment
    try:
        r = run(ex, ALL_ENVIRONS)
        assert r.error is None and "readable" in r.content
        # pid 1 and the program at least; a warm sandbox's pid 1 (its server) lets no program read it
        assert int(r.content.split("stdout:\n")[1].split()[0]) >= (2 if mode == "off" else 1)
        assert "sk-turnrl-test-secret" not in r.content and "OPENAI_API_KEY" not in r.content
        assert "LD_PRELOAD" not in r.content and "preloaded" not in r.content
        assert "stderr" not in r.content  # no "ld.so: object ... cannot be preloaded"
        r = run(ex, shell="echo ok; cat /proc/1/environ | tr '\\0' '\\n'")
        assert r.error is None and "ok" in r.content and "sk-turnrl" not in r.content
        assert "stderr" not in r.content if mode == "off" else "Permission denied" in r.content
        # every bwrap process this test's executor started and everything under it, read from the host
        # (not other children of the test process: a multiprocessing helper left by an earlier test
        # carries the host's environment, as host processes do)
        bwraps = [pid for pid in descendants() - before if _comm(pid) == "bwrap"]
        assert bwraps or mode == "off"  # warm sandboxes stay up between calls
        for pid in {p for b in bwraps for p in descendants(b) | {b}}:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            assert b"sk-turnrl" not in environ and b"LD_PRELOAD" not in environ, pid
    finally:
        ex.close()


def test_no_host_path_is_visible_inside(sandbox):
    r = run(sandbox, "import os\nprint(open('/proc/self/mountinfo').read())\nprint(os.getcwd(), os.environ.get('PWD'))\n"
                     "print(open('/proc/1/environ', 'rb').read())")
    assert r.error is None and " /work " in r.content
    for host_path in (sandbox._root, os.getcwd(), str(Path(turnrl.__file__).parents[1])):
        # the path itself, not a longer name it begins (a checkout at /work/main and the
        # sandbox's own /work/main.py)
        assert not re.search(re.escape(host_path) + r"(?![\w.-])", r.content), host_path
    assert "/tmp/" not in r.content and "turnrl-sandbox" not in r.content


# ----------------------------------------------------- memory: the run as a whole is bounded
FORKED_HOGS = """
import os, time
r, w = os.pipe()
kids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            block = bytearray(b"x") * (200 << 20)   # 200 MiB, every page written
            os.write(w, b"1")
            time.sleep(1.5)                          # held while the others try
        except MemoryError:
            os.write(w, b"0")
        os._exit(0)
    kids.append(pid)
os.close(w)
for pid in kids:
    os.waitpid(pid, 0)
got = b""
while chunk := os.read(r, 16):
    got += chunk
print("children that held 200 MiB:", got.count(b"1"))
"""

TMPFS_FILL = """
import os, sys
total = 0
try:
    for i in range(1024):
        with open(f"{sys.argv[1]}/f{i}", "wb") as f:
            for _ in range(4):
                f.write(b"x" * (1 << 20))
                total += 1 << 20
except OSError as e:
    print("stopped:", e.strerror)
print("MiB written:", total >> 20)
"""


def memory_sandbox(memory, pool="off"):
    """256 MiB in all. With a cgroup, /tmp and /dev/shm may each hold 1 GiB by size, so only the
    budget stops them; without one, their sizes must fit the budget (else it is refused)."""
    file_mb = 16 if memory == "rlimit" else 1024
    limits = Limits(cpu_s=10, wall_s=15, memory_mb=256, output_bytes=4096, max_procs=32, file_mb=file_mb)
    return sandbox_executor(limits, timeout_s=30, workdir_mb=16, memory=memory, pool=pool)


def written_mib(result) -> int:
    if "MiB written:" not in result.content:  # killed before printing: by the budget itself
        assert result.error == "limit" and "out of memory (limit memory_mb=256)" in result.content, result.content
        return 0
    return int(result.content.split("MiB written:")[1].split()[0])


@pytest.fixture(scope="module", params=[(memory, mode) for memory in ("auto", "rlimit") for mode in MODES],
                ids=lambda p: "-".join(p))
def memory_box(request):
    ex = memory_sandbox(*request.param)
    yield ex
    ex.close()


def test_memory_budget_holds_for_all_processes_together(memory_box):
    """Four children of 200 MiB each reached 834 MiB of host memory under a per-process limit."""
    r = run(memory_box, FORKED_HOGS)
    if "children that held" in r.content:
        assert int(r.content.split("children that held 200 MiB:")[1].split()[0]) <= 1, r.content
    else:  # the budget killed the program itself
        assert r.error == "limit" and "out of memory" in r.content, r.content
    still_works(memory_box)


@pytest.mark.parametrize("where", ["/dev/shm", "/tmp", "."])
def test_memory_budget_holds_for_tmpfs_files(memory_box, where):
    """/dev/shm took 1 GiB of host memory in 0.1 s: tmpfs pages now count against memory_mb."""
    r = run(memory_box, TMPFS_FILL.replace("sys.argv[1]", repr(where)))
    assert written_mib(r) <= 256, r.content
    still_works(memory_box)


def test_memory_mode_says_which_bound_runs(memory_box):
    mode = memory_box.memory_mode
    assert mode.startswith(("cgroup v1 (", "cgroup v2 (", "rlimit ("))
    if mode.startswith("rlimit"):  # the processes that fit beside the tmpfs mounts, 32 MiB or more each
        procs, mib = (int(x) for x in mode.split("(")[1].split(" MiB")[0].split(" processes x "))
        assert mode == "rlimit (6 processes x 34 MiB)" and procs * mib + 16 + 2 * 16 <= 256


@pytest.mark.parametrize("mode", MODES)
def test_on_machines_with_a_memory_cgroup_it_is_used(mode):
    from turnrl.tools.executors.sandbox.cgroup import MemoryCgroups

    groups = MemoryCgroups.find()
    if groups is None:
        pytest.skip("no writable memory cgroup on this machine: the rlimit bound runs (tested above)")
    groups.close()
    ex = memory_sandbox("auto", mode)
    try:
        assert ex.memory_mode.startswith("cgroup")
        r = run(ex, "chunks = []\nwhile True: chunks.append(bytearray(b'x') * (10 << 20))")
        assert r.error == "limit" and "out of memory (limit memory_mb=256)" in r.content
    finally:
        ex.close()


def test_without_a_cgroup_impossible_budgets_are_refused():
    with pytest.raises(ValueError, match="raise memory_mb to 128"):
        SandboxExecutor(Limits(memory_mb=64, file_mb=16), workdir_mb=64, memory="rlimit")


# --------------------------------------------------------------- attack surface no program needs
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"


def test_ptrace_of_the_sandbox_init_is_denied(sandbox):
    r = run(sandbox, LIBC + "print('attach', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"
                            "print('traceme', libc.ptrace(0, 0, 0, 0), ctypes.get_errno())\n"
                            "print(open('/proc/1/mem', 'rb').read(1) if False else 'skip')")
    assert "attach -1 1" in r.content and "traceme -1 1" in r.content, r.content
    still_works(sandbox)


def test_nested_user_namespaces_are_denied(sandbox):
    r = run(sandbox, shell="unshare -Urm id; echo rc=$?; unshare -U true; echo rc=$?")
    assert "uid=0" not in r.content and "rc=0" not in r.content, r.content
    r = run(sandbox, LIBC + "CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET = 0x10000000, 0x20000, 0x40000000\n"
                            "for flags in (CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWUSER | CLONE_NEWNS):\n"
                            "    print('unshare', hex(flags), libc.unshare(flags), ctypes.get_errno())\n"
                            "pid = os.fork()\n"  # plain forks still work
                            "if pid == 0: os._exit(7)\n"
                            "print('fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))")
    assert r.content.count(" -1 1") == 4 and "fork 7" in r.content, r.content
    still_works(sandbox)


@pytest.mark.parametrize("name, call", [
    ("mount", "libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)"),
    ("keyctl", "libc.syscall(250 if os.uname().machine == 'x86_64' else 219, 0, 0, 0, 0, 0)"),
    ("bpf", "libc.syscall(321 if os.uname().machine == 'x86_64' else 280, 0, 0, 0)"),
    ("perf_event_open", "libc.syscall(298 if os.uname().machine == 'x86_64' else 241, 0, 0, -1, -1, 0)"),
    ("setns", "libc.setns(os.open('/proc/self/ns/net', os.O_RDONLY), 0)"),
    ("io_uring_setup", "libc.syscall(425, 1, 0)"),
    ("userfaultfd", "libc.syscall(323 if os.uname().machine == 'x86_64' else 282, 0)"),
    # a POSIX message queue would outlive the episode in a recycled sandbox's IPC namespace
    ("mq_open", "libc.syscall(240 if os.uname().machine == 'x86_64' else 180, b'q', os.O_CREAT | os.O_RDWR, 0o600, 0)"),
])
def test_dangerous_system_calls_are_denied(sandbox, name, call):
    r = run(sandbox, LIBC + f"print({name!r}, {call}, ctypes.get_errno())")
    assert f"{name} -1 1" in r.content, r.content  # EPERM from the seccomp filter


def test_clone3_falls_back_so_threads_and_subprocesses_still_work(sandbox):
    r = run(sandbox, LIBC + "print('clone3', libc.syscall(435, 0, 0), ctypes.get_errno())\n"
                            "import subprocess, threading\n"
                            "t = threading.Thread(target=print, args=('thread ok',)); t.start(); t.join()\n"
                            "print(subprocess.run(['echo', 'subprocess ok'], capture_output=True, text=True).stdout)")
    assert "clone3 -1 38" in r.content and "thread ok" in r.content and "subprocess ok" in r.content, r.content


# ------------------------------------------------------------ bad input and the launcher's own traces
def test_invalid_text_is_refused_before_the_launch_with_a_clear_message(sandbox):
    r = run(sandbox, "print('ok')\udc80")
    assert r.error == "bad_arguments" and "argument 'code'" in r.content and "lone surrogate" in r.content
    assert "Traceback" not in r.content and "launcher" not in r.content
    r = run(sandbox, shell="echo a\x00b")
    assert r.error == "bad_arguments" and "NUL" in r.content and "Traceback" not in r.content
    r = run(sandbox, "print('héllo, 中文, 😀')")
    assert r.content == "Exit code: 0\nstdout:\nhéllo, 中文, 😀"


def test_exited_sandboxes_leave_no_zombies(sandbox):
    """Without --as-pid-1 bwrap's own init outlived the run as an orphan, a zombie for seconds."""

    def zombies():
        found = []
        for pid in os.listdir("/proc"):
            try:
                stat = open(f"/proc/{pid}/stat").read()
            except OSError:
                continue
            comm, state = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()[0]
            if state == "Z" and comm in ("bwrap", "python3", "setpriv", "sh"):
                found.append((pid, comm))
        return found

    for code in ("print(1)", "while True: print('spam' * 100)", "import time\ntime.sleep(30)"):
        run(sandbox, code)
        time.sleep(0.2)
        assert not [z for z in zombies() if z[1] == "bwrap"], (code, zombies())

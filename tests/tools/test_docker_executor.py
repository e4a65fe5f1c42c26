"""The docker executor and its locally built default image.

The parts that need no engine run everywhere: the Limits -> container options mapping
(checked by the docker SDK's own argument conversion), the in-container launcher (run here
with the host's python3: files, stdin, argv, rlimits), the output cap and the limit judge, the
pool / TTL bookkeeping, and the errors when no engine answers. The rest runs against a real
engine with the default image (``scripts/docker_engine.sh`` starts one and builds it; CI runs
it): the sandbox suite's attacks, the container's privileges and cgroup caps as the kernel
sees them, sessions, the reaper and ``python -m turnrl build-docker-image``. Without an engine
those tests skip saying how to start one, and fail under ``CI=true`` (``missing_tool``).
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from docker.models.containers import _create_container_args

import turnrl
from turnrl.tools import ToolCall, run_python, run_shell, run_sync
from tests.helpers import missing_tool
from turnrl.tools.executors import EXECUTORS, Limits, Program, get_executor
from turnrl.tools.executors.docker.executor import (
    ARG_CHUNK_CHARS,
    EXECUTOR_LABEL,
    EXPIRES_LABEL,
    DEFAULT_IMAGE,
    MAX_SPEC_CHARS,
    OWNER_LABEL,
    RESERVED_PROCS,
    UID_LABEL,
    Box,
    ContainerPool,
    DockerConfig,
    DockerExecutor,
    DockerUnavailable,
    OutputCap,
    connect,
    container_options,
    docker_address,
    expired_containers,
    judge,
    launcher_argv,
)
from turnrl.tools.executors.docker.image import ImageBuildError, cache_dir, rootfs_tarball

LIMITS = Limits(cpu_s=1, wall_s=3, memory_mb=256, output_bytes=4096, max_procs=32, file_mb=4)
PROJECT_FILE = str(Path(turnrl.__file__).resolve())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ no engine needed


def test_limits_map_to_container_options_the_sdk_accepts():
    config = DockerConfig(image="python:3.11-slim", ttl_s=1800, cpus=0.5, workdir_mb=128)
    opts = container_options(LIMITS, config, owner="me", uid=234567, now=1_000.0)
    assert opts["network_mode"] == "none" and opts["network_disabled"] is True
    assert opts["read_only"] is True and opts["cap_drop"] == ["ALL"] and opts["security_opt"] == ["no-new-privileges"]
    assert opts["pids_limit"] == 32 + RESERVED_PROCS and opts["nano_cpus"] == 500_000_000
    assert opts["command"] == ["sleep", "1800"] and opts["auto_remove"] and opts["init"]
    assert opts["labels"] == {EXECUTOR_LABEL: "docker", EXPIRES_LABEL: "2800", OWNER_LABEL: "me", UID_LABEL: "234567"}
    assert set(opts["tmpfs"]) == {"/work", "/tmp"} and "size=128m" in opts["tmpfs"]["/work"]
    for path in ("/work", "/tmp"):  # owned by the session's uid through the mount, whatever mode the engine keeps
        assert "uid=234567,gid=234567,mode=0700" in opts["tmpfs"][path]
    # the docker SDK's own conversion of ``containers.run`` kwargs: unknown or bad ones raise
    created = _create_container_args({**opts, "version": "1.44"})
    host = created["host_config"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] and host["PidsLimit"] == 40
    assert host["Memory"] == host["MemorySwap"] == (256 + 128 + 12 + 64) << 20  # no swap beyond the cap
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]}
    assert ulimits == {"cpu": (1, 2), "fsize": (4 << 20, 4 << 20), "core": (0, 0)}
    assert created["labels"][EXPIRES_LABEL] == "2800" and created["network_disabled"] is True


def test_config_rejects_bad_values():
    for bad in ({"pool_size": -1}, {"ttl_s": 5}, {"cpus": 0}, {"image": ""}, {"workdir_mb": True}):
        with pytest.raises(ValueError):
            DockerConfig(**bad)
    assert DockerConfig(ttl_s=600).min_life_s == 300


def test_expired_containers_are_chosen_by_their_labels():
    now = 10_000.0
    labels = {
        "old": {EXECUTOR_LABEL: "docker", EXPIRES_LABEL: "9999"},
        "fresh": {EXECUTOR_LABEL: "docker", EXPIRES_LABEL: "10500"},
        "broken": {EXECUTOR_LABEL: "docker", EXPIRES_LABEL: "soon"},
        "unlabelled": {EXECUTOR_LABEL: "docker"},
        "someone-elses": {EXPIRES_LABEL: "1"},
        "other-kind": {EXECUTOR_LABEL: "kubernetes", EXPIRES_LABEL: "1"},
    }
    assert expired_containers(labels, now) == ["broken", "old", "unlabelled"]
    assert expired_containers(labels, 20_000.0) == ["broken", "fresh", "old", "unlabelled"]


def test_pool_hands_out_fresh_warm_containers_and_keeps_sessions_apart():
    pool = ContainerPool(size=2, min_life_s=100)
    assert pool.start_warming() == 2 and pool.start_warming() == 0  # pending starts count
    pool.warmed(Box("a", 1_000, 1))
    pool.warmed(None)  # a failed start
    assert pool.start_warming() == 1
    pool.warmed(Box("b", 1_200, 2))
    box, stale = pool.checkout("s1", now=950)  # "a" has 50 s left: too old to hand out
    assert box == Box("b", 1_200, 2) and stale == [Box("a", 1_000, 1)]
    assert pool.checkout("s1", now=1_150) == (Box("b", 1_200, 2), [])  # a session keeps its own
    assert pool.checkout("s2", now=960) == (None, [])  # none warm: start one, then hold it
    assert pool.hold("s2", Box("c", 1_900, 3)) is None
    assert pool.hold("s2", Box("d", 1_900, 4)) == Box("c", 1_900, 3)  # replaced: remove the old
    assert pool.release("s1") == Box("b", 1_200, 2) and pool.release("s1") is None
    assert pool.start_warming() == 2
    pool.warmed(Box("e", 2_000, 5))
    assert sorted(b.id for b in pool.drain()) == ["d", "e"] and not pool.held and not pool.warm


def test_pool_hands_out_the_oldest_container_that_is_still_fresh_enough():
    pool = ContainerPool(size=3, min_life_s=100, warm=[Box("y", 300, 2), Box("x", 150, 1), Box("z", 200, 3)])
    box, stale = pool.checkout("s", now=60)  # x has 90 s left: stale; z is the oldest fresh one
    assert (box.id, [b.id for b in stale], [b.id for b in pool.warm]) == ("z", ["x"], ["y"])


def run_launcher(tmp_path, program, limits=LIMITS):
    """Run the in-container launcher here, with the host's python3, in ``tmp_path``."""
    argv = launcher_argv(program, limits)
    assert argv[:4] == ["python3", "-I", "-S", "-c"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, timeout=30)
    code = 128 - done.returncode if done.returncode < 0 else done.returncode  # docker's 128 + n form
    out = OutputCap(limits.output_bytes)
    out.add(0, done.stdout)
    out.add(1, done.stderr)
    return out, code


def test_launcher_writes_files_feeds_stdin_and_execs_argv(tmp_path):
    big = "x" * (2 * ARG_CHUNK_CHARS + 17)  # the spec spans several argv strings
    program = Program(
        ("python3", "pkg/main.py", "arg one"),
        {"pkg/main.py": "import sys\nprint(sys.argv[1:], sys.stdin.read(), len(open('pkg/big.txt').read()))",
         "pkg/big.txt": big},
        stdin="héllo\nworld",
    )
    out, code = run_launcher(tmp_path, program)
    assert code == 0 and out.text(0) == f"['arg one'] héllo\nworld {len(big)}\n"
    assert (tmp_path / "pkg" / "big.txt").read_text() == big


def test_launcher_reports_a_missing_program(tmp_path):
    out, code = run_launcher(tmp_path, Program(("no-such-binary-here",)))
    assert code == 127 and "cannot run 'no-such-binary-here'" in out.text(1)


@pytest.mark.slow
def test_launcher_applies_cpu_memory_and_file_limits(tmp_path):
    out, code = run_launcher(tmp_path, Program(("python3", "-c", "while True: pass")))
    assert code == 128 + signal.SIGXCPU and judge(out, code, None, 1.5, LIMITS).limit == "cpu"
    out, code = run_launcher(tmp_path, Program(("python3", "-c", "a = []\nwhile True: a.append(bytearray(10 ** 7))")))
    result = judge(out, code, None, 0.5, LIMITS)
    assert "MemoryError" in out.text(1) and result.limit == "memory"
    assert "out of memory (limit memory_mb=256)" in result.message()
    out, code = run_launcher(tmp_path, Program(("python3", "-c", "open('f.bin', 'wb').write(b'x' * (8 << 20))")))
    assert "File too large" in out.text(1) and judge(out, code, None, 0.2, LIMITS).limit == "file"  # python: EFBIG
    out, code = run_launcher(tmp_path, Program(("sh", "-c", "head -c 8000000 /dev/zero > g.bin")))
    assert code == 128 + signal.SIGXFSZ and judge(out, code, None, 0.2, LIMITS).limit == "file"  # others: SIGXFSZ
    assert (tmp_path / "f.bin").stat().st_size <= 4 << 20 and (tmp_path / "g.bin").stat().st_size <= 4 << 20


def test_launcher_refuses_programs_too_big_for_argv():
    with pytest.raises(ValueError, match=f"passes at most {MAX_SPEC_CHARS}"):
        launcher_argv(Program(("cat",), stdin="y" * MAX_SPEC_CHARS), LIMITS)


def test_output_cap_keeps_the_first_bytes_and_flags_overflow():
    out = OutputCap(10)
    assert not out.add(0, b"12345") and not out.add(1, b"abc") and not out.add(0, None)
    assert out.add(0, b"6789") and out.truncated
    assert (out.text(0), out.text(1), out.total) == ("1234567", "abc", 12)


def test_judge_names_the_limit_and_the_exit_code():
    def j(code, killed=None, stderr=b"", truncated=False):
        out = OutputCap(LIMITS.output_bytes)
        out.add(1, stderr)
        out.truncated = truncated
        return judge(out, code, killed, 1.0, LIMITS)

    assert (j(0).exit_code, j(0).limit, j(0).explanation) == (0, None, "")
    assert (j(3).exit_code, j(3).limit) == (3, None)
    r = j(137, "wall")
    assert (r.exit_code, r.limit) == (None, "wall") and "ran longer than 3 s" in r.message()
    assert j(137).limit == "memory"  # a SIGKILL the executor did not send: the OOM killer
    assert (j(152).limit, j(153).limit, j(152).exit_code) == ("cpu", "file", None)
    assert j(1, stderr=b"BlockingIOError: [Errno 11] Resource temporarily unavailable").limit == "procs"
    assert j(137, "wall", stderr=b"bash: fork: retry: Resource temporarily unavailable").limit == "procs"
    assert j(137, "output", truncated=True).limit == "output"
    assert "signal SIGSEGV" in j(128 + signal.SIGSEGV).explanation
    assert "exit status is unknown" in j(None).explanation
    assert "(output truncated to 4096 bytes)" in j(0, truncated=True).explanation


def test_judge_tells_an_oom_kill_from_a_program_that_killed_itself():
    out = OutputCap(LIMITS.output_bytes)
    oom = judge(out, 137, None, 1.0, LIMITS, oom=True)
    assert oom.limit == "memory" and "out of memory (limit memory_mb=256)" in oom.message()
    own = judge(out, 137, None, 1.0, LIMITS, oom=False)  # e.g. kill -9 $PPID: the count did not go up
    assert (own.exit_code, own.limit) == (None, None)
    assert own.message() == "Exit code: killed\nThe program was killed by signal SIGKILL.\nstdout: (empty)"


def test_no_engine_is_a_clear_construction_error():
    assert "docker" in EXECUTORS
    address = f"tcp://127.0.0.1:{closed_port()}"
    with pytest.raises(DockerUnavailable) as err:
        DockerExecutor(LIMITS, base_url=address)
    message = str(err.value)
    assert f"no docker engine answers at {address}" in message
    assert "docker.from_env().ping() failed" in message and "use executor 'sandbox'" in message
    with pytest.raises(DockerUnavailable, match="no docker engine answers"):
        get_executor("docker", base_url=address)
    with pytest.raises(ValueError, match="ttl_s must be at least 60"):
        DockerExecutor(ttl_s=1, base_url=address)  # options are checked before the engine is asked


def test_no_engine_at_docker_host_is_a_clear_error(tmp_path, monkeypatch):
    dead = tmp_path / "docker.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(dead))  # a socket file nobody listens on
    monkeypatch.setenv("DOCKER_HOST", f"unix://{dead}")
    with pytest.raises(DockerUnavailable, match=re.escape(f"no docker engine answers at unix://{dead}")):
        DockerExecutor(LIMITS)
    monkeypatch.delenv("DOCKER_HOST")
    assert docker_address() == "unix:///var/run/docker.sock"  # what the SDK tries without DOCKER_HOST
    assert docker_address("tcp://10.0.0.1:2375") == "tcp://10.0.0.1:2375"


def turnrl_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "turnrl", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_build_docker_image_without_an_engine_fails_naming_the_address(tmp_path):
    dead = tmp_path / "docker.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(dead))
    result = turnrl_cli("build-docker-image", env={"DOCKER_HOST": f"unix://{dead}"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"turnrl build-docker-image: error: no docker engine answers at unix://{dead}" in result.stderr
    assert "scripts/docker_engine.sh" in result.stderr and "debootstrap" not in result.stdout  # no build began


def test_building_the_root_filesystem_without_debootstrap_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no debootstrap on it
    with pytest.raises(ImageBuildError, match="debootstrap is not installed: run 'apt-get install debootstrap'"):
        rootfs_tarball(cache=tmp_path / "cache", log=lambda line: None)
    assert not (tmp_path / "cache").exists()  # refused before anything was written


# --------------------------------------------------------------- a real engine

ENGINE_INSTALL = f"as root, scripts/docker_engine.sh starts an engine and builds {DEFAULT_IMAGE}"


@pytest.fixture(scope="module")
def engine():
    """A docker client of the engine at $DOCKER_HOST or the default socket."""
    try:
        client = connect()
    except DockerUnavailable as e:
        missing_tool(str(e), ENGINE_INSTALL)
    yield client
    client.close()


@pytest.fixture(scope="module")
def dock(engine):
    try:
        ex = DockerExecutor(LIMITS, pool_size=1, ttl_s=600, timeout_s=60)
    except DockerUnavailable as e:  # the engine answers but lacks the default image
        missing_tool(str(e), ENGINE_INSTALL)
    yield ex
    ex.close()


def run(ex, code=None, shell=None, session=None):
    """One call in ``session`` (default: a fresh session, closed after the call)."""
    own = session is None
    session = session or uuid.uuid4().hex
    try:
        if shell is not None:
            return run_sync(ex.arun(run_shell, ToolCall("run_shell", {"command": shell}), session))
        return run_sync(ex.arun(run_python, ToolCall("run_python", {"code": code}), session))
    finally:
        if own:
            ex.close_session(session)


def still_works(ex):
    r = run(ex, "print(6 * 7)")
    assert (r.error, r.content) == (None, "Exit code: 0\nstdout:\n42")


@pytest.mark.slow
def test_docker_infinite_loop_hits_cpu_limit(dock):
    r = run(dock, "while True: pass")
    assert r.error == "limit" and "CPU time (limit cpu_s=1)" in r.content
    still_works(dock)


@pytest.mark.slow
def test_docker_sleeping_forever_hits_wall_limit(dock):
    r = run(dock, "import time\nwhile True: time.sleep(0.1)")
    assert r.error == "limit" and "ran longer than 3 s (limit wall_s=3)" in r.content
    still_works(dock)


@pytest.mark.slow
def test_docker_fork_bombs_hit_procs_limit(dock):
    r = run(dock, "import os\nwhile True: os.fork()")
    assert r.error == "limit" and "limit max_procs=32" in r.content
    r = run(dock, shell=":(){ :|:& };:")
    assert r.error == "limit" and "limit max_procs=32" in r.content
    still_works(dock)


@pytest.mark.slow
@pytest.mark.parametrize("shell", ["kill -9 $PPID", "kill -9 $$"])
def test_docker_program_that_kills_its_parent_or_itself_is_not_out_of_memory(dock, shell):
    r = run(dock, shell=shell)
    assert r.error is None and r.content == "Exit code: killed\nThe program was killed by signal SIGKILL.\nstdout: (empty)"
    still_works(dock)


@pytest.mark.slow
def test_docker_memory_bomb_hits_memory_limit(dock):
    r = run(dock, "chunks = []\nwhile True: chunks.append(bytearray(10 ** 7))")
    assert r.error == "limit" and "out of memory (limit memory_mb=256)" in r.content
    still_works(dock)


@pytest.mark.slow
def test_docker_huge_output_is_cut_and_reported(dock):
    r = run(dock, "while True: print('spam' * 100)")
    assert r.error == "limit" and "output is truncated (limit output_bytes=4096)" in r.content
    assert "spam" in r.content and len(r.content) < 6000
    still_works(dock)


@pytest.mark.slow
def test_docker_huge_file_hits_file_limit(dock):
    r = run(dock, "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (8 << 20))")
    assert r.error == "limit" and "limit file_mb=4" in r.content
    still_works(dock)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["/usr/evil.txt", "/etc/evil.txt", "/evil.txt"])
def test_docker_writing_outside_the_working_dir_fails(dock, target):
    r = run(dock, f"open({target!r}, 'w').write('pwned')\nprint('wrote')")
    assert r.error is None and "Exit code: 1" in r.content
    assert "Read-only file system" in r.content or "Permission denied" in r.content
    still_works(dock)


@pytest.mark.slow
def test_docker_host_files_are_not_visible(dock):
    code = (f"import os\nprint(os.path.exists({PROJECT_FILE!r}))\n"
            "try:\n    print(open('/etc/shadow').read()[:50])\nexcept OSError as e:\n    print('denied', e.errno)")
    r = run(dock, code)
    assert "stdout:\nFalse\ndenied" in r.content
    still_works(dock)


@pytest.mark.slow
def test_docker_has_no_network(dock):
    with socket.socket() as server:
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
        r = run(dock, code)
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()
    assert "blocked 1.1.1.1" in r.content and "blocked 127.0.0.1" in r.content and "connected" not in r.content


@pytest.mark.slow
def test_docker_sessions_keep_files_apart_and_close_removes_the_container(dock):
    import docker

    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    run(dock, "open('note.txt', 'w').write('kept')", session=a)
    read = "import os\nprint(os.path.exists('note.txt'), os.getuid() != 0)"
    assert "True True" in run(dock, read, session=a).content
    assert "False True" in run(dock, read, session=b).content
    cid = dock.container_id(a)
    labels = dock.client.containers.get(cid).labels
    assert labels[EXECUTOR_LABEL] == "docker" and float(labels[EXPIRES_LABEL]) > time.time() + 500
    dock.close_session(a)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            dock.client.containers.get(cid)
            time.sleep(0.2)
        except docker.errors.NotFound:
            break
    else:
        pytest.fail(f"container {cid} of a closed session still exists")
    dock.close_session(b)


@pytest.mark.slow
def test_docker_reaper_removes_expired_containers(dock):
    import docker

    old = container_options(LIMITS, dock.config, owner="crashed-run", uid=250_000, now=time.time() - 2 * dock.config.ttl_s)
    container = dock.client.containers.run(**old)
    assert container.id in dock.reap()
    with pytest.raises(docker.errors.NotFound):
        dock.client.containers.get(container.id)


@pytest.mark.slow
def test_docker_work_and_tmp_belong_to_the_session_uid(dock):
    code = ("import os, tempfile\nopen('note.txt', 'w').write('x')\n"
            "with tempfile.NamedTemporaryFile(dir='/tmp') as f:\n    f.write(b'x')\n"
            "print([os.stat(d).st_uid == os.getuid() != 0 for d in ('/work', '/tmp')], "
            "os.stat('/work').st_mode & 0o002, os.getcwd())")
    r = run(dock, code)
    assert (r.error, r.content) == (None, "Exit code: 0\nstdout:\n[True, True] 0 /work")


CONFINEMENT = """
import os
def read(*paths):  # cgroup v2 path first, then v1
    for path in paths:
        if os.path.exists(path):
            return open(path).read().split()
    return ["missing"]
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print("uid", os.getuid(), os.getgid())
print(*(f"{key}={status[key].strip()}" for key in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp")))
print("pids", read("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max")[0])
print("memory", read("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")[0])
quota = read("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us")[0]
period = read("/sys/fs/cgroup/cpu.max")[1:] or read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
print("cpus", int(quota) / int(period[0]))
"""


@pytest.mark.slow
def test_docker_runs_unprivileged_under_the_kernels_caps(dock):
    session = uuid.uuid4().hex
    try:
        r = run(dock, CONFINEMENT, session=session)
        uid = dock.client.containers.get(dock.container_id(session)).labels[UID_LABEL]
    finally:
        dock.close_session(session)
    cap_mb = LIMITS.memory_mb + dock.config.workdir_mb + (LIMITS.file_mb + 8) + 64
    assert r.content == (
        f"Exit code: 0\nstdout:\nuid {uid} {uid}\n"
        "CapEff=0000000000000000 CapPrm=0000000000000000 CapBnd=0000000000000000 NoNewPrivs=1 Seccomp=2\n"
        f"pids {LIMITS.max_procs + RESERVED_PROCS}\nmemory {cap_mb << 20}\ncpus {dock.config.cpus}"
    )


@pytest.mark.slow
def test_docker_memory_cgroup_caps_all_processes_together(engine):
    # 5 children of 64 MB each stay under RLIMIT_AS (128 MB) one by one but not under the
    # container's cap together (128 + 16 + 12 + 64 = 220 MB): once every child holds its memory
    # or died, some died (a wall limit far above the time that takes on a loaded machine)
    limits = Limits(cpu_s=10, wall_s=120, memory_mb=128, output_bytes=4096, max_procs=32, file_mb=4)
    code = """
import os
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
children = []
for _ in range(5):
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        block = b"x" * (64 << 20)
        os.write(ready_w, b"+")
        os.close(ready_w)
        os.read(go_r, 1)  # hold the memory until the parent lets go
        os._exit(0)
    children.append(pid)
os.close(ready_w)
while os.read(ready_r, 1):  # EOF: every child holds its memory or died
    pass
os.close(go_w)
statuses = [os.waitpid(pid, 0)[1] for pid in children]
print("killed", sum(os.WIFSIGNALED(s) and os.WTERMSIG(s) == 9 for s in statuses))
"""
    ex = DockerExecutor(limits, pool_size=0, ttl_s=600, workdir_mb=16, timeout_s=180)
    try:
        r = run(ex, code)
        assert r.error is None and r.content.startswith("Exit code: 0\nstdout:\nkilled "), r.content
        assert int(r.content.rsplit(" ", 1)[1]) >= 1
        still_works(ex)
    finally:
        ex.close()


@pytest.mark.slow
def test_a_missing_image_is_a_clear_error_that_says_how_to_build_one(engine, monkeypatch):
    import turnrl.tools.executors.docker.executor as docker_executor

    with pytest.raises(DockerUnavailable, match="cannot be pulled") as err:  # no registry here; elsewhere no such image
        DockerExecutor(LIMITS, image=f"turnrl-no-such-image:{uuid.uuid4().hex[:8]}")
    assert "python -m turnrl build-docker-image" in str(err.value)
    missing = f"turnrl-sandbox:missing-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(docker_executor, "DEFAULT_IMAGE", missing)  # the default is built, never pulled
    with pytest.raises(DockerUnavailable) as err:
        DockerExecutor(LIMITS, image=missing)
    assert f"image {missing!r} (the docker executor's default) is not on this engine" in str(err.value)
    assert "'python -m turnrl build-docker-image' (as root)" in str(err.value)


@pytest.mark.slow
def test_build_docker_image_keeps_the_image_the_engine_has(dock):
    result = turnrl_cli("build-docker-image")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{DEFAULT_IMAGE} is already on the engine" in result.stdout and "debootstrap" not in result.stdout


@pytest.mark.slow
def test_build_docker_image_imports_the_cached_root_filesystem_as_a_working_image(engine):
    if not any(cache_dir().glob("rootfs-*.tar")):
        missing_tool(f"no Debian root filesystem is cached in {cache_dir()}", ENGINE_INSTALL)
    image = f"turnrl-sandbox:test-{uuid.uuid4().hex[:8]}"
    try:
        result = turnrl_cli("build-docker-image", "--image", image)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "using the cached root filesystem" in result.stdout and f"built {image}" in result.stdout
        config = engine.images.get(image).attrs["Config"]
        assert "LANG=C.UTF-8" in config["Env"] and config["Labels"]["turnrl.recipe"].startswith("rootfs-bookworm-")
        ex = DockerExecutor(LIMITS, image=image, pool_size=0, ttl_s=600, timeout_s=60)
        try:
            r = run(ex, "import sys\nprint(sys.version_info[:2])")
            assert (r.error, r.content) == (None, "Exit code: 0\nstdout:\n(3, 11)")
        finally:
            ex.close()
    finally:
        engine.images.remove(image, force=True)

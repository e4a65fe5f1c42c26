"""The bubblewrap sandbox executor: model-written programs in throwaway namespaces, under limits.

What a run sees: new user, pid, net, ipc, uts and cgroup namespaces (the network namespace has
only its own loopback: nothing outside is reachable); read-only ``/usr`` (and the ``/bin``,
``/lib*`` links or dirs) and a few loader files from ``/etc`` (never ``/etc`` as a whole); a
private ``/proc``; a read-only minimal ``/dev``; and three size-capped tmpfs mounts: the
working dir ``/work`` (cwd and ``HOME``, ``workdir_mb``), ``/tmp`` and ``/dev/shm``
(``Limits.file_mb`` each). No host directory is writable or bound, so no host path appears
anywhere in the sandbox (``/proc/self/mountinfo`` included). The environment of every process
inside, bubblewrap's own included, is a fixed minimal one: nothing of the host's (API keys,
``LD_PRELOAD``) leaks in. Run as root, the sandbox drops to an unprivileged uid (``nobody``)
first (with ``setpriv``), so kernel limits apply.

Hardening: nested user namespaces are disabled (``--disable-userns``, bubblewrap >= 0.8) and a
seccomp filter (``seccomp.py``) denies ptrace, mounts, namespaces, the keyring, bpf,
perf_event_open, io_uring and the like.

Sessions: a session's files live on the host only as an opaque blob the host never unpacks.
A small launcher inside the sandbox restores them into ``/work``, writes ``Program.files``,
forks the program under RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE (no core dumps),
waits for it, then packs ``/work`` back out through a pipe. A run stopped from outside (wall
clock, output cap) keeps the session's files as they were before it.

Memory: where a memory cgroup is writable (``cgroup.py``: v2, or the v1 controller), each run
gets its own cgroup capped at ``memory_mb``: all its processes plus every tmpfs page they
write (``/work``, ``/tmp``, ``/dev/shm``) stay within it together, and an OOM kill is reported
as the memory limit. Elsewhere the bound is kept by rlimits: the tmpfs sizes are taken off
``memory_mb`` and the rest is split over the processes (RLIMIT_AS of at least
``MIN_PROCESS_MB`` each, RLIMIT_NPROC lowered to fit). ``SandboxExecutor.memory_mode`` says
which one runs.

Warm sandboxes (``pool="call"`` / ``"episode"`` / ``"recycle"``, ``pool.py``): the same
command, started ahead with a trusted server (``launcher.py``) as pid 1 instead of the
one-shot launcher; each call forks the program from that server (a ``python3`` script runs in
the forked interpreter itself). ``"call"``: a sandbox serves one call, so every call starts as
in a cold one. ``"episode"``: a sandbox serves the calls of one session and is discarded with
it; between its calls the server kills every process left and empties ``/tmp`` and
``/dev/shm``, each program starts from the server's untouched interpreter, and ``/work`` stays.
In these modes no sandbox ever serves two sessions, so nothing (files, processes, interpreter
or IPC state) passes from one episode to another. ``"recycle"``: as ``"episode"``, but when the
session ends its sandbox is wiped by the server (every process killed, ``/work``, ``/tmp`` and
``/dev/shm`` emptied, every System V IPC object removed, all of it checked) and serves another
session; nothing an episode can change passes to the next one (every writable place is wiped,
no program can change the server, and POSIX message queues cannot be made), but the sandboxes
of two episodes share the server's start: its address-space layout and hash seed, and its
namespaces' identity. A warm sandbox has one memory cgroup for its whole life.

The executor kills the whole sandbox after ``wall_s`` or once stdout+stderr exceed
``output_bytes``. Which limit stopped a run is read from the exit status (SIGXCPU or an
unexplained SIGKILL: cpu; SIGKILL after an OOM kill: memory; SIGXFSZ: file) and from the
program's error text (MemoryError, EAGAIN on fork, EFBIG, ENOSPC).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import marshal
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Mapping

from turnrl.tools.execute import ToolResult, unavailable_result
from turnrl.tools.executors.sandbox import seccomp
from turnrl.tools.executors.base import EXECUTORS, Executor, LimitHit, Limits, Program, RunResult
from turnrl.tools.executors.sandbox.cgroup import MemoryCgroups, RunCgroup
from turnrl.tools.executors.loop import get_loop
from turnrl.tools.executors.sandbox.pool import POOL_MODES, WARM_LAUNCHER, SandboxPool, WarmSandbox, WarmStartFailed, start_warm
from turnrl.tools.executors.verdict import OutputCap, verdict
from turnrl.tools.parsers import ToolCall
from turnrl.tools.tool import Tool

__all__ = ["SandboxExecutor", "SandboxUnavailable", "bwrap_command"]

log = logging.getLogger(__name__)

INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)"
NOBODY = 65534
SANDBOX_HOME = "/work"
SANDBOX_PATH = "/usr/bin:/bin"
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
"""The whole environment bubblewrap (and everything inside) starts with: nothing of the host's."""
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime")
TOP_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
READ_CHUNK = 65_536
HEADER_DIGITS = 16
KILL_GRACE_S = 2.0
"""After killing a sandbox, seconds to wait for its pipes to close."""
MIN_PROCESS_MB = 32
"""Without a memory cgroup: the smallest address space a process gets (python3 starts in 16)."""
STATE_OVERHEAD = 1 << 20
"""Bytes of packing overhead allowed above ``workdir_mb`` when reading a session's files back."""
JOIN_CGROUP = 'echo $$ > "$0" && exec "$@"'
"""``sh -c`` script: move this shell into the cgroup whose ``cgroup.procs`` is $0, then exec."""

LAUNCHER = r"""
import json, marshal, os, resource, signal, stat, sys
H = %d
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
signal.signal(signal.SIGINT, signal.SIG_IGN)  # pid 1 ignores what it has no handler for: a program's SIGINT too
def read_exact(n):
    parts = []
    while n:
        b = os.read(0, min(n, 1 << 20))
        if not b:
            sys.exit("turnrl sandbox: the launcher's input was cut short")
        parts.append(b)
        n -= len(b)
    return b"".join(parts)
spec = json.loads(read_exact(int(read_exact(H))))
out = spec["state_fd"]
os.set_inheritable(out, False)
os.write(out, b"S")  # started: what follows is the program's doing, never the sandbox's start
left, dirs = spec["state_bytes"], []
while left > 0:
    n = int(read_exact(H))
    left -= H + n
    path, kind, mode, data = marshal.loads(read_exact(n))
    try:
        if kind == "d":
            os.makedirs(path, exist_ok=True)
            dirs.append((path, mode))
        elif kind == "l":
            os.symlink(data, path)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(path, mode)
    except (OSError, ValueError):
        pass
for path, mode in reversed(dirs):
    try:
        os.chmod(path, mode)
    except OSError:
        pass
try:
    for rel, text in spec["files"].items():
        parent = os.path.dirname(rel)
        if parent:
            os.makedirs(parent, exist_ok=True)
        if os.path.islink(rel):
            os.unlink(rel)
        with open(rel, "w", encoding="utf-8") as f:
            f.write(text)
except OSError as e:  # nothing is packed back: the session keeps the files it had
    sys.exit("turnrl sandbox: cannot write the program's files: %%s" %% e)
argv = spec["argv"]
pid = os.fork()
if pid == 0:
    try:
        for name, soft, hard in spec["limits"]:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        for sig in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        os.execvp(argv[0], argv)
    except OSError as e:
        os.write(2, ("cannot run %%r: %%s\n" %% (argv[0], e.strerror)).encode())
    except BaseException as e:
        os.write(2, ("cannot run %%r: %%r\n" %% (argv[0], e)).encode())
    finally:
        os._exit(127)
os.close(0)
while True:  # pid 1 of the sandbox: reap every orphan until the program itself ends
    try:
        done, status = os.wait()
    except ChildProcessError:
        status = 0
        break
    if done == pid:
        break
def record(path, kind, mode, data):
    rec = marshal.dumps((path, kind, mode, data))
    view = memoryview(b"%%0*d" %% (H, len(rec)) + rec)
    while view:
        view = view[os.write(out, view):]
try:
    tops = [""]  # no recursion (os.walk's): a tree may be deeper than Python's stack
    while tops:
        top = tops.pop()
        try:
            names = os.listdir(top or ".")
        except OSError:
            continue
        for name in names:
            path = top + "/" + name if top else name
            try:
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    record(path, "l", 0, os.readlink(path))
                elif stat.S_ISDIR(st.st_mode):
                    record(path, "d", stat.S_IMODE(st.st_mode), b"")
                    tops.append(path)
                elif stat.S_ISREG(st.st_mode):
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with os.fdopen(fd, "rb") as f:
                        if stat.S_ISREG(os.fstat(fd).st_mode):
                            record(path, "f", stat.S_IMODE(st.st_mode), f.read())
            except OSError:
                pass
    os.write(out, b"0" * H)  # the end: a pack without it (the walk cut short) is not saved
    os.close(out)
except OSError:
    pass
os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
""" % HEADER_DIGITS


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create the namespaces it needs on this machine, or a
    sandbox did not start for a call (at construction it is raised; a call gets an
    ``"unavailable"`` result)."""


@dataclass(frozen=True)
class _Identity:
    """Who runs bwrap: None = this process's own user, else the uid/gid to drop to (as root)."""

    uid: int | None
    gid: int | None


@dataclass(frozen=True)
class _Bwrap:
    """The host binaries of a launch and what this bubblewrap supports."""

    bwrap: str
    setpriv: str | None
    disable_userns: bool


def bwrap_command(bwrap: str, *, tmp_bytes: int, workdir_bytes: int, seccomp_fd: int | None = None,
                  disable_userns: bool = True, argv: tuple[str, ...] | None = None) -> list[str]:
    """The ``bwrap`` argv for a run of ``argv`` (default: the launcher), as described in the
    module docstring; ``seccomp_fd`` is an fd this process passes on, holding the filter."""
    cmd = [bwrap, "--unshare-all", "--unshare-user", *(["--disable-userns"] if disable_userns else []),
           "--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for top in TOP_DIRS:
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    for path in ETC_FILES:
        cmd += ["--ro-bind-try", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
            "--size", str(tmp_bytes), "--tmpfs", "/dev/shm",
            "--size", str(tmp_bytes), "--tmpfs", "/tmp",
            "--size", str(workdir_bytes), "--tmpfs", SANDBOX_HOME,
            "--remount-ro", "/", "--chdir", SANDBOX_HOME,
            "--clearenv", "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", SANDBOX_HOME,
            "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    return cmd + ["--", *(argv or ("/usr/bin/python3", "-I", "-S", "-c", LAUNCHER))]


def _identity(run_as: int | None | str) -> _Identity:
    if run_as == "auto":
        return _Identity(NOBODY, NOBODY) if os.geteuid() == 0 else _Identity(None, None)
    if run_as is None:
        return _Identity(None, None)
    if isinstance(run_as, bool) or not isinstance(run_as, int) or run_as < 0:
        raise ValueError(f"run_as must be 'auto', None or a uid >= 0, got {run_as!r}")
    return _Identity(run_as, run_as)


def _prefix(tools: _Bwrap, identity: _Identity, cgroup: RunCgroup | None) -> list[str]:
    """What runs before bwrap: join the run's cgroup (as this process's user), then drop to
    ``identity`` (``setpriv``); both exec in turn, so bwrap keeps the pid the executor spawned."""
    prefix: list[str] = []
    if cgroup is not None:
        prefix += ["/bin/sh", "-c", JOIN_CGROUP, cgroup.procs]
    if identity.uid is not None:
        prefix += [tools.setpriv, f"--reuid={identity.uid}", f"--regid={identity.gid}", "--clear-groups"]
    return prefix


def _seccomp_pipe() -> int | None:
    """A pipe's read end holding the seccomp filter (one per run: bwrap reads it to EOF)."""
    if not seccomp.supported():
        return None
    read, write = os.pipe()
    try:
        os.write(write, seccomp.filter_program())
    finally:
        os.close(write)
    return read


@lru_cache(maxsize=None)
def _tools(bwrap: str, drop: bool) -> _Bwrap:
    found = shutil.which(bwrap)
    if found is None:
        raise SandboxUnavailable(
            f"the sandbox executor needs bubblewrap, but {bwrap!r} is not on PATH; {INSTALL_HINT}")
    setpriv = shutil.which("setpriv") if drop else None
    if drop and setpriv is None:
        raise SandboxUnavailable(
            "the sandbox drops to an unprivileged uid when started as root, which needs setpriv "
            "(Debian/Ubuntu: apt-get install util-linux); or pass run_as=None to stay root")
    try:
        usage = subprocess.run([found, "--help"], capture_output=True, text=True, timeout=30, env=HOST_ENV).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxUnavailable(f"bubblewrap ({found}) could not be started: {e}; {INSTALL_HINT}") from e
    return _Bwrap(found, setpriv, "--disable-userns" in usage)


@lru_cache(maxsize=None)
def _probe(tools: _Bwrap, identity: _Identity) -> None:
    """Start one trivial sandbox as a run would be; raise ``SandboxUnavailable`` saying why not."""
    _try_start(tools, identity, None)


def _try_start(tools: _Bwrap, identity: _Identity, cgroup: RunCgroup | None) -> None:
    fd = _seccomp_pipe()
    cmd = _prefix(tools, identity, cgroup) + bwrap_command(
        tools.bwrap, tmp_bytes=1 << 20, workdir_bytes=1 << 20, seccomp_fd=fd,
        disable_userns=tools.disable_userns, argv=("/usr/bin/true",))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=HOST_ENV, cwd="/",
                              pass_fds=() if fd is None else (fd,))
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxUnavailable(f"bubblewrap ({tools.bwrap}) could not be started: {e}; {INSTALL_HINT}") from e
    finally:
        if fd is not None:
            os.close(fd)
    if done.returncode != 0:
        raise SandboxUnavailable(
            f"bubblewrap ({tools.bwrap}) cannot create its namespaces here (exit {done.returncode}: "
            f"{done.stderr.strip()}); {INSTALL_HINT} and allow unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0)"
        )


@EXECUTORS.register("sandbox")
class SandboxExecutor(Executor):
    """Runs code tools (their fn returns a ``Program``) in a bubblewrap sandbox.

    Each session (episode) has its own files, kept between the calls of that session only and
    deleted by ``close_session``/``close``. Calls of one session that overlap in time each start
    from the files as the last finished call left them, and the last to finish wins. See the module docstring for what the sandbox
    exposes, what it bounds and how.

    Args:
        limits: Per-run limits (a ``Limits`` or a mapping of its fields). ``memory_mb`` bounds
            the run as a whole: its processes and its tmpfs files together.
        max_concurrency: Sandboxes that may run at once, over all sessions.
        timeout_s: Seconds one call may take in all: the backstop for a sandbox that hangs, at
            least ``BACKSTOP_MARGIN_S`` above ``limits.wall_s`` (a call past it is ``"unavailable"``).
        bwrap: The bubblewrap binary (name on PATH or path).
        run_as: ``"auto"`` (drop to uid 65534 when running as root, else stay), None (stay)
            or a uid to drop to (needs root).
        workdir_mb: Size of the working dir ``/work``: all the files of a session, in MiB.
        memory: ``"auto"`` (a memory cgroup where one is writable, else rlimits), ``"cgroup"``
            (require one) or ``"rlimit"`` (never use one).
        pool: ``"off"`` (a new sandbox per call, started when the call comes), ``"call"`` (warm
            sandboxes started ahead, each serving one call), ``"episode"`` (warm sandboxes,
            each serving the calls of one session, then discarded) or ``"recycle"`` (as
            ``"episode"``, then wiped and serving another session). What each keeps isolated:
            the module docstring.
        pool_size: Fresh warm sandboxes kept started (refilled in the background); ignored
            with ``pool="off"``.

    Attributes:
        memory_mode: How memory is bounded here: ``"cgroup v1 (path)"``/``"cgroup v2 (path)"``
            or ``"rlimit (N processes x M MiB)"``.
        pool_mode: The ``pool`` argument.

    Raises:
        SandboxUnavailable: If bwrap is missing or cannot create namespaces (the message says
            ``apt-get install bubblewrap``), or ``memory="cgroup"`` finds no usable cgroup.
        ValueError: If the limits cannot be met without a cgroup (too little ``memory_mb``), or
            ``timeout_s`` is not above ``limits.wall_s`` by ``BACKSTOP_MARGIN_S``.

    A call whose sandbox cannot start (bubblewrap fails, a warm sandbox does not come up, a
    process or cgroup cannot be made) or that outlives ``timeout_s`` gets an ``"unavailable"``
    result: the infrastructure's failure, not the model's (``turnrl.tools.execute``).
    """

    kind = "sandbox"

    def __init__(self, limits: Limits | Mapping[str, Any] | None = None, *, max_concurrency: int = 8,
                 timeout_s: float = 60.0, bwrap: str = "bwrap", run_as: int | None | str = "auto",
                 workdir_mb: int = 64, memory: str = "auto", pool: str = "off", pool_size: int = 4) -> None:
        super().__init__(max_concurrency=max_concurrency, timeout_s=timeout_s)
        self.limits = Limits.coerce(limits)
        self.limits.check_backstop(self.timeout_s, self.kind)
        if isinstance(workdir_mb, bool) or not isinstance(workdir_mb, int) or workdir_mb <= 0:
            raise ValueError(f"workdir_mb must be a positive int (MiB), got {workdir_mb!r}")
        if memory not in ("auto", "cgroup", "rlimit"):
            raise ValueError(f"memory must be 'auto', 'cgroup' or 'rlimit', got {memory!r}")
        if pool not in POOL_MODES:
            raise ValueError(f"pool must be one of {POOL_MODES} ('off': a new sandbox per call; 'call'/'episode': "
                             f"warm sandboxes, each serving one call / the calls of one episode; 'recycle': as "
                             f"'episode', then wiped for the next episode), got {pool!r}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 0:
            raise ValueError(f"pool_size must be an int >= 0 (warm sandboxes kept started), got {pool_size!r}")
        self.pool_mode = pool
        self.workdir_mb = workdir_mb
        self._identity = _identity(run_as)
        self._tools = _tools(bwrap, self._identity.uid is not None)
        self.bwrap = self._tools.bwrap
        _probe(self._tools, self._identity)
        self._cgroups = self._find_cgroups() if memory != "rlimit" else None
        if self._cgroups is None and memory == "cgroup":
            raise SandboxUnavailable(
                "memory='cgroup' but no memory cgroup is writable here (cgroup v2 with the memory "
                "controller delegated to this process, or the v1 memory controller, as root); "
                "use memory='auto' to bound memory with rlimits instead")
        self._rlimit_procs, self._rlimit_mb = self._rlimit_budget()
        self._effective = dataclasses.replace(self.limits, max_procs=self._rlimit_procs)
        """The limits the model is told of (without a cgroup, fewer processes than asked)."""
        self.memory_mode = (self._cgroups.describe() if self._cgroups is not None else
                            f"rlimit ({self._rlimit_procs} processes x {self._rlimit_mb} MiB)")
        if self._cgroups is None:
            log.warning("sandbox: no memory cgroup is writable here, so memory_mb=%d is kept by rlimits: "
                        "%s plus %d MiB of tmpfs", self.limits.memory_mb, self.memory_mode,
                        self.workdir_mb + 2 * self.limits.file_mb)
        self._root = tempfile.mkdtemp(prefix="turnrl-sandbox-")
        os.chmod(self._root, 0o700)
        self._sessions: dict[str, Path] = {}
        self._versions: dict[str, int] = {}
        self._lock = threading.Lock()
        self.pool: SandboxPool | None = None
        """The warm sandboxes (None with ``pool="off"``)."""
        if pool != "off":
            start = partial(_start_warm, self._tools, self._identity, self._cgroups, self.limits.memory_mb << 20,
                            self.limits.file_mb << 20, self.workdir_mb << 20)
            self.pool = SandboxPool(start, pool_size, pool in ("episode", "recycle"), get_loop(), recycle=pool == "recycle")
        self._finalizer = weakref.finalize(self, _cleanup, self._root, self._cgroups, self.pool)
        if self.pool is not None:
            self.pool.fill()

    def _find_cgroups(self) -> MemoryCgroups | None:
        """A usable parent memory cgroup: found, and a sandbox really starts inside a child of it."""
        groups = MemoryCgroups.find()
        if groups is None:
            return None
        probe = groups.create(64 << 20)
        try:
            _try_start(self._tools, self._identity, probe)
        except SandboxUnavailable as e:
            log.warning("sandbox: a sandbox cannot start inside %s (%s); bounding memory by rlimits",
                        groups.describe(), e)
            groups.close()
            return None
        finally:
            probe.remove()
        return groups

    def _rlimit_budget(self) -> tuple[int, int]:
        """Without a cgroup: (processes, MiB each) that fit ``memory_mb`` beside the tmpfs mounts."""
        limits = self.limits
        if self._cgroups is not None:
            return limits.max_procs, limits.memory_mb
        budget = limits.memory_mb - self.workdir_mb - 2 * limits.file_mb
        if budget < MIN_PROCESS_MB:
            raise ValueError(
                f"without a memory cgroup, memory_mb={limits.memory_mb} must hold the tmpfs mounts "
                f"(workdir_mb={self.workdir_mb} + 2 x file_mb={limits.file_mb}) and at least one process "
                f"of {MIN_PROCESS_MB} MiB: raise memory_mb to {self.workdir_mb + 2 * limits.file_mb + MIN_PROCESS_MB} "
                "or more, lower workdir_mb/file_mb, or run where a memory cgroup is writable")
        procs = max(1, min(limits.max_procs, budget // MIN_PROCESS_MB))
        return procs, budget // procs

    # ---------------------------------------------------------------- sessions
    def session_file(self, session: str) -> Path:
        """The host file holding ``session``'s packed working dir (it may not exist yet)."""
        with self._lock:
            if not self._finalizer.alive:
                raise RuntimeError("this SandboxExecutor is closed; get a new one with get_executor('sandbox')")
            path = self._sessions.get(session)
            if path is None:
                fd, name = tempfile.mkstemp(prefix="session-", suffix=".state", dir=self._root)
                os.close(fd)
                path = self._sessions[session] = Path(name)
                self._versions[session] = 0
            return path

    def close_session(self, session: str) -> None:
        with self._lock:
            path = self._sessions.pop(session, None)
            self._versions.pop(session, None)
        if self.pool is not None:
            self.pool.drop_session(session)
        if path is not None:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._sessions.clear()
        self._finalizer()

    def _load(self, state_file: Path) -> bytes:
        """A session's packed files (read and written under the lock, so never half-written)."""
        with self._lock:
            try:
                return state_file.read_bytes()
            except FileNotFoundError:  # closed meanwhile: an empty working dir
                return b""

    # -------------------------------------------------------------------- runs
    async def arun(self, tool: Tool, call: ToolCall, session: str) -> ToolResult:
        program = self.program_of(tool, call)
        if isinstance(program, ToolResult):
            return program
        async with self.slot():
            try:
                result = await asyncio.wait_for(self.run(program, session), self.timeout_s)
            except asyncio.TimeoutError:
                return self.timeout_result(tool, call)
            except SandboxUnavailable as e:
                return unavailable_result(call, tool.name, f"its sandbox did not start: {e}")
            except OSError as e:  # a process, pipe, cgroup or file of the host's could not be made
                return unavailable_result(call, tool.name, f"its sandbox could not be run: {type(e).__name__}: {e}")
        return ToolResult(call, result.message(), "limit" if result.limit else None)

    async def run(self, program: Program, session: str) -> RunResult:
        """Run ``program`` with ``session``'s files under ``self.limits`` (no semaphore).

        Raises:
            SandboxUnavailable: If the sandbox did not start (the message says why).
            OSError: If a process, pipe or cgroup for it could not be made.
        """
        if self.pool is None:
            return await self._run_cold(program, session)
        if asyncio.get_running_loop() is not self.pool.loop:  # warm sandboxes live on the shared loop
            return await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(self._run_warm(program, session), self.pool.loop))
        return await self._run_warm(program, session)

    async def _run_warm(self, program: Program, session: str) -> RunResult:
        """``run`` on a warm sandbox: the session's own if it holds one whose files are current,
        else a fresh one that gets the session's files first."""
        limits, state_file = self.limits, self.session_file(session)
        with self._lock:
            version = self._versions.get(session, 0)
        try:
            sandbox = await self.pool.take(session, version)
        except WarmStartFailed as e:
            raise SandboxUnavailable(f"{e}; {INSTALL_HINT}") from e
        state = self._load(state_file) if sandbox.version != version else b""
        start = time.monotonic()
        try:
            got = await sandbox.call(self._payload(program, state, -1, warm=True) + program.stdin.encode(), limits.output_bytes,
                                     limits.wall_s, (self.workdir_mb << 20) + STATE_OVERHEAD)
        except WarmStartFailed as e:
            self.pool.retire(sandbox)
            raise SandboxUnavailable(str(e)) from e
        except BaseException:
            self.pool.retire(sandbox)
            raise
        duration = time.monotonic() - start
        kept: str | None = None
        if got.state is not None and got.status is not None and got.killed is None:
            with self._lock:
                if self._sessions.get(session) == state_file:  # still open
                    state_file.write_bytes(got.state)
                    version = self._versions[session] = self._versions[session] + 1
                    kept = session
        self.pool.give_back(sandbox, kept, version)
        returncode = got.status if got.status is not None else -signal.SIGKILL
        return verdict(got.output, returncode, got.killed, duration, self._effective,
                       sigkill=_sigkill_cause(got.oom, duration, self._effective.cpu_s))

    async def _run_cold(self, program: Program, session: str) -> RunResult:
        """``run`` in a sandbox started for this call alone. The launcher's pack starts with
        ``b"S"``, written before anything of the program's: a call without it never started."""
        limits, state_file = self.limits, self.session_file(session)
        state = self._load(state_file)
        cgroup = self._cgroups.create(limits.memory_mb << 20) if self._cgroups is not None else None
        state_read, state_write = os.pipe()
        seccomp_fd = _seccomp_pipe()
        cmd = _prefix(self._tools, self._identity, cgroup) + bwrap_command(
            self.bwrap, tmp_bytes=limits.file_mb << 20, workdir_bytes=self.workdir_mb << 20,
            seccomp_fd=seccomp_fd, disable_userns=self._tools.disable_userns)
        start = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=HOST_ENV,
                cwd="/", start_new_session=True, pass_fds=tuple(fd for fd in (seccomp_fd, state_write) if fd is not None))
        except BaseException:
            os.close(state_read)
            if cgroup is not None:
                cgroup.remove()
            raise
        finally:
            os.close(state_write)
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        output = _Output(limits.output_bytes)
        killed: list[LimitHit] = []

        def kill(reason: LimitHit | None) -> None:
            if reason is not None and not killed:
                killed.append(reason)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

        output.on_overflow = lambda: kill("output")
        feeder = asyncio.create_task(_feed(proc.stdin, self._payload(program, state, state_write) + program.stdin.encode()))
        new_state = asyncio.create_task(_read_all(state_read, (self.workdir_mb << 20) + STATE_OVERHEAD))
        readers = [asyncio.create_task(output.pump(proc.stdout, 0)), asyncio.create_task(output.pump(proc.stderr, 1))]
        try:
            await asyncio.wait_for(asyncio.gather(proc.wait(), *readers), limits.wall_s)
        except asyncio.TimeoutError:
            kill("wall")
        finally:
            if proc.returncode is None:
                kill(None)
            feeder.cancel()
            await asyncio.wait([*readers, new_state], timeout=KILL_GRACE_S)
            for task in (*readers, new_state):
                task.cancel()
            try:
                await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
            except asyncio.TimeoutError:
                pass
            oom = cgroup is not None and cgroup.oom_kills() > 0
            if cgroup is not None:
                cgroup.remove()
        duration = time.monotonic() - start
        packed = new_state.result() if new_state.done() and not new_state.cancelled() else None
        if packed == b"":  # (None: more than the cap, or unread; the launcher wrote, so it started)
            raise SandboxUnavailable(f"bubblewrap ({self.bwrap}) exited with status {proc.returncode} before the "
                                     f"sandbox's launcher started: {output.text(1).strip()[:500] or 'no message'}")
        packed = None if packed is None else complete_pack(packed[1:])
        if packed is not None and not killed and proc.returncode is not None:
            with self._lock:
                if self._sessions.get(session) == state_file:  # still open
                    state_file.write_bytes(packed)
        returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        return verdict(output, returncode, killed[0] if killed else None, duration, self._effective,
                       sigkill=_sigkill_cause(oom, duration, self._effective.cpu_s))

    def _payload(self, program: Program, state: bytes, state_fd: int, warm: bool = False) -> bytes:
        """The launcher's input: a length-prefixed spec (JSON; marshalled for the warm server,
        which does without the ``json`` module), then the session's packed files."""
        limits = self.limits
        cpu = max(1, math.ceil(limits.cpu_s))
        memory = self._rlimit_mb << 20
        spec = {
            "files": dict(program.files),
            "argv": list(program.argv),
            "state_fd": state_fd,
            "state_bytes": len(state),
            "limits": [
                ("RLIMIT_CPU", cpu, cpu + 1),
                ("RLIMIT_AS", memory, memory),
                ("RLIMIT_NPROC", self._rlimit_procs, self._rlimit_procs),
                ("RLIMIT_FSIZE", limits.file_mb << 20, limits.file_mb << 20),
                ("RLIMIT_CORE", 0, 0),
            ],
        }
        header = marshal.dumps(spec, 4) if warm else json.dumps(spec).encode()
        return str(len(header)).zfill(HEADER_DIGITS).encode() + header + state


def complete_pack(packed: bytes) -> bytes | None:
    """The records of a cold launcher's pack without its end marker (a zero-length record), or
    None when the marker is not where the records end: the launcher stopped before packing
    (e.g. the program's files could not be written) or during it, and saving what came would
    lose the session's files. Only the length headers are read."""
    at, end = 0, len(packed) - HEADER_DIGITS
    while at < end:
        size = packed[at:at + HEADER_DIGITS]
        if not size.isdigit():
            return None
        at += HEADER_DIGITS + int(size)
    return packed[:end] if at == end and packed[end:] == b"0" * HEADER_DIGITS else None


async def _start_warm(tools: _Bwrap, identity: _Identity, cgroups: MemoryCgroups | None, memory_bytes: int,
                      tmp_bytes: int, workdir_bytes: int) -> WarmSandbox:
    """Start one warm sandbox: the cold run's command, in a cgroup of its own, running the
    warm server (``launcher.py``) on a socket instead of the one-shot launcher."""
    cgroup = cgroups.create(memory_bytes) if cgroups is not None else None
    host_end, sandbox_end = socket.socketpair()
    seccomp_fd = _seccomp_pipe()
    cmd = _prefix(tools, identity, cgroup) + bwrap_command(
        tools.bwrap, tmp_bytes=tmp_bytes, workdir_bytes=workdir_bytes, seccomp_fd=seccomp_fd,
        disable_userns=tools.disable_userns,
        argv=("/usr/bin/python3", "-c", WARM_LAUNCHER, str(sandbox_end.fileno())))
    try:
        return await start_warm(cmd, tuple(fd for fd in (seccomp_fd, sandbox_end.fileno()) if fd is not None),
                                sandbox_end, host_end, cgroup, HOST_ENV)
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)


def _cleanup(root: str, cgroups: MemoryCgroups | None, pool: SandboxPool | None = None) -> None:
    if pool is not None:
        pool.close()
    shutil.rmtree(root, ignore_errors=True)
    if cgroups is not None:
        cgroups.close()


class _Output(OutputCap):
    """``OutputCap`` fed from the sandbox's pipes; ``on_overflow`` kills the sandbox."""

    def __init__(self, cap: int) -> None:
        super().__init__(cap)
        self.on_overflow = lambda: None

    async def pump(self, stream: asyncio.StreamReader, which: int) -> None:
        """Read ``stream`` to EOF, keeping bytes while under the cap."""
        while True:
            chunk = await stream.read(READ_CHUNK)
            if not chunk:
                return
            was = self.truncated
            if self.add(which, chunk) and not was:
                self.on_overflow()  # kills the sandbox; keep draining to EOF so the pipes close


async def _read_all(fd: int, cap: int) -> bytes | None:
    """Everything written to the pipe ``fd`` (closed after), or None past ``cap`` bytes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_CHUNK)
    pipe = os.fdopen(fd, "rb", buffering=0)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    data, too_big = bytearray(), False
    try:
        while chunk := await reader.read(READ_CHUNK):
            if len(data) + len(chunk) > cap:
                too_big = True
            elif not too_big:
                data += chunk
    finally:
        transport.close()
    return None if too_big else bytes(data)


async def _feed(stdin: asyncio.StreamWriter, payload: bytes) -> None:
    """Write the launcher's input and the program's stdin, then close (a dead reader is fine)."""
    try:
        stdin.write(payload)
        await stdin.drain()
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


def _sigkill_cause(oom: bool, duration: float, cpu_s: float) -> LimitHit | None:
    """The limit a SIGKILL the executor did not send means: ``memory`` after an OOM kill;
    ``cpu`` (the hard RLIMIT_CPU) only when the run lasted long enough to have used ``cpu_s``
    of CPU on this machine's cores; else None, the program killed itself or its parent (e.g.
    ``kill -9 $$``) and is told the signal."""
    if oom:
        return "memory"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return "cpu" if duration * cores >= cpu_s else None

"""The bubblewrap sandbox executor: model-written programs in throwaway namespaces, under limits.

Each run is one ``bwrap`` process: new user, pid, net, ipc, uts and cgroup namespaces (the
network namespace has only its own loopback: nothing outside is reachable), read-only
``/usr`` (and the ``/bin``, ``/lib*`` links or dirs), a few loader files from ``/etc`` (never
``/etc`` as a whole), a private ``/proc``, a minimal ``/dev``, a small tmpfs ``/tmp`` and the
session's working dir bound read-write at ``/work`` (cwd and ``HOME``). The environment is
cleared. The project checkout, the venv and the rest of the host are not mounted: programs
run the system ``/usr/bin/python3``. Run as root, the sandbox drops to an unprivileged uid
(``nobody``) first, so kernel limits apply and host files keep their owner's protection.

Inside, a small launcher writes the ``Program.files`` (as the sandbox user, so links planted
by an earlier run cannot redirect the writes onto the host), sets RLIMIT_CPU, RLIMIT_AS,
RLIMIT_NPROC, RLIMIT_FSIZE (and no core dumps), then execs ``argv``. The executor kills the
whole sandbox after ``wall_s`` or once stdout+stderr exceed ``output_bytes``. Which limit
stopped a run is read from the exit status (SIGXCPU/SIGKILL: cpu, SIGXFSZ: file) and from
the program's own error text (MemoryError, EAGAIN on fork, EFBIG).

Not bounded: the total disk space of a session's working dir (each file is capped by
``file_mb``); sessions are deleted by ``close_session``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from turnrl.tools.execute import ToolResult
from turnrl.tools.executors.base import EXECUTORS, Executor, LimitHit, Limits, Program, RunResult
from turnrl.tools.executors.verdict import OutputCap, verdict
from turnrl.tools.parsers import ToolCall
from turnrl.tools.tool import Tool

__all__ = ["SandboxExecutor", "SandboxUnavailable", "bwrap_command"]

INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)"
NOBODY = 65534
SANDBOX_HOME = "/work"
SANDBOX_PATH = "/usr/bin:/bin"
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime")
TOP_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
READ_CHUNK = 65_536
HEADER_DIGITS = 16
KILL_GRACE_S = 2.0
"""After killing a sandbox, seconds to wait for its pipes to close."""

LAUNCHER = r"""
import json, os, resource, signal, sys
def read_exact(n):
    parts = []
    while n:
        b = os.read(0, n)
        if not b:
            sys.exit("turnrl sandbox: the launcher header was cut short")
        parts.append(b)
        n -= len(b)
    return b"".join(parts)
spec = json.loads(read_exact(int(read_exact(%d))))
for rel, text in spec["files"].items():
    parent = os.path.dirname(rel)
    if parent:
        os.makedirs(parent, exist_ok=True)
    if os.path.islink(rel):
        os.unlink(rel)
    with open(rel, "w", encoding="utf-8") as f:
        f.write(text)
for name, soft, hard in spec["limits"]:
    resource.setrlimit(getattr(resource, name), (soft, hard))
for sig in (signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(sig, signal.SIG_DFL)
argv = spec["argv"]
try:
    os.execvp(argv[0], argv)
except OSError as e:
    sys.stderr.write("cannot run %%r: %%s\n" %% (argv[0], e.strerror))
    sys.exit(127)
""" % HEADER_DIGITS

class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create the namespaces it needs on this machine."""


@dataclass(frozen=True)
class _Identity:
    """Who runs bwrap: None = this process's own user, else the uid/gid to drop to (as root)."""

    uid: int | None
    gid: int | None

    def popen_kwargs(self) -> dict[str, Any]:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def bwrap_command(bwrap: str, *, workdir: str, tmp_bytes: int, argv: tuple[str, ...] | None = None) -> list[str]:
    """The ``bwrap`` argv for a run of ``argv`` (default: the launcher) in ``workdir``."""
    cmd = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox",
           "--ro-bind", "/usr", "/usr"]
    for top in TOP_DIRS:
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    for path in ETC_FILES:
        cmd += ["--ro-bind-try", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(tmp_bytes), "--tmpfs", "/tmp",
            "--bind", workdir, SANDBOX_HOME, "--remount-ro", "/", "--chdir", SANDBOX_HOME,
            "--clearenv", "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", SANDBOX_HOME,
            "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            "--", *(argv or ("/usr/bin/python3", "-I", "-S", "-c", LAUNCHER))]
    return cmd


def _identity(run_as: int | None | str) -> _Identity:
    if run_as == "auto":
        return _Identity(NOBODY, NOBODY) if os.geteuid() == 0 else _Identity(None, None)
    if run_as is None:
        return _Identity(None, None)
    if isinstance(run_as, bool) or not isinstance(run_as, int) or run_as < 0:
        raise ValueError(f"run_as must be 'auto', None or a uid >= 0, got {run_as!r}")
    return _Identity(run_as, run_as)


@lru_cache(maxsize=None)
def _probe(bwrap: str, identity: _Identity) -> None:
    """Start one trivial sandbox; raise ``SandboxUnavailable`` saying why it failed."""
    with tempfile.TemporaryDirectory(prefix="turnrl-sandbox-probe-") as tmp:
        if identity.uid is not None:
            os.chown(tmp, identity.uid, identity.gid)
        cmd = bwrap_command(bwrap, workdir=tmp, tmp_bytes=1 << 20, argv=("/usr/bin/true",))
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, **identity.popen_kwargs())
        except (OSError, subprocess.SubprocessError) as e:
            raise SandboxUnavailable(f"bubblewrap ({bwrap}) could not be started: {e}; {INSTALL_HINT}") from e
    if done.returncode != 0:
        raise SandboxUnavailable(
            f"bubblewrap ({bwrap}) cannot create its namespaces here (exit {done.returncode}: "
            f"{done.stderr.strip()}); {INSTALL_HINT} and allow unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0)"
        )


@EXECUTORS.register("sandbox")
class SandboxExecutor(Executor):
    """Runs code tools (their fn returns a ``Program``) in a bubblewrap sandbox.

    Each session (episode) gets a private working dir, created on first use and deleted by
    ``close_session``/``close`` (and at interpreter exit); files persist across the calls
    of one session only. See the module docstring for what the sandbox exposes.

    Args:
        limits: Per-run limits (a ``Limits`` or a mapping of its fields).
        max_concurrency: Sandboxes that may run at once, over all sessions.
        timeout_s: Seconds one call may take in all (a backstop above ``limits.wall_s``).
        bwrap: The bubblewrap binary (name on PATH or path).
        run_as: ``"auto"`` (drop to uid 65534 when running as root, else stay), None (stay)
            or a uid to drop to (needs root).

    Raises:
        SandboxUnavailable: If bwrap is missing or cannot create namespaces; the message
            says ``apt-get install bubblewrap``.
    """

    kind = "sandbox"

    def __init__(self, limits: Limits | Mapping[str, Any] | None = None, *, max_concurrency: int = 8,
                 timeout_s: float = 60.0, bwrap: str = "bwrap", run_as: int | None | str = "auto") -> None:
        super().__init__(max_concurrency=max_concurrency, timeout_s=timeout_s)
        self.limits = Limits.coerce(limits)
        found = shutil.which(bwrap)
        if found is None:
            raise SandboxUnavailable(
                f"the sandbox executor needs bubblewrap, but {bwrap!r} is not on PATH; {INSTALL_HINT}")
        self.bwrap = found
        self._identity = _identity(run_as)
        _probe(self.bwrap, self._identity)
        self._root = tempfile.mkdtemp(prefix="turnrl-sandbox-")
        os.chmod(self._root, 0o711)
        self._sessions: dict[str, str] = {}
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._root, ignore_errors=True)

    # ---------------------------------------------------------------- sessions
    def workdir(self, session: str) -> str:
        """The host path of ``session``'s working dir (created on first use)."""
        with self._lock:
            if not self._finalizer.alive:
                raise RuntimeError("this SandboxExecutor is closed; get a new one with get_executor('sandbox')")
            path = self._sessions.get(session)
            if path is None:
                path = tempfile.mkdtemp(prefix="session-", dir=self._root)
                if self._identity.uid is not None:
                    os.chown(path, self._identity.uid, self._identity.gid)
                os.chmod(path, 0o700)
                self._sessions[session] = path
            return path

    def close_session(self, session: str) -> None:
        with self._lock:
            path = self._sessions.pop(session, None)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            self._sessions.clear()
        self._finalizer()

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
        return ToolResult(call, result.message(), "limit" if result.limit else None)

    async def run(self, program: Program, session: str) -> RunResult:
        """Run ``program`` in ``session``'s working dir under ``self.limits`` (no semaphore)."""
        limits, workdir = self.limits, self.workdir(session)
        payload = self._payload(program)
        cmd = bwrap_command(self.bwrap, workdir=workdir, tmp_bytes=limits.file_mb << 20)
        start = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, **self._identity.popen_kwargs())
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
        feeder = asyncio.create_task(_feed(proc.stdin, payload))
        readers = [asyncio.create_task(output.pump(proc.stdout, 0)), asyncio.create_task(output.pump(proc.stderr, 1))]
        try:
            await asyncio.wait_for(asyncio.gather(proc.wait(), *readers), limits.wall_s)
        except asyncio.TimeoutError:
            kill("wall")
        finally:
            if proc.returncode is None:
                kill(None)
            feeder.cancel()
            await asyncio.wait(readers, timeout=KILL_GRACE_S)
            for reader in readers:
                reader.cancel()
            try:
                await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
            except asyncio.TimeoutError:
                pass
        duration = time.monotonic() - start
        returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        return _judge(output, returncode, killed[0] if killed else None, duration, limits)

    def _payload(self, program: Program) -> bytes:
        limits = self.limits
        cpu = max(1, math.ceil(limits.cpu_s))
        spec = {
            "files": dict(program.files),
            "argv": list(program.argv),
            "limits": [
                ("RLIMIT_CPU", cpu, cpu + 1),
                ("RLIMIT_AS", limits.memory_mb << 20, limits.memory_mb << 20),
                ("RLIMIT_NPROC", limits.max_procs, limits.max_procs),
                ("RLIMIT_FSIZE", limits.file_mb << 20, limits.file_mb << 20),
                ("RLIMIT_CORE", 0, 0),
            ],
        }
        header = json.dumps(spec).encode()
        return str(len(header)).zfill(HEADER_DIGITS).encode() + header + program.stdin.encode()


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


async def _feed(stdin: asyncio.StreamWriter, payload: bytes) -> None:
    """Write the launcher header and the program's stdin, then close (a dead reader is fine)."""
    try:
        stdin.write(payload)
        await stdin.drain()
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


def _judge(output: _Output, returncode: int, killed: LimitHit | None, duration: float, limits: Limits) -> RunResult:
    """Decide the exit code and which limit (if any) stopped the run (``verdict.verdict``; an
    unsent SIGKILL is the hard RLIMIT_CPU)."""
    return verdict(output, returncode, killed, duration, limits, sigkill="cpu")

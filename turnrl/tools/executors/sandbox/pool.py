"""Warm bubblewrap sandboxes for ``SandboxExecutor(pool="call" | "episode" | "recycle")``: started
ahead of the calls, each running the trusted server of ``launcher.py`` as its pid 1. With
``call`` and ``episode`` no sandbox ever serves two sessions (episodes); with ``recycle`` a
sandbox whose session ended is wiped by its server and serves another.

A ``WarmSandbox`` is one started sandbox: the same ``bwrap`` command, namespaces, seccomp filter,
uid drop and memory cgroup (one per sandbox) as a cold run, plus a Unix socket to its server.
A call hands the server fresh pipes (SCM_RIGHTS): the input (spec, the session's packed files
when the sandbox is fresh, the program's stdin), stdout, stderr and the packed files going out.
The host bounds the call as it bounds a cold run: it kills the whole sandbox after ``wall_s`` or
once the output passes ``output_bytes``, and a killed sandbox is never reused.

``SandboxPool`` keeps ``size`` fresh sandboxes started (refilled in the background as calls take
them). With ``per_episode`` a sandbox that finished a call cleanly stays bound to that call's
session, for the session's next call only; it is retired (killed, its cgroup removed) when the
session closes, when a call of it is killed, when its scratch dirs could not be emptied, when
its files fell behind the session's (overlapping calls of one session), or when more than
``KEPT_SESSIONS`` sessions hold one. Without ``per_episode`` every sandbox serves one call.
With ``recycle`` (and ``per_episode``) a sandbox that would be retired alive and clean, because
its session closed or was evicted, is wiped instead (``WarmSandbox.wipe``: the server kills every
process, empties every writable dir and removes the IPC objects, and says whether all of it is
gone) and goes back among the fresh ones; one that does not answer clean within
``WIPE_TIMEOUT_S`` is retired. At most ``size`` sandboxes (1 with ``size=0``) wait idle, recycled or
fresh: sessions that ended side by side leave no more warm sandboxes than the pool was asked to keep.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from turnrl.tools.executors.base import LimitHit
from turnrl.tools.executors.sandbox.cgroup import RunCgroup
from turnrl.tools.executors.verdict import OutputCap

__all__ = ["KEPT_SESSIONS", "POOL_MODES", "WARM_LAUNCHER", "SandboxPool", "WarmCall", "WarmSandbox", "WarmStartFailed", "start_warm"]

POOL_MODES = ("off", "call", "episode", "recycle")
WARM_LAUNCHER = (Path(__file__).with_name("launcher.py")).read_text()
"""The server's source, run inside each warm sandbox with ``python3 -c``."""
KEPT_SESSIONS = 64
"""At most this many sessions keep a warm sandbox between their calls (the least recent go)."""
START_TIMEOUT_S = 30.0
READ_CHUNK = 65_536
KILL_GRACE_S = 2.0
CGROUP_GRACE_S = 5.0
WIPE_TIMEOUT_S = 5.0


class WarmStartFailed(RuntimeError):
    """A warm sandbox cannot take a call: it did not start (its server never said it was
    ready), or it was gone before the call reached it."""


@dataclass
class WarmCall:
    """What one call on a warm sandbox gave: output, exit status (None: the sandbox died or was
    killed), the limit for which the host killed it, the packed working dir (None when it did
    not arrive whole or within ``state_cap``), and whether the kernel's OOM killer struck."""

    output: OutputCap
    status: int | None
    killed: LimitHit | None
    state: bytes | None
    oom: bool


@dataclass(eq=False)
class WarmSandbox:
    """One started warm sandbox (``proc`` is bwrap, ``control`` the host's end of the socket)."""

    proc: asyncio.subprocess.Process
    control: socket.socket
    cgroup: RunCgroup | None
    version: int = -1
    """The session-file version its ``/work`` holds (-1: fresh, ``/work`` empty)."""
    clean: bool = True
    killed: bool = field(default=False, repr=False)
    drain: asyncio.Task | None = field(default=None, repr=False)
    """The task that reads bwrap's own stderr so it never blocks on a full pipe."""

    @property
    def alive(self) -> bool:
        return not self.killed and self.proc.returncode is None

    def kill(self) -> None:
        """SIGKILL bwrap's process group; the sandbox dies with it (``--die-with-parent``)."""
        self.killed = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    async def reap(self) -> None:
        """Kill, wait for bwrap, close the socket and remove the cgroup once it is empty."""
        self.kill()
        try:
            await asyncio.wait_for(self.proc.wait(), KILL_GRACE_S)
        except asyncio.TimeoutError:
            pass
        self.control.close()
        if self.drain is not None:
            self.drain.cancel()
        if self.cgroup is not None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + CGROUP_GRACE_S
            while not self.cgroup.remove(timeout_s=0) and loop.time() < deadline:
                await asyncio.sleep(0.02)

    async def call(self, payload: bytes, output_bytes: int, wall_s: float, state_cap: int) -> WarmCall:
        """Run one program: ``payload`` is the server's whole input (spec, files, stdin).

        Raises:
            WarmStartFailed: If the sandbox was gone before the call reached it (it is killed).
        """
        loop = asyncio.get_running_loop()
        source, source_w = os.pipe()
        out_r, out = os.pipe()
        err_r, err = os.pipe()
        state_r, state = os.pipe()
        oom_before = self.cgroup.oom_kills() if self.cgroup is not None else 0
        try:
            socket.send_fds(self.control, [b"C"], [source, out, err, state])
        except OSError as e:
            for fd in (source_w, out_r, err_r, state_r):
                os.close(fd)
            self.kill()
            raise WarmStartFailed(f"the warm sandbox was gone before the call reached it ({e})") from None
        finally:
            for fd in (source, out, err, state):
                os.close(fd)
        output = OutputCap(output_bytes)
        killed: list[LimitHit] = []

        def stop(reason: LimitHit) -> None:
            if not killed:
                killed.append(reason)
            self.kill()

        def keep(which: int) -> Callable[[bytes], None]:
            def add(chunk: bytes) -> None:
                was = output.truncated
                if output.add(which, chunk) and not was:
                    stop("output")  # kills the sandbox; keep draining to EOF so the pipes close
            return add

        feeder = loop.create_task(_write_all(source_w, payload))
        readers = [loop.create_task(_read_fd(out_r, keep(0))), loop.create_task(_read_fd(err_r, keep(1)))]
        packed = bytearray()
        too_big: list[bool] = []

        def add_state(chunk: bytes) -> None:
            if too_big or len(packed) + len(chunk) > state_cap:
                too_big.append(True)
            else:
                packed.extend(chunk)

        state_reader = loop.create_task(_read_fd(state_r, add_state))
        answer = loop.create_task(self._answer())
        try:
            await asyncio.wait_for(asyncio.gather(answer, *readers), wall_s)
        except asyncio.TimeoutError:
            stop("wall")
        finally:
            if not answer.done() or answer.cancelled() or answer.result() is None:
                self.kill()
            feeder.cancel()
            await asyncio.wait([*readers, state_reader], timeout=KILL_GRACE_S)
            for task in (*readers, state_reader, answer):
                task.cancel()
        status: int | None = None
        packed_whole = False
        if answer.done() and not answer.cancelled() and answer.result() is not None and not killed:
            status, self.clean, packed_whole = answer.result()
            self.clean = self.clean and packed_whole
        state_done = packed_whole and state_reader.done() and not state_reader.cancelled() and not too_big
        oom = self.cgroup is not None and self.cgroup.oom_kills() > oom_before
        return WarmCall(output, status, killed[0] if killed else None, bytes(packed) if state_done else None, oom)

    async def wipe(self) -> bool:
        """Have the server make this sandbox as a fresh one (kill every process, empty ``/work``,
        ``/tmp`` and ``/dev/shm``, remove the IPC objects); True when it says all of it is gone
        within ``WIPE_TIMEOUT_S``. The sandbox then holds no session's files (``version`` -1).
        On False it is killed: it must not serve again."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.sock_sendall(self.control, b"W"), WIPE_TIMEOUT_S)
            line = await asyncio.wait_for(self._line(), WIPE_TIMEOUT_S)
        except (asyncio.TimeoutError, OSError):
            line = None
        if line != b"1\n" or not self.alive:
            self.kill()
            return False
        self.version, self.clean = -1, True
        return True

    async def _answer(self) -> tuple[int, bool, bool] | None:
        """The server's ``b"<status> <clean> <packed>\\n"`` (None if the socket closed first)."""
        line = await self._line()
        try:
            status, clean, packed = line.split()
            return int(status), clean == b"1", packed == b"1"
        except (AttributeError, ValueError):
            return None

    async def _line(self) -> bytes | None:
        """The server's next answer line (None if the socket closed first or it is too long)."""
        loop = asyncio.get_running_loop()
        line = b""
        while not line.endswith(b"\n"):
            try:
                chunk = await loop.sock_recv(self.control, 64)
            except OSError:
                return None
            if not chunk or len(line) > 64:
                return None
            line += chunk
        return line


class SandboxPool:
    """Fresh warm sandboxes kept started, and the sandboxes sessions hold between calls.

    Args:
        start: Starts one warm sandbox (raises ``WarmStartFailed`` when it cannot).
        size: Fresh sandboxes kept started.
        per_episode: Whether a sandbox serves the following calls of its session (else one call).
        loop: The event loop every sandbox of the pool runs on.
        recycle: Whether a sandbox whose session ended is wiped and serves another session
            (needs ``per_episode``).
    """

    def __init__(self, start: Callable[[], Awaitable[WarmSandbox]], size: int, per_episode: bool,
                 loop: asyncio.AbstractEventLoop, recycle: bool = False) -> None:
        if recycle and not per_episode:
            raise ValueError("recycle=True needs per_episode=True: a sandbox is recycled when its session ends")
        self._start = start
        self.size = size
        self.per_episode = per_episode
        self.recycle = recycle
        self.loop = loop
        self._idle: list[WarmSandbox] = []
        self._bound: OrderedDict[str, WarmSandbox] = OrderedDict()
        self._live: set[WarmSandbox] = set()
        self._starting = 0
        self._wiping = 0
        self._tasks: set[asyncio.Task] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.started = 0
        """Sandboxes started so far (fresh ones for the pool and ones started on demand)."""
        self.recycled = 0
        """Sandboxes wiped clean and put back among the fresh ones so far."""

    def fill(self) -> None:
        """Start sandboxes in the background until ``size`` fresh ones are idle or starting
        (thread-safe)."""
        self.loop.call_soon_threadsafe(self._fill)

    def _fill(self) -> None:
        with self._lock:
            missing = 0 if self._closed else self.size - len(self._idle) - self._starting - self._wiping
            self._starting += max(missing, 0)
        for _ in range(missing):
            self._spawn(self._refill_one())

    async def _refill_one(self) -> None:
        try:
            sandbox = await self._new()
        except Exception:  # the next take starts one itself and reports why it cannot
            with self._lock:
                self._starting -= 1
            return
        with self._lock:
            self._starting -= 1
            # (recycled sandboxes may have filled the idle places while this one started)
            keep = not self._closed and len(self._idle) < max(self.size, 1)
            if keep:
                self._idle.append(sandbox)
        if not keep:
            await self._reap(sandbox)

    async def _new(self) -> WarmSandbox:
        sandbox = await self._start()
        with self._lock:
            self.started += 1
            self._live.add(sandbox)
            closed = self._closed
        if closed:
            await sandbox.reap()
            raise RuntimeError("this SandboxExecutor is closed; get a new one with get_executor('sandbox')")
        return sandbox

    async def take(self, session: str, version: int) -> WarmSandbox:
        """The sandbox for a call of ``session`` whose files are at ``version``: the one the
        session holds if its files are that version, else a fresh one (``version == -1``)."""
        with self._lock:
            held = self._bound.pop(session, None)
        if held is not None:
            if held.alive and held.clean and held.version == version:
                return held
            self.retire(held)
        while True:
            with self._lock:
                sandbox = self._idle.pop() if self._idle else None
            self._fill()
            if sandbox is None:
                return await self._new()
            if sandbox.alive:
                return sandbox
            self.retire(sandbox)

    def give_back(self, sandbox: WarmSandbox, session: str | None, version: int) -> None:
        """After a call: keep ``sandbox`` for ``session``'s next call (its files now at
        ``version``) if the pool is per episode and it may serve again, else retire it.
        ``session`` None: the session closed meanwhile."""
        keep = self.per_episode and session is not None and sandbox.alive and sandbox.clean
        evicted: list[WarmSandbox] = []
        with self._lock:
            if keep and not self._closed and session not in self._bound:
                sandbox.version = version
                self._bound[session] = sandbox
                while len(self._bound) > KEPT_SESSIONS:
                    evicted.append(self._bound.popitem(last=False)[1])
            else:
                evicted.append(sandbox)
        for old in evicted:
            self.release(old)

    def drop_session(self, session: str) -> None:
        """Release the sandbox ``session`` holds, if any (thread-safe)."""
        with self._lock:
            held = self._bound.pop(session, None)
        if held is not None:
            self.release(held)

    def release(self, sandbox: WarmSandbox) -> None:
        """A sandbox no session holds any more: wiped and put back among the fresh ones when the
        pool recycles and it is alive and clean, else retired (thread-safe)."""
        if not (self.recycle and sandbox.alive and sandbox.clean) or self.loop.is_closed():
            self.retire(sandbox)
            return
        with self._lock:
            self._wiping += 1
        try:
            self.loop.call_soon_threadsafe(lambda: self._spawn(self._recycle(sandbox)))
        except RuntimeError:  # the loop closed meanwhile (interpreter shutdown)
            with self._lock:
                self._wiping -= 1
            sandbox.kill()

    async def _recycle(self, sandbox: WarmSandbox) -> None:
        wiped = await sandbox.wipe()
        with self._lock:
            self._wiping -= 1
            keep = wiped and not self._closed and len(self._idle) < max(self.size, 1)  # no more warm than asked
            if keep:
                self._idle.append(sandbox)
                self.recycled += 1
        if not keep:
            await self._reap(sandbox)

    def retire(self, sandbox: WarmSandbox) -> None:
        """Kill ``sandbox`` now and clean up after it on the pool's loop (thread-safe)."""
        sandbox.kill()

        def reap() -> None:
            self._spawn(self._reap(sandbox))

        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(reap)

    async def _reap(self, sandbox: WarmSandbox) -> None:
        await sandbox.reap()
        with self._lock:
            self._live.discard(sandbox)

    def _spawn(self, coro) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def held(self, session: str) -> WarmSandbox | None:
        """The sandbox ``session`` holds between its calls, if any."""
        with self._lock:
            return self._bound.get(session)

    def counts(self) -> dict[str, int]:
        """How many sandboxes are idle (fresh), held by sessions, starting, being wiped, and alive
        in all."""
        with self._lock:
            return {"idle": len(self._idle), "held": len(self._bound), "starting": self._starting,
                    "wiping": self._wiping, "live": len(self._live)}

    def close(self) -> None:
        """Kill every sandbox of the pool now (thread-safe); nothing starts after."""
        with self._lock:
            self._closed = True
            sandboxes = list(self._live)
            self._idle.clear()
            self._bound.clear()
        for sandbox in sandboxes:
            self.retire(sandbox)


async def start_warm(cmd: list[str], pass_fds: tuple[int, ...], sandbox_end: socket.socket,
                     host_end: socket.socket, cgroup: RunCgroup | None, env: dict[str, str]) -> WarmSandbox:
    """Spawn ``cmd`` (bwrap running the warm server on ``sandbox_end``) and wait until it is ready.

    Raises:
        WarmStartFailed: If it exits or does not answer within ``START_TIMEOUT_S``.
    """
    loop = asyncio.get_running_loop()
    host_end.setblocking(False)
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd="/",
            start_new_session=True, pass_fds=pass_fds)
    except BaseException:
        host_end.close()
        if cgroup is not None:
            cgroup.remove()
        raise
    finally:
        sandbox_end.close()
    sandbox = WarmSandbox(proc, host_end, cgroup)
    try:
        ready = await asyncio.wait_for(loop.sock_recv(host_end, 1), START_TIMEOUT_S)
    except (asyncio.TimeoutError, OSError):
        ready = b""
    if ready != b"R":
        await sandbox.reap()
        err = b""
        if proc.stderr is not None:
            try:
                err = await asyncio.wait_for(proc.stderr.read(4096), 1.0)
            except asyncio.TimeoutError:
                pass
        raise WarmStartFailed(f"a warm sandbox did not start (exit {proc.returncode}): "
                              f"{err.decode(errors='replace').strip()}")
    sandbox.drain = loop.create_task(_discard(proc.stderr))
    return sandbox


async def _discard(stream: asyncio.StreamReader | None) -> None:
    """Drain bwrap's stderr (its own messages) so it never blocks on a full pipe."""
    if stream is None:
        return
    while await stream.read(READ_CHUNK):
        pass


async def _ready(fd: int, add, remove) -> None:
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    add(fd, lambda: future.done() or future.set_result(None))
    try:
        await future
    finally:
        remove(fd)


async def _read_fd(fd: int, sink: Callable[[bytes], None]) -> None:
    """Read the pipe ``fd`` to EOF into ``sink``, then close it."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    try:
        while True:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                await _ready(fd, loop.add_reader, loop.remove_reader)
                continue
            if not chunk:
                return
            sink(chunk)
    finally:
        os.close(fd)


async def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to the pipe ``fd``, then close it (a reader that went away is fine)."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                await _ready(fd, loop.add_writer, loop.remove_writer)
    except OSError:  # BrokenPipeError: the program ended without reading all its stdin
        pass
    finally:
        os.close(fd)

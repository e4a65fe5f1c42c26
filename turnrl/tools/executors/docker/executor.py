"""The docker executor: code tools run in a container per session, under limits.

Each session (episode) gets its own container from ``image``: by default
``turnrl-sandbox:bookworm``, built from Debian packages by ``python -m turnrl build-docker-image``
(no image registry needed); any image with ``python3`` on its PATH works, e.g.
``python:3.11-slim`` where the engine can pull it. Containers are started ahead of need and
kept warm in a pool of ``pool_size``; a session takes one on its first call, keeps it (files
persist across the session's calls) and ``close_session`` removes it, so nothing leaks from one
episode to the next. A container has no network (``network_mode="none"``), a read-only root
filesystem with a tmpfs working dir ``/work`` and ``/tmp``, both owned by the session's uid
(the tmpfs ``uid=``/``gid=`` options: a tmpfs ``mode=`` is not enough, as the runc of docker
20.10 replaces it with the mode of the directory docker creates for ``working_dir``), no
capabilities, ``no-new-privileges``, a memory cgroup cap, a pids cap, ``cpus`` CPUs and
ulimits for CPU time, file size and core dumps. Its main process is ``sleep ttl_s`` under
docker's init, with ``auto_remove``: a container ends and disappears after its TTL even if
the process that started it crashed; each also carries labels (``turnrl.executor``,
``turnrl.expires-at``) that the reaper of any later executor uses to remove stale ones.

A run is one ``docker exec`` of a small Python launcher as the container's own unprivileged
uid (a random uid >= 200000, so the RLIMIT_NPROC of one container never counts another's
processes): it writes ``Program.files`` into ``/work``, feeds ``Program.stdin`` from an
unlinked temp file, sets RLIMIT_CPU, RLIMIT_AS (``memory_mb``), RLIMIT_NPROC
(``max_procs``), RLIMIT_FSIZE and RLIMIT_CORE, then execs ``argv``. The executor kills every
process of the session (``kill(-1)`` as that uid) after ``wall_s`` or once stdout+stderr
exceed ``output_bytes``; if that does not end the run, the container itself is killed and
the session gets a fresh one on its next call. Which limit stopped a run is read as in the
sandbox executor (exit signal and the program's error text). A SIGKILL the executor did not
send is the memory cgroup's OOM killer only when the container's OOM kill count (its cgroup's
``memory.events``, or ``memory.oom_control`` under cgroup v1) went up since the last such
check; otherwise the program killed itself (e.g. ``kill -9 $PPID``: the parent of a
``docker exec`` is outside the container, so that is ``kill(0)``, its own process group) and
is told it was killed by SIGKILL.

Everything that does not need an engine is a pure function or class here
(``container_options``, ``expired_containers``, ``ContainerPool``, ``launcher_argv``,
``OutputCap``, ``judge``), tested without one.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from turnrl.tools.execute import ToolResult, unavailable_result
from turnrl.tools.executors.base import EXECUTORS, Executor, LimitHit, Limits, Program, RunResult
from turnrl.tools.executors.docker.image import BUILD_HINT, DEFAULT_IMAGE
from turnrl.tools.executors.verdict import OutputCap, verdict
from turnrl.tools.parsers import ToolCall
from turnrl.tools.tool import Tool

__all__ = [
    "DEFAULT_IMAGE",
    "Box",
    "ContainerPool",
    "DockerConfig",
    "DockerExecutor",
    "DockerUnavailable",
    "OutputCap",
    "connect",
    "container_options",
    "docker_address",
    "expired_containers",
    "judge",
    "launcher_argv",
]

EXECUTOR_LABEL = "turnrl.executor"
"""Label on every container of this executor (value ``"docker"``): what the reaper lists."""
EXPIRES_LABEL = "turnrl.expires-at"
"""Label: unix time (seconds) after which any reaper may remove the container."""
OWNER_LABEL = "turnrl.owner"
"""Label: the executor instance that started the container (``close`` removes its own)."""
UID_LABEL = "turnrl.uid"
"""Label: the uid the container's runs use."""
WORKDIR = "/work"
UID_MIN, UID_MAX = 200_000, 2**31 - 2
RESERVED_PROCS = 8
"""pids above ``max_procs`` for the container's init, its ``sleep`` and the kill exec."""
MEMORY_HEADROOM_MB = 64
ARG_CHUNK_CHARS = 100_000
"""The launcher's spec is split into argv strings of at most this size (Linux caps one at 128 KiB)."""
MAX_SPEC_CHARS = 1_000_000
"""Largest ``Program`` (files + stdin + argv, JSON-encoded) the executor passes to a run."""
KILL_GRACE_S = 2.0
"""After killing a run's processes, seconds to wait for its exec to end before killing the container."""
REAP_EVERY_S = 60.0

LAUNCHER = r"""
import json, os, resource, signal, sys, tempfile
spec = json.loads("".join(sys.argv[1:]))
for rel, text in spec["files"].items():
    parent = os.path.dirname(rel)
    if parent:
        os.makedirs(parent, exist_ok=True)
    if os.path.islink(rel):
        os.unlink(rel)
    with open(rel, "w", encoding="utf-8") as f:
        f.write(text)
stdin = tempfile.TemporaryFile()
stdin.write(spec["stdin"].encode("utf-8"))
stdin.flush()
stdin.seek(0)
os.dup2(stdin.fileno(), 0)
stdin.close()
for name, soft, hard in spec["limits"]:
    resource.setrlimit(getattr(resource, name), (soft, hard))
for sig in (signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(sig, signal.SIG_DFL)
argv = spec["argv"]
try:
    os.execvp(argv[0], argv)
except OSError as e:
    sys.stderr.write("cannot run %r: %s\n" % (argv[0], e.strerror))
    sys.exit(127)
"""
KILL_ALL = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept ProcessLookupError:\n    pass\n"
"""Run as a session's uid: kills every process of that uid in the container but the caller."""
OOM_KILLS = ("for path in ('/sys/fs/cgroup/memory.events', '/sys/fs/cgroup/memory/memory.oom_control'):\n"
             "    try:\n        lines = open(path).read().splitlines()\n    except OSError:\n        continue\n"
             "    print(dict(line.split(' ', 1) for line in lines if ' ' in line).get('oom_kill', ''))\n    break\n")
"""Prints the container's OOM kill count (cgroup v2, else v1), or nothing where none is read."""


class DockerUnavailable(RuntimeError):
    """No docker engine answers, or the image cannot be had."""


def docker_address(base_url: str | None = None) -> str:
    """Where the docker SDK looks for the engine: ``base_url``, ``$DOCKER_HOST`` or the default socket."""
    return base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


@dataclass(frozen=True)
class DockerConfig:
    """How the executor's containers are made.

    Attributes:
        image: Image of every container (needs ``python3`` on its PATH). The default is built
            locally by ``python -m turnrl build-docker-image``.
        pool_size: Warm containers kept ready for new sessions (0: start one per session on demand).
        ttl_s: Seconds a container lives at most (its ``sleep``; also the expiry label). Keep it
            longer than an episode: a session whose container expired loses its files.
        cpus: CPUs a container may use (``nano_cpus``).
        workdir_mb: Size of the tmpfs working dir ``/work``.

    Raises:
        ValueError: If a value is out of range.
    """

    image: str = DEFAULT_IMAGE
    pool_size: int = 2
    ttl_s: float = 3600.0
    cpus: float = 1.0
    workdir_mb: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.image, str) or not self.image:
            raise ValueError(f"image must be an image name such as {DEFAULT_IMAGE!r}, got {self.image!r}")
        if isinstance(self.pool_size, bool) or not isinstance(self.pool_size, int) or self.pool_size < 0:
            raise ValueError(f"pool_size must be an int >= 0, got {self.pool_size!r}")
        for name in ("ttl_s", "cpus", "workdir_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.ttl_s < 60:
            raise ValueError(f"ttl_s must be at least 60 s (longer than an episode), got {self.ttl_s!r}")

    @property
    def min_life_s(self) -> float:
        """A warm container is handed to a new session only with at least this long to live."""
        return self.ttl_s / 2


def container_options(limits: Limits, config: DockerConfig, *, owner: str, uid: int, now: float) -> dict[str, Any]:
    """The keyword arguments of ``client.containers.run`` for one session container.

    Args:
        limits: The per-run limits (ulimits and cgroup caps are derived from them).
        config: Image, TTL, CPUs and tmpfs size.
        owner: Value of the owner label (the executor instance).
        uid: The uid the container's runs use (its label, and the owner of ``/work`` and ``/tmp``).
        now: Unix time of creation (the expiry label is ``now + ttl_s``).
    """
    from docker.types import Ulimit

    cpu = max(1, math.ceil(limits.cpu_s))
    file_bytes = limits.file_mb << 20
    tmp_mb = limits.file_mb + 8
    return {
        "image": config.image,
        "command": ["sleep", str(int(config.ttl_s))],
        "detach": True,
        "auto_remove": True,
        "init": True,
        "network_disabled": True,
        "network_mode": "none",
        "mem_limit": f"{limits.memory_mb + config.workdir_mb + tmp_mb + MEMORY_HEADROOM_MB}m",
        "memswap_limit": f"{limits.memory_mb + config.workdir_mb + tmp_mb + MEMORY_HEADROOM_MB}m",
        "pids_limit": limits.max_procs + RESERVED_PROCS,
        "nano_cpus": int(config.cpus * 1e9),
        "read_only": True,
        "tmpfs": {
            WORKDIR: f"rw,exec,nosuid,nodev,size={config.workdir_mb}m,uid={uid},gid={uid},mode=0700",
            "/tmp": f"rw,nosuid,nodev,size={tmp_mb}m,uid={uid},gid={uid},mode=0700",
        },
        "ulimits": [
            Ulimit(name="cpu", soft=cpu, hard=cpu + 1),
            Ulimit(name="fsize", soft=file_bytes, hard=file_bytes),
            Ulimit(name="core", soft=0, hard=0),
        ],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "hostname": "sandbox",
        "working_dir": WORKDIR,
        "environment": {"HOME": WORKDIR, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"},
        "labels": {
            EXECUTOR_LABEL: "docker",
            EXPIRES_LABEL: str(int(now + config.ttl_s)),
            OWNER_LABEL: owner,
            UID_LABEL: str(uid),
        },
    }


def expired_containers(labels_by_id: Mapping[str, Mapping[str, str]], now: float) -> list[str]:
    """Ids of this executor's containers that any reaper should remove at ``now``: those whose
    ``turnrl.expires-at`` has passed, or is missing or malformed (a broken container of ours).
    Containers without the ``turnrl.executor`` label are never chosen."""
    chosen = []
    for cid, labels in labels_by_id.items():
        if labels.get(EXECUTOR_LABEL) != "docker":
            continue
        try:
            expires = float(labels[EXPIRES_LABEL])
        except (KeyError, ValueError):
            chosen.append(cid)
            continue
        if expires <= now:
            chosen.append(cid)
    return sorted(chosen)


@dataclass(frozen=True)
class Box:
    """One container as the pool knows it."""

    id: str
    expires_at: float
    uid: int


@dataclass
class ContainerPool:
    """Which containers are warm and which session holds which; bookkeeping only (no docker
    calls, not thread-safe: the executor holds a lock around it).

    Attributes:
        size: Warm containers to keep.
        min_life_s: A warm container is handed out only with at least this long to live.
    """

    size: int
    min_life_s: float
    warm: list[Box] = field(default_factory=list)
    held: dict[str, Box] = field(default_factory=dict)
    pending: int = 0

    def checkout(self, session: str, now: float) -> tuple[Box | None, list[Box]]:
        """The container of ``session``: the one it holds, else the warm one that expires first
        among those with at least ``min_life_s`` left (now held by ``session``; using the oldest
        first wastes fewest), else None (start one and ``hold`` it). Also the warm containers
        too old to hand out, now dropped: remove them."""
        box = self.held.get(session)
        if box is not None:
            return box, []
        stale = [b for b in self.warm if b.expires_at - now < self.min_life_s]
        self.warm = [b for b in self.warm if b.expires_at - now >= self.min_life_s]
        if self.warm:
            box = min(self.warm, key=lambda b: b.expires_at)
            self.warm.remove(box)
            self.held[session] = box
        return box, stale

    def hold(self, session: str, box: Box) -> Box | None:
        """Give ``box`` (just started) to ``session``; the container it held before, if any
        (remove it)."""
        previous = self.held.get(session)
        self.held[session] = box
        return previous if previous != box else None

    def release(self, session: str) -> Box | None:
        """Forget ``session``'s container (remove it); None when it held none."""
        return self.held.pop(session, None)

    def start_warming(self) -> int:
        """How many containers to start now to refill the pool (counted as pending)."""
        missing = max(0, self.size - len(self.warm) - self.pending)
        self.pending += missing
        return missing

    def warmed(self, box: Box | None) -> None:
        """A pending start ended: ``box`` is ready, or None when it failed."""
        self.pending = max(0, self.pending - 1)
        if box is not None:
            self.warm.append(box)

    def drain(self) -> list[Box]:
        """Every container, warm and held (to remove them all); the pool is then empty."""
        boxes = list(self.warm) + list(self.held.values())
        self.warm, self.held = [], {}
        return boxes


def launcher_argv(program: Program, limits: Limits) -> list[str]:
    """The exec argv that runs ``program`` under ``limits`` through the launcher (the spec is
    JSON in argv strings of at most ``ARG_CHUNK_CHARS``).

    Raises:
        ValueError: If the program's files, stdin and argv exceed ``MAX_SPEC_CHARS``.
    """
    import json

    cpu = max(1, math.ceil(limits.cpu_s))
    spec = {
        "files": dict(program.files),
        "stdin": program.stdin,
        "argv": list(program.argv),
        "limits": [
            ("RLIMIT_CPU", cpu, cpu + 1),
            ("RLIMIT_AS", limits.memory_mb << 20, limits.memory_mb << 20),
            ("RLIMIT_NPROC", limits.max_procs, limits.max_procs),
            ("RLIMIT_FSIZE", limits.file_mb << 20, limits.file_mb << 20),
            ("RLIMIT_CORE", 0, 0),
        ],
    }
    text = json.dumps(spec)  # ASCII only: no NUL or other byte argv cannot carry
    if len(text) > MAX_SPEC_CHARS:
        raise ValueError(
            f"the program (files, stdin and argv) takes {len(text)} characters; the docker executor "
            f"passes at most {MAX_SPEC_CHARS}: write less"
        )
    chunks = [text[i : i + ARG_CHUNK_CHARS] for i in range(0, len(text), ARG_CHUNK_CHARS)]
    return ["python3", "-I", "-S", "-c", LAUNCHER, *chunks]


def judge(output: OutputCap, exit_code: int | None, killed: LimitHit | None, duration: float,
          limits: Limits, oom: bool | None = None) -> RunResult:
    """The ``RunResult`` of a run (``verdict.verdict``): ``exit_code`` is the exec's status
    (128 + n for signal n; None if unknown). A SIGKILL the executor did not send is the memory
    cgroup's OOM killer when ``oom`` (the container's OOM kill count went up), the program's
    own doing when not (it is told it was killed by SIGKILL), and taken for the OOM killer
    when ``oom`` is None (the count could not be read)."""
    return verdict(output, exit_code, killed, duration, limits, sigkill=None if oom is False else "memory",
                   unknown_status="The program's exit status is unknown (its container did not report it).")


class _ContainerGone(Exception):
    """The session's container could not be started or used; the text says why."""


@EXECUTORS.register("docker")
class DockerExecutor(Executor):
    """Runs code tools (their fn returns a ``Program``) in docker containers, one per session.

    See the module docstring for the container and the run. Blocking SDK calls run in this
    executor's worker threads, at most ``max_concurrency`` at once; pool refills, removals and
    the reaper run in a small background pool.

    Args:
        limits: Per-run limits (a ``Limits`` or a mapping of its fields).
        image: Image of the containers (needs ``python3``); pulled at construction if missing,
            except the default, which is built locally (``python -m turnrl build-docker-image``).
        pool_size: Warm containers kept ready for new sessions.
        ttl_s: Seconds a container lives at most (keep it longer than an episode).
        cpus: CPUs per container.
        workdir_mb: Size of the tmpfs working dir ``/work``.
        base_url: The engine (e.g. ``"unix:///var/run/docker.sock"``); default ``$DOCKER_HOST``
            or the standard socket.
        max_concurrency: Runs at once, over all sessions.
        timeout_s: Seconds one call may take in all, including starting its container: the
            backstop for an engine that hangs, at least ``BACKSTOP_MARGIN_S`` above
            ``limits.wall_s``.

    A call whose container cannot be started or used (the engine or the container gone) or
    that outlives ``timeout_s`` gets an ``"unavailable"`` result: the infrastructure's
    failure, not the model's (``turnrl.tools.execute``).

    Raises:
        DockerUnavailable: If no engine answers at the address (the message names it and says
            to start one or use executor ``"sandbox"``), or the image is missing and cannot be
            pulled (the message says how to build the default one).
        ValueError: If an option is out of range, or ``timeout_s`` is not above ``limits.wall_s``
            by ``BACKSTOP_MARGIN_S``.
    """

    kind = "docker"

    def __init__(
        self,
        limits: Limits | Mapping[str, Any] | None = None,
        *,
        image: str = DEFAULT_IMAGE,
        pool_size: int = 2,
        ttl_s: float = 3600.0,
        cpus: float = 1.0,
        workdir_mb: int = 256,
        base_url: str | None = None,
        max_concurrency: int = 8,
        timeout_s: float = 60.0,
    ) -> None:
        super().__init__(max_concurrency=max_concurrency, timeout_s=timeout_s)
        self.limits = Limits.coerce(limits)
        self.limits.check_backstop(self.timeout_s, self.kind)
        self.config = DockerConfig(image=image, pool_size=pool_size, ttl_s=ttl_s, cpus=cpus, workdir_mb=workdir_mb)
        self.client = connect(base_url, pool=2 * max_concurrency + 8)
        _ensure_image(self.client, image)
        self.owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._pool = ContainerPool(pool_size, self.config.min_life_s)
        self._lock = threading.Lock()
        self._session_locks: dict[str, threading.Lock] = {}
        self._oom_kills: dict[str, int] = {}  # container id -> its OOM kill count when last read
        self._closed = False
        self._last_reap = 0.0
        self._runs = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="turnrl-docker")
        self._chores = ThreadPoolExecutor(max_workers=4, thread_name_prefix="turnrl-docker-chores")
        self._chores.submit(self.reap)
        self._refill()

    # ---------------------------------------------------------------- calls
    async def arun(self, tool: Tool, call: ToolCall, session: str) -> ToolResult:
        program = self.program_of(tool, call)
        if isinstance(program, ToolResult):
            return program
        try:
            argv = launcher_argv(program, self.limits)
        except ValueError as e:
            return ToolResult(call, f"Error: tool {tool.name!r}: {e}", "exception")
        async with self.slot():
            work = asyncio.get_running_loop().run_in_executor(self._runs, self.run_blocking, argv, session)
            try:
                result = await asyncio.wait_for(work, self.timeout_s)
            except asyncio.TimeoutError:
                return self.timeout_result(tool, call)
            except _ContainerGone as e:
                return unavailable_result(call, tool.name, str(e))
            except Exception as e:  # an engine failure the SDK did not wrap: still a result, not a crash
                return unavailable_result(call, tool.name, f"it could not run in docker: {type(e).__name__}: {e}")
        return ToolResult(call, result.message(), "limit" if result.limit else None)

    def run_blocking(self, argv: list[str], session: str) -> RunResult:
        """Run a ``launcher_argv`` in ``session``'s container (blocking; no semaphore).

        Raises:
            _ContainerGone: If the container cannot be started or has disappeared (the session
                then gets a new one on its next call).
        """
        box = self._container_for(session)
        try:
            return self._exec(box, argv, session)
        except _docker_errors() as e:
            self._drop(session, box)
            raise _ContainerGone(
                f"the session's container failed ({type(e).__name__}: {e}); the next call starts a new one "
                "(files written before are lost)"
            ) from None

    # ------------------------------------------------------------- sessions
    def container_id(self, session: str) -> str | None:
        """The id of ``session``'s container (None before its first call or after ``close_session``)."""
        with self._lock:
            box = self._pool.held.get(session)
        return None if box is None else box.id

    def close_session(self, session: str) -> None:
        with self._lock:
            box = self._pool.release(session)
            self._session_locks.pop(session, None)
        if box is not None:
            self._remove_later([box])

    def close(self) -> None:
        """Remove every container this executor started and stop its threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            boxes = self._pool.drain()
        self._runs.shutdown(wait=False, cancel_futures=True)
        self._chores.shutdown(wait=True, cancel_futures=True)
        for box in boxes:
            self._remove(box)
        try:  # also any container of ours started while closing
            for container in self.client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={self.owner}"}):
                self._remove(Box(container.id, 0.0, 0))
        except _docker_errors():
            pass
        self.client.close()

    # ------------------------------------------------------------ internals
    def _container_for(self, session: str) -> Box:
        with self._lock:
            if self._closed:
                raise _ContainerGone("the docker executor is closed; get a new one with get_executor('docker')")
            session_lock = self._session_locks.setdefault(session, threading.Lock())
        with session_lock:  # the calls of one turn may run at once: start one container, not two
            with self._lock:
                box, stale = self._pool.checkout(session, time.time())
            self._remove_later(stale)
            if box is None:
                box = self._start()
                with self._lock:
                    previous = self._pool.hold(session, box)
                if previous is not None:
                    self._remove_later([previous])
        self._refill()
        self._maybe_reap()
        return box

    def _start(self) -> Box:
        now, uid = time.time(), random.randint(UID_MIN, UID_MAX)
        options = container_options(self.limits, self.config, owner=self.owner, uid=uid, now=now)
        try:
            container = self.client.containers.run(**options)
        except _docker_errors() as e:
            raise _ContainerGone(f"cannot start a container from {self.config.image!r}: {e}") from None
        return Box(container.id, now + self.config.ttl_s, uid)

    def _exec(self, box: Box, argv: list[str], session: str) -> RunResult:
        api, limits = self.client.api, self.limits
        start = time.monotonic()
        exec_id = api.exec_create(box.id, argv, stdout=True, stderr=True, user=f"{box.uid}:{box.uid}",
                                  workdir=WORKDIR)["Id"]
        stream = api.exec_start(exec_id, stream=True, demux=True)
        output = OutputCap(limits.output_bytes)
        killed: list[LimitHit] = []
        done = threading.Event()

        def stop(reason: LimitHit) -> None:
            if done.is_set() or killed:
                return
            killed.append(reason)
            self._kill_processes(box)

        def backstop() -> None:  # the kill did not end the exec (e.g. no pid left to run it)
            if not done.is_set():
                self._drop(session, box)
                _close(stream)

        timers = [threading.Timer(limits.wall_s, stop, args=("wall",)),
                  threading.Timer(limits.wall_s + 2 * KILL_GRACE_S, backstop)]
        for timer in timers:
            timer.daemon = True
            timer.start()
        try:
            for out, err in stream:
                if output.add(0, out) or output.add(1, err):
                    stop("output")
                    timers.append(threading.Timer(KILL_GRACE_S, backstop))
                    timers[-1].daemon = True
                    timers[-1].start()
                    for _ in stream:  # drain until the killed exec ends
                        pass
                    break
        finally:
            done.set()
            for timer in timers:
                timer.cancel()
            _close(stream)
        exit_code = self._exit_code(exec_id)
        duration = time.monotonic() - start
        oom = self._new_oom_kill(box) if exit_code == 128 + signal.SIGKILL and not killed else None
        return judge(output, exit_code, killed[0] if killed else None, duration, limits, oom)

    def _new_oom_kill(self, box: Box) -> bool | None:
        """Whether the OOM killer struck in ``box`` since this was last asked (None: unknown)."""
        try:
            exec_id = self.client.api.exec_create(box.id, ["python3", "-I", "-S", "-c", OOM_KILLS])["Id"]
            count = int(self.client.api.exec_start(exec_id).strip())
        except (*_docker_errors(), ValueError):
            return None
        with self._lock:
            before = self._oom_kills.get(box.id, 0)
            self._oom_kills[box.id] = count
        return count > before

    def _exit_code(self, exec_id: str) -> int | None:
        deadline = time.monotonic() + KILL_GRACE_S
        while True:
            try:
                info = self.client.api.exec_inspect(exec_id)
            except _docker_errors():
                return None
            if not info.get("Running") or time.monotonic() > deadline:
                return info.get("ExitCode")
            time.sleep(0.02)

    def _kill_processes(self, box: Box) -> None:
        """Kill every process of the session's uid in its container (best effort)."""
        try:
            exec_id = self.client.api.exec_create(box.id, ["python3", "-I", "-S", "-c", KILL_ALL],
                                                  user=f"{box.uid}:{box.uid}")["Id"]
            self.client.api.exec_start(exec_id)
        except _docker_errors():
            pass

    def _drop(self, session: str, box: Box) -> None:
        """Forget a broken container of ``session`` and kill it."""
        with self._lock:
            if self._pool.held.get(session) == box:
                self._pool.release(session)
        self._remove_later([box])

    def _refill(self) -> None:
        with self._lock:
            if self._closed:
                return
            missing = self._pool.start_warming()
        for _ in range(missing):
            try:
                self._chores.submit(self._warm_one)
            except RuntimeError:  # closing: the pool is being drained anyway
                return

    def _warm_one(self) -> None:
        try:
            box: Box | None = self._start()
        except Exception:  # counted as a failed start: the next start of a session tries again
            box = None
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                self._pool.warmed(box)
        if closed and box is not None:
            self._remove(box)

    def _remove_later(self, boxes: Iterable[Box]) -> None:
        for box in boxes:
            try:
                self._chores.submit(self._remove, box)
            except RuntimeError:  # shut down: remove now
                self._remove(box)

    def _remove(self, box: Box) -> None:
        with self._lock:
            self._oom_kills.pop(box.id, None)
        try:
            self.client.api.remove_container(box.id, force=True)
        except _docker_errors():
            pass  # already gone (auto_remove) or the engine went away: the TTL ends it

    def _maybe_reap(self) -> None:
        with self._lock:
            due = not self._closed and time.monotonic() - self._last_reap >= REAP_EVERY_S
            if due:
                self._last_reap = time.monotonic()
        if due:
            try:
                self._chores.submit(self.reap)
            except RuntimeError:
                pass

    def reap(self) -> list[str]:
        """Remove the expired containers of any turnrl docker executor on this engine (also
        run at construction and every ``REAP_EVERY_S`` as sessions start); their ids."""
        self._last_reap = time.monotonic()
        try:
            containers = self.client.containers.list(all=True, filters={"label": f"{EXECUTOR_LABEL}=docker"})
            labels = {c.id: c.labels for c in containers}
        except _docker_errors():
            return []
        chosen = expired_containers(labels, time.time())
        for cid in chosen:
            self._remove(Box(cid, 0.0, 0))
        return chosen


def _close(stream: Any) -> None:
    """Close an exec's output stream (twice is fine; a broken socket is fine)."""
    try:
        stream.close()
    except Exception:  # a closed socket, or the SDK's own error (an ssh transport cannot cancel)
        pass


def _docker_errors() -> tuple[type[BaseException], ...]:
    """What a failing SDK call raises: the SDK's errors and the transport's."""
    import docker.errors
    import requests

    return (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


def connect(base_url: str | None = None, *, pool: int = 10) -> Any:
    """A ``docker.DockerClient`` (``pool`` connections) to the engine at ``docker_address(base_url)``,
    which answered ``ping``.

    Raises:
        DockerUnavailable: Naming the address and saying what to do.
    """
    import docker

    where = docker_address(base_url)
    try:
        if base_url is None:
            client = docker.from_env(max_pool_size=pool)
        else:
            client = docker.DockerClient(base_url=base_url, max_pool_size=pool)
        client.ping()
    except Exception as e:
        raise DockerUnavailable(
            f"no docker engine answers at {where} (docker.from_env().ping() failed: {type(e).__name__}: {e}); "
            "start one (as root: 'dockerd &', or scripts/docker_engine.sh of a turnrl checkout, which also "
            "installs it) or use executor 'sandbox'"
        ) from None
    return client


def _ensure_image(client: Any, image: str) -> None:
    """Make sure the engine has ``image``: pull it if missing, except ``DEFAULT_IMAGE``, which
    no registry holds (it is built locally).

    Raises:
        DockerUnavailable: Saying how to build the default image, or that ``image`` cannot be pulled.
    """
    import docker.errors

    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    except _docker_errors() as e:
        raise DockerUnavailable(f"cannot inspect image {image!r}: {e}") from None
    build = f"build the default image {DEFAULT_IMAGE!r} from Debian packages with '{BUILD_HINT}' (as root)"
    if image == DEFAULT_IMAGE:
        raise DockerUnavailable(f"image {image!r} (the docker executor's default) is not on this engine: {build}, "
                                "or pass image= an image with python3 the engine can pull (e.g. 'python:3.11-slim')")
    try:
        client.images.pull(image)
    except _docker_errors() as e:
        raise DockerUnavailable(
            f"image {image!r} is not on this engine and cannot be pulled ({e}); run 'docker pull {image}' "
            f"where the engine can reach a registry, or {build} and use it (the default image)"
        ) from None

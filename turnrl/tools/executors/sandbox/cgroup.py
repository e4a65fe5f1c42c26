"""Memory cgroups for sandboxed runs: one cgroup per run, so the memory limit holds for all of
the run's processes and for every tmpfs page they write, together.

``MemoryCgroups.find()`` looks for a memory controller this process may create groups in:

- cgroup v2 (a ``cgroup2`` mount whose ``cgroup.controllers`` lists ``memory``): under this
  process's own cgroup when memory is delegated there, else under the hierarchy's root;
- cgroup v1 (a ``cgroup`` mount with the ``memory`` controller): under this process's own
  memory cgroup, else under the controller's root.

Each executor makes one parent group (``turnrl-sandbox-<pid>-<n>``) and each run a child of it
(``run-<n>``) with ``memory.max``/``memory.limit_in_bytes`` at the budget and swap at 0 (v2:
``memory.swap.max``; v1: ``memory.memsw.limit_in_bytes`` where swap accounting exists). A run's
processes join its group before the sandbox starts (``RunCgroup.procs``); when the group runs
out of memory the kernel's OOM killer stops the largest process and ``RunCgroup.oom_kills()``
counts it. tmpfs pages (``/tmp``, ``/dev/shm``, the working dir) are charged to the group of
the process that wrote them, and freed when the sandbox's mount namespace goes.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MemoryCgroups", "RunCgroup"]

_counter = itertools.count()


@dataclass(frozen=True)
class RunCgroup:
    """The memory cgroup of one run (``path``), removed by ``remove``."""

    path: Path
    version: int

    @property
    def procs(self) -> str:
        """The file a process writes its pid to, to join the group."""
        return str(self.path / "cgroup.procs")

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer stopped in this group."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def peak_bytes(self) -> int | None:
        """The group's peak memory use in bytes, where the kernel reports it."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):
            return None

    def remove(self, timeout_s: float = 2.0) -> bool:
        """Remove the group once its last process has gone (retried up to ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:  # EBUSY: a killed process is not reaped yet
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.01)


class MemoryCgroups:
    """A parent memory cgroup of this process's own, in which each run gets a child group.

    Use ``find()``; ``None`` means no memory controller is writable here (see the module
    docstring for where it looks).
    """

    def __init__(self, parent: Path, version: int) -> None:
        self.version = version
        if version == 2:
            _enable_memory(parent)
        self.path = parent / f"turnrl-sandbox-{os.getpid()}-{next(_counter)}"
        self.path.mkdir()
        if version == 2:
            try:
                _enable_memory(self.path)
            except OSError:
                os.rmdir(self.path)
                raise

    @classmethod
    def find(cls) -> MemoryCgroups | None:
        """The parent group for this process's runs, or None where no memory cgroup is usable."""
        for parent, version in _candidates():
            try:
                groups = cls(parent, version)
            except OSError:
                continue
            try:
                probe = groups.create(64 << 20)
            except OSError:
                groups.close()
                continue
            probe.remove()
            return groups
        return None

    def describe(self) -> str:
        return f"cgroup v{self.version} ({self.path})"

    def create(self, limit_bytes: int) -> RunCgroup:
        """A new run group limited to ``limit_bytes`` of memory and no swap."""
        path = self.path / f"run-{next(_counter)}"
        path.mkdir()
        try:
            if self.version == 2:
                (path / "memory.max").write_text(str(limit_bytes))
                _write_if_exists(path / "memory.swap.max", "0")
            else:
                (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                _write_if_exists(path / "memory.memsw.limit_in_bytes", str(limit_bytes))
        except OSError:
            os.rmdir(path)
            raise
        return RunCgroup(path, self.version)

    def close(self) -> None:
        """Remove the parent group and any run group left behind."""
        if not self.path.exists():
            return
        for child in self.path.iterdir():
            if child.is_dir():
                RunCgroup(child, self.version).remove(timeout_s=0.5)
        try:
            os.rmdir(self.path)
        except OSError:
            pass


def _write_if_exists(path: Path, value: str) -> None:
    if path.exists():
        path.write_text(value)


def _enable_memory(path: Path) -> None:
    control = path / "cgroup.subtree_control"
    if "memory" not in control.read_text().split():
        control.write_text("+memory")


def _candidates() -> list[tuple[Path, int]]:
    """(parent dir, version) to try, best first: own group, then the hierarchy's root."""
    own: dict[str, str] = {}
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else ["<v2>"]:
            own[name] = path
    found: list[tuple[Path, int]] = []
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount, fstype, options = Path(fields[4]), tail[0], tail[2].split(",")
        if fstype == "cgroup2" and "memory" in _read(str(mount / "cgroup.controllers")).split():
            roots = [mount / own.get("<v2>", "/").lstrip("/"), mount]
            found += [(root, 2) for root in roots if os.access(root, os.W_OK)]
        elif fstype == "cgroup" and "memory" in options:
            roots = [mount / own.get("memory", "/").lstrip("/"), mount]
            found += [(root, 1) for root in roots if os.access(root, os.W_OK)]
    unique: list[tuple[Path, int]] = []
    for item in found:
        if item not in unique:
            unique.append(item)
    return unique


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


"""What stopped a sandboxed run: the output cap shared by the sandbox and docker executors,
and the verdict that names the limit hit (if any) from the exit status and the error text."""

from __future__ import annotations

import re
import signal

from turnrl.tools.executors.base import LimitHit, Limits, RunResult

MEMORY_SIGNS = re.compile(r"MemoryError|Cannot allocate memory|cannot allocate memory|std::bad_alloc|out of memory")
PROCS_SIGNS = re.compile(r"fork: .*Resource temporarily unavailable|BlockingIOError: \[Errno 11\]|"
                         r"can't start new thread|Resource temporarily unavailable")
FILE_SIGNS = re.compile(r"File too large|\[Errno 27\]|File size limit exceeded")
DISK_SIGNS = re.compile(r"No space left on device|\[Errno 28\]")
SIGNAL_EXITS = {int(s): s.name for s in (signal.SIGKILL, signal.SIGXCPU, signal.SIGXFSZ, signal.SIGSEGV,
                                         signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTERM)}


class OutputCap:
    """stdout and stderr of one run, capped at ``cap`` bytes in all."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        self.parts = (bytearray(), bytearray())
        self.truncated = False

    def add(self, which: int, chunk: bytes | None) -> bool:
        """Keep what fits of ``chunk`` (0: stdout, 1: stderr); True once the cap is exceeded."""
        if chunk:
            room = self.cap - self.total
            self.parts[which].extend(chunk[: max(room, 0)])
            self.total += len(chunk)
            if self.total > self.cap:
                self.truncated = True
        return self.truncated

    def text(self, which: int) -> str:
        return self.parts[which].decode("utf-8", errors="replace")


def signal_of(status: int | None) -> str | None:
    """The signal name of an exit status (``-n`` from a subprocess, ``128 + n`` from a shell)."""
    if status is None:
        return None
    if status < 0:
        return signal.Signals(-status).name
    return SIGNAL_EXITS.get(status - 128) if status > 128 else None


def verdict(output: OutputCap, status: int | None, killed: LimitHit | None, duration: float, limits: Limits,
            sigkill: LimitHit | None, unknown_status: str = "") -> RunResult:
    """The ``RunResult`` of a run.

    Args:
        output: what the run printed.
        status: its exit status (None if unknown).
        killed: the limit for which the executor itself stopped the run (wall, output), if any.
        duration: wall seconds.
        limits: the run's limits (for the sentence the model sees).
        sigkill: the limit a SIGKILL the executor did not send means: ``"cpu"`` under the
            hard RLIMIT_CPU of the bubblewrap sandbox, ``"memory"`` after an OOM kill; None:
            no limit (the program is told the signal that killed it).
        unknown_status: the sentence shown when the status is unknown.

    A run the executor stopped whose error text shows failed forks is reported as ``procs``
    (a fork bomb floods the output or outlives the clock: the cause is what the model must
    hear). Otherwise SIGXCPU means cpu, SIGXFSZ file, and the error text tells memory
    (MemoryError), procs (EAGAIN on fork), file (EFBIG) and disk (ENOSPC).
    """
    stdout, stderr = output.text(0), output.text(1)
    signal_name = signal_of(status)
    limit: LimitHit | None = killed
    if killed is not None and PROCS_SIGNS.search(stderr):
        limit = "procs"
    elif limit is None:
        if signal_name == "SIGXCPU":
            limit = "cpu"
        elif signal_name == "SIGKILL":
            limit = sigkill
        elif signal_name == "SIGXFSZ":
            limit = "file"
        elif MEMORY_SIGNS.search(stderr):
            limit = "memory"
        elif PROCS_SIGNS.search(stderr):
            limit = "procs"
        elif FILE_SIGNS.search(stderr):
            limit = "file"
        elif DISK_SIGNS.search(stderr):
            limit = "disk"
    code = None if (killed is not None or signal_name is not None) else status
    if limit is not None:
        explanation = limits.explain(limit)
    elif signal_name is not None:
        explanation = f"The program was killed by signal {signal_name}."
    elif status is None:
        explanation = unknown_status
    else:
        explanation = ""
    if output.truncated and limit != "output":
        explanation += f" (output truncated to {limits.output_bytes} bytes)"
    return RunResult(stdout, stderr, code, limit, duration, explanation.strip())

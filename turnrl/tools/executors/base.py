"""The executor interface: what runs a tool call, how code tools describe a run, and the
shared executor instances.

A *code tool*'s ``fn(**arguments)`` returns a ``Program`` (argv + files + stdin) instead of
a value; a sandboxing executor (``sandbox``, ``docker``) runs it under ``Limits`` and turns
the ``RunResult`` into the model's observation with ``RunResult.message()``. Plain tools run
in-process. Executors are looked up by kind in ``EXECUTORS`` and shared through
``get_executor``: one instance per ``(kind, options)`` in the process, used by every env and
episode, so its ``max_concurrency`` bounds the calls of all of them together.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, ClassVar, Literal

from turnrl.registry import Registry
from turnrl.tools.execute import ToolResult, raised_result, unavailable_result
from turnrl.tools.parsers import ToolCall
from turnrl.tools.program import BadProgram, Program, bad_text
from turnrl.tools.tool import Tool

__all__ = [
    "EXECUTORS",
    "BadProgram",
    "Executor",
    "LimitHit",
    "Limits",
    "Program",
    "RunResult",
    "close_executors",
    "get_executor",
]

LimitHit = Literal["cpu", "wall", "memory", "output", "procs", "file", "disk"]
SHOWN_CHARS = 4_000
"""``RunResult.message()`` keeps at most this many characters of stdout and of stderr."""
BACKSTOP_MARGIN_S = 5.0
"""A sandboxing executor's ``timeout_s`` exceeds ``Limits.wall_s`` by at least this much (the
time to start a sandbox and to collect a killed one), so a program stopped at its wall time is
reported as such, never as the backstop's ``"unavailable"``."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run.

    Attributes:
        cpu_s: CPU seconds (RLIMIT_CPU; rounded up to whole seconds by the kernel limit).
        wall_s: Wall-clock seconds, then the whole sandbox is killed.
        memory_mb: Memory of one run in MiB. The bubblewrap sandbox bounds all of a run's
            processes and the tmpfs files they write together (see ``sandbox.py``); every
            process also gets it as its address-space cap (RLIMIT_AS).
        output_bytes: Bytes of stdout+stderr kept; the run is stopped when exceeded.
        max_procs: Processes/threads (RLIMIT_NPROC inside a user namespace).
        file_mb: Largest file it may write (RLIMIT_FSIZE) in MiB.
    """

    cpu_s: float = 5.0
    wall_s: float = 10.0
    memory_mb: int = 512
    output_bytes: int = 16_384
    max_procs: int = 64
    file_mb: int = 16

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_mb", "output_bytes", "max_procs", "file_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")

    @classmethod
    def coerce(cls, value: Limits | Mapping[str, Any] | None) -> Limits:
        """``Limits`` from a ``Limits``, a mapping of its fields (e.g. from a config), or None."""
        if value is None:
            return cls()
        if isinstance(value, Limits):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValueError(f"unknown Limits fields {unknown}; valid: {sorted(cls.__dataclass_fields__)}")
            return cls(**dict(value))
        raise TypeError(f"limits must be a Limits or a mapping of its fields, got {type(value).__name__}")

    def check_backstop(self, timeout_s: float, kind: str) -> None:
        """Raise ValueError unless ``timeout_s`` (the ``kind`` executor's backstop for a sandbox
        that hangs) exceeds ``wall_s`` by at least ``BACKSTOP_MARGIN_S``."""
        if timeout_s < self.wall_s + BACKSTOP_MARGIN_S:
            raise ValueError(
                f"the {kind} executor's timeout_s={timeout_s} must exceed limits.wall_s={self.wall_s} by at least "
                f"{BACKSTOP_MARGIN_S} s: wall_s stops a program that runs too long (the model's failure), timeout_s "
                f"is the backstop for a sandbox that hangs (the infrastructure's); set timeout_s >= "
                f"{self.wall_s + BACKSTOP_MARGIN_S} or lower wall_s")

    def explain(self, limit: LimitHit) -> str:
        """The sentence the model sees when ``limit`` stopped its program."""
        return {
            "cpu": f"Stopped: the program used more than {self.cpu_s} s of CPU time (limit cpu_s={self.cpu_s}).",
            "wall": f"Stopped: the program ran longer than {self.wall_s} s (limit wall_s={self.wall_s}).",
            "memory": f"Stopped: the program ran out of memory (limit memory_mb={self.memory_mb}).",
            "output": (f"Stopped: the program printed more than {self.output_bytes} bytes; the output is "
                       f"truncated (limit output_bytes={self.output_bytes})."),
            "procs": (f"Stopped: the program tried to start more than {self.max_procs} processes or threads "
                      f"(limit max_procs={self.max_procs})."),
            "file": f"Stopped: the program wrote a file larger than {self.file_mb} MB (limit file_mb={self.file_mb}).",
            "disk": "Stopped: the program ran out of space for its files (the sandbox's disk space is capped).",
        }[limit]


@dataclass(frozen=True)
class RunResult:
    """The outcome of one sandboxed run.

    Attributes:
        stdout: Captured standard output (at most ``Limits.output_bytes`` with stderr).
        stderr: Captured standard error.
        exit_code: The program's exit status; None when it was killed (by a signal or a limit).
        limit: Which limit stopped it, if any.
        duration_s: Wall-clock seconds of the run.
        explanation: The sentence describing ``limit`` (``Limits.explain``), or how it was
            killed; "" when it ended on its own.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    limit: LimitHit | None
    duration_s: float
    explanation: str = ""

    def message(self) -> str:
        """The text the model sees: exit code, stdout, stderr (each trimmed to ``SHOWN_CHARS``
        characters), and for a limit a clear sentence saying which one."""
        status = "killed" if self.exit_code is None else str(self.exit_code)
        lines = [f"Exit code: {status}"]
        if self.explanation:
            lines.append(self.explanation)
        lines.append(f"stdout:\n{_trim(self.stdout)}" if self.stdout else "stdout: (empty)")
        if self.stderr:
            lines.append(f"stderr:\n{_trim(self.stderr)}")
        return "\n".join(lines)


def _trim(text: str) -> str:
    text = text.rstrip("\n")
    if len(text) <= SHOWN_CHARS:
        return text
    half = SHOWN_CHARS // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"


class Executor(ABC):
    """Runs tool calls. One instance is shared by every env (and episode) that uses it; at most
    ``max_concurrency`` calls run at once (an asyncio.Semaphore on the shared loop).

    Subclasses set ``kind``, implement ``arun`` and wrap the work of each call in
    ``async with self.slot():`` so the bound holds. ``arun`` runs on the shared background loop
    (``turnrl.tools.executors.loop``); blocking work goes to threads.

    Args:
        max_concurrency: Calls that may run at once, over all sessions.
        timeout_s: Seconds one call may take in all before it becomes an ``"unavailable"``
            result (``timeout_result``).
    """

    kind: ClassVar[str] = ""

    def __init__(self, *, max_concurrency: int = 8, timeout_s: float = 30.0) -> None:
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be a positive int, got {max_concurrency!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.max_concurrency = max_concurrency
        self.timeout_s = float(timeout_s)
        self._semaphore: asyncio.Semaphore | None = None
        self._semaphore_lock = threading.Lock()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the ``max_concurrency`` slots for the duration of the block."""
        with self._semaphore_lock:
            if self._semaphore is None:
                self._semaphore = asyncio.Semaphore(self.max_concurrency)
            semaphore = self._semaphore
        async with semaphore:
            yield

    @abstractmethod
    async def arun(self, tool: Tool, call: ToolCall, session: str) -> ToolResult:
        """Run ``call`` of ``tool`` for ``session`` (an episode id); arguments are already
        validated. Never raises for ordinary failures: they become error results, the model's
        kinds or ``"unavailable"`` for the infrastructure's (``turnrl.tools.execute``)."""

    def close_session(self, session: str) -> None:
        """Free the resources of ``session`` (temp dirs, containers); a no-op by default."""

    def close(self) -> None:
        """Free every resource of the executor; a no-op by default."""

    def program_of(self, tool: Tool, call: ToolCall) -> Program | ToolResult:
        """The ``Program`` a code tool builds from the call's arguments (for sandbox-like
        executors), or the result to return instead: ``"bad_arguments"`` for text a sandbox
        cannot carry, ``raised_result`` when the tool raises, ``"unavailable"`` when it is not a
        code tool (the env's setup, not the call)."""
        for name, value in call.arguments.items():
            problem = bad_text(value)
            if problem is not None:
                return ToolResult(call, f"Error: bad arguments for tool {tool.name!r}: argument {name!r} {problem}",
                                  "bad_arguments")
        try:
            program = tool.fn(**call.arguments)
        except BadProgram as e:
            return ToolResult(call, f"Error: bad arguments for tool {tool.name!r}: {e}", "bad_arguments")
        except Exception as e:
            return raised_result(call, tool.name, e)
        if not isinstance(program, Program):
            return unavailable_result(call, tool.name, f"it is not a code tool: the {self.kind} executor runs "
                                                       f"tools whose fn returns a Program, got {type(program).__name__}")
        return program

    def timeout_result(self, tool: Tool, call: ToolCall) -> ToolResult:
        """The ``"unavailable"`` result of a call that took longer than ``timeout_s``: a plain
        tool that hung, or a sandbox that outlived the backstop above its program's own limits;
        neither is the model's doing."""
        return unavailable_result(call, tool.name, f"the call took longer than {self.timeout_s} s (the {self.kind} "
                                                   "executor's timeout_s) and was abandoned")


EXECUTORS: Registry = Registry("executor")
"""Executor kind -> ``Executor`` subclass (``inprocess``, ``sandbox``, ``docker``, ``remote``)."""

_instances: dict[tuple[str, str], Executor] = {}
_instances_lock = threading.Lock()


def get_executor(kind: str, **options: Any) -> Executor:
    """The shared executor of ``kind`` built with ``options`` (one instance per
    ``(kind, options)`` in the process; thread-safe).

    Raises:
        ValueError: If ``kind`` is not registered (the message lists the valid kinds).
    """
    if kind not in EXECUTORS:
        raise ValueError(f"unknown executor {kind!r}; valid executors: {EXECUTORS.names()}")
    key = (kind, repr(sorted(options.items())))
    with _instances_lock:
        executor = _instances.get(key)
        if executor is None:
            executor = EXECUTORS[kind](**options)
            _instances[key] = executor
        return executor


def close_executors() -> None:
    """Close and forget every shared executor (also run at interpreter exit)."""
    with _instances_lock:
        executors = list(_instances.values())
        _instances.clear()
    for executor in executors:
        try:
            executor.close()
        except Exception:  # closing is best effort; one failure must not keep others open
            pass


atexit.register(close_executors)

"""Tool executors: where and how tool calls run (in-process threads, a bubblewrap sandbox,
docker containers, a remote tool service), all behind one ``Executor`` interface and run on
one shared background event loop (``run_sync``)."""

from turnrl.tools.executors.base import (
    EXECUTORS,
    Executor,
    LimitHit,
    Limits,
    Program,
    RunResult,
    close_executors,
    get_executor,
)
from turnrl.tools.executors.inprocess import InProcessExecutor
from turnrl.tools.executors.loop import get_loop, run_sync
from turnrl.tools.executors.sandbox.executor import SandboxExecutor, SandboxUnavailable

__all__ = [
    "EXECUTORS",
    "Executor",
    "InProcessExecutor",
    "LimitHit",
    "Limits",
    "Program",
    "RunResult",
    "SandboxExecutor",
    "SandboxUnavailable",
    "close_executors",
    "get_executor",
    "get_loop",
    "run_sync",
]

# the docker and remote executors register themselves; their SDKs load on first use
from turnrl.tools.executors import remote  # noqa: E402,F401
from turnrl.tools.executors.docker import executor as _docker_executor  # noqa: E402,F401

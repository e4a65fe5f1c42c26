"""The in-process executor: plain Python tools on threads of this process, with a timeout."""

from __future__ import annotations

import asyncio
import threading

from turnrl.tools.execute import ToolResult, raised_result, run_validated, unavailable_result
from turnrl.tools.executors.base import EXECUTORS, Executor
from turnrl.tools.parsers import ToolCall
from turnrl.tools.tool import Tool

__all__ = ["InProcessExecutor"]


class _Run:
    """One call's thread and what it left (read and written under the executor's lock)."""

    __slots__ = ("result", "abandoned")

    def __init__(self) -> None:
        self.result: ToolResult | None = None
        self.abandoned = False


@EXECUTORS.register("inprocess")
class InProcessExecutor(Executor):
    """Runs ``tool.fn(**arguments)`` on a new daemon thread of this process per call.

    An exception becomes an ``"exception"`` result (``"unavailable"`` for an infrastructure
    failure: ``turnrl.tools.execute.raised_result``). A call still running after ``timeout_s``
    becomes an ``"unavailable"`` result (the tool hung: a plain tool's time is its own fault,
    not the call's). Python cannot stop a thread, so the hung call's thread is *abandoned*: it
    keeps running in the background, but its slot is free at once (the next calls never wait
    for it), and as a daemon thread it never keeps the process from exiting. Abandoned threads
    still running are ``stuck``; at most ``max_stuck`` may be: past that, every call gets an
    ``"unavailable"`` result at once, without starting a thread, until some of them end (a tool
    that hangs on every call would otherwise pile threads up without limit).

    Threads, not processes: a tool is often a bound method of an env (it reads the episode) or
    holds state no other process has, so a process pool (which could kill a hung call) would
    run only some tools. A tool that must be stoppable belongs on a sandboxing or remote
    executor. A code tool (its fn returns a ``Program``) is refused with an ``"unavailable"``
    result: model-written code never runs in-process.

    Args:
        max_concurrency: Calls that may run at once (abandoned ones not counted).
        timeout_s: Seconds a call may take.
        max_stuck: Abandoned calls that may still run before the executor refuses calls.
    """

    kind = "inprocess"

    def __init__(self, *, max_concurrency: int = 8, timeout_s: float = 30.0, max_stuck: int = 32) -> None:
        super().__init__(max_concurrency=max_concurrency, timeout_s=timeout_s)
        if isinstance(max_stuck, bool) or not isinstance(max_stuck, int) or max_stuck < 1:
            raise ValueError(f"max_stuck must be a positive int (hung calls allowed to run on), got {max_stuck!r}")
        self.max_stuck = max_stuck
        self._stuck = 0
        self._lock = threading.Lock()

    @property
    def stuck(self) -> int:
        """Abandoned calls (they outlived ``timeout_s``) whose threads still run."""
        with self._lock:
            return self._stuck

    async def arun(self, tool: Tool, call: ToolCall, session: str) -> ToolResult:
        async with self.slot():
            stuck = self.stuck
            if stuck >= self.max_stuck:
                return unavailable_result(
                    call, tool.name, f"{stuck} calls of in-process tools hung and still run (max_stuck="
                    f"{self.max_stuck}), so this executor takes no call until some end; make the hanging tool "
                    "bound its own waits, or raise max_stuck")
            loop = asyncio.get_running_loop()
            finished = loop.create_future()
            run = _Run()

            def work() -> None:
                try:
                    result = run_validated(tool, call)
                except BaseException as e:  # SystemExit in a tool: still a result, and the count stays right
                    result = raised_result(call, tool.name, e)  # type: ignore[arg-type]
                with self._lock:
                    run.result = result
                    if run.abandoned:
                        self._stuck -= 1
                        return
                try:
                    loop.call_soon_threadsafe(_resolve, finished)
                except RuntimeError:  # the loop closed meanwhile
                    pass

            threading.Thread(target=work, name=f"turnrl-tool-{tool.name}", daemon=True).start()
            try:
                await asyncio.wait_for(finished, self.timeout_s)
            except asyncio.TimeoutError:
                pass
            finally:
                result = self._collect(run)
            return result if result is not None else self.timeout_result(tool, call)

    def _collect(self, run: _Run) -> ToolResult | None:
        """The call's result, or None after marking its still running thread abandoned."""
        with self._lock:
            if run.result is None:
                run.abandoned = True
                self._stuck += 1
            return run.result


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)

"""The in-process executor: plain Python tools in worker threads, with a timeout."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from turnrl.tools.execute import ToolResult, run_validated
from turnrl.tools.executors.base import EXECUTORS, Executor
from turnrl.tools.parsers import ToolCall
from turnrl.tools.tool import Tool

__all__ = ["InProcessExecutor"]


@EXECUTORS.register("inprocess")
class InProcessExecutor(Executor):
    """Runs ``tool.fn(**arguments)`` in a worker thread of this process.

    An exception becomes an ``"exception"`` result; a call running longer than ``timeout_s``
    becomes a ``"timeout"`` result telling the model the call took too long (Python threads
    cannot be killed: the call's thread finishes in the background and holds its worker
    until then). A code tool (its fn returns a ``Program``) is refused with a clear error:
    model-written code never runs in-process.

    Args:
        max_concurrency: Calls that may run at once (also the number of worker threads).
        timeout_s: Seconds a call may take.
    """

    kind = "inprocess"

    def __init__(self, *, max_concurrency: int = 8, timeout_s: float = 30.0) -> None:
        super().__init__(max_concurrency=max_concurrency, timeout_s=timeout_s)
        self._threads = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="turnrl-tool")

    async def arun(self, tool: Tool, call: ToolCall, session: str) -> ToolResult:
        async with self.slot():
            work = asyncio.get_running_loop().run_in_executor(self._threads, run_validated, tool, call)
            try:
                return await asyncio.wait_for(work, self.timeout_s)
            except asyncio.TimeoutError:
                return self.timeout_result(tool, call)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

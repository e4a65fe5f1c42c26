"""One shared background asyncio event loop for tool execution, and ``run_sync`` to use it
from synchronous code.

Every executor's ``arun`` runs on this loop, so one executor's semaphore (and clients bound to
a loop, e.g. an ``httpx.AsyncClient``) serves every env and thread of the process. The loop
runs in a daemon thread started on first use.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["get_loop", "run_sync"]

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_lock = threading.Lock()


def get_loop() -> asyncio.AbstractEventLoop:
    """The shared loop (started in its daemon thread on first call)."""
    global _loop, _thread
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            _thread = threading.Thread(target=serve, name="turnrl-tool-loop", daemon=True)
            _thread.start()
            ready.wait()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the shared loop and block this thread until it returns (or raises).

    Raises:
        RuntimeError: If called from the shared loop's own thread (it would wait on itself);
            await the coroutine there instead.
    """
    loop = get_loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("run_sync() called on the shared tool loop's thread; await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()

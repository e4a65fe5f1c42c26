"""``EnvCalls``: env calls (reset, step, close) on daemon worker threads, each within a deadline.

A Python thread cannot be stopped, so an env call that hangs (a dead server without a
timeout, a tool stuck in C code) is abandoned rather than waited for: past ``timeout_s``
its result is a ``StepTimeout``, a fresh worker takes its place, and the stuck thread exits
on its own if the call ever returns (its late result is dropped). Workers are daemon
threads, so a stuck call never keeps the process from exiting. ``DeadlineEnv`` gives one env
the same deadline, for callers that play it on their own.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import gymnasium

__all__ = ["DeadlineEnv", "EnvCalls", "MAX_STUCK_CALLS", "StepTimeout"]

MAX_STUCK_CALLS = 256
"""Abandoned calls whose threads still run, beyond which ``EnvCalls.map`` raises: an env that
hangs this often is broken, and its threads would otherwise pile up without bound."""


class StepTimeout(TimeoutError):
    """An env call ran past its deadline (``timeout_s``); the episode ends with ``step_timeout``."""


_PENDING = object()


class _Call:
    __slots__ = ("fn", "what", "result", "started", "abandoned")

    def __init__(self, fn: Callable[[], Any], what: str) -> None:
        self.fn, self.what = fn, what
        self.result: Any = _PENDING
        self.started: float | None = None
        self.abandoned = False


class EnvCalls:
    """Run batches of env calls concurrently, each within ``timeout_s`` of its start.

    Args:
        workers: threads that run calls at once (1 = one after another).
        timeout_s: seconds one call may run; None: no deadline. With ``workers == 1`` and no
            deadline, calls run in the caller's thread.
    """

    def __init__(self, workers: int, timeout_s: float | None) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive int, got {workers!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
        self.workers, self.timeout_s = workers, timeout_s
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._live = 0  # workers taking calls (not counting the stuck ones)
        self.stuck = 0  # abandoned calls still running

    @property
    def inline(self) -> bool:
        """Whether calls run in the caller's thread (one worker, no deadline)."""
        return self.workers == 1 and self.timeout_s is None

    def map(self, fns: list[Callable[[], Any]], what: str = "env call") -> list[Any]:
        """Run every ``fns[i]()``; returns, in order, each return value or the exception it
        raised (``StepTimeout`` for one past the deadline). Never raises for a call's failure.

        Raises:
            RuntimeError: If more than ``MAX_STUCK_CALLS`` abandoned calls are still running.
        """
        if self.inline:
            return [_run(fn) for fn in fns]
        calls = [_Call(fn, what) for fn in fns]
        with self._cv:
            if self.stuck > MAX_STUCK_CALLS:
                raise RuntimeError(
                    f"{self.stuck} env calls hung past their {self.timeout_s:g} s deadline and are still running; "
                    "the env (or a server it calls) is broken: fix it, or raise trainer.step_timeout_s if its "
                    "steps are meant to take that long")
            while self._live < min(self.workers, len(calls)):
                self._spawn()
        for call in calls:
            self._queue.put(call)
        with self._cv:
            while True:
                now = time.monotonic()
                pending = [c for c in calls if c.result is _PENDING]
                if not pending:
                    break
                deadlines = []
                for c in pending:
                    if c.started is None or self.timeout_s is None:
                        continue
                    if now - c.started >= self.timeout_s:
                        c.result = StepTimeout(f"the {c.what} took longer than {self.timeout_s:g} s "
                                               "(trainer.step_timeout_s) and was abandoned")
                        c.abandoned = True
                        self.stuck += 1
                        self._live -= 1
                        self._spawn()  # the stuck worker's replacement
                    else:
                        deadlines.append(c.started + self.timeout_s)
                if all(c.result is not _PENDING for c in pending):
                    continue
                self._cv.wait(timeout=None if not deadlines else max(min(deadlines) - now, 0.0) + 1e-3)
        return [c.result for c in calls]

    def close(self) -> None:
        """Let the idle workers exit (stuck ones exit when their call returns)."""
        with self._cv:
            live, self._live = self._live, 0
        for _ in range(live):
            self._queue.put(None)

    def _spawn(self) -> None:  # (called holding self._cv)
        self._live += 1
        threading.Thread(target=self._work, name="turnrl-env", daemon=True).start()

    def _work(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            with self._cv:
                call.started = time.monotonic()
                self._cv.notify_all()
            value = _run(call.fn)
            with self._cv:
                if call.abandoned:  # replaced while stuck: drop the late result and exit
                    self.stuck -= 1
                    return
                call.result = value
                self._cv.notify_all()


def _run(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # the caller decides what each failure means
        return exc


class DeadlineEnv(gymnasium.Wrapper):
    """An env whose ``reset`` and ``step`` each return within ``timeout_s`` or raise
    ``StepTimeout``, for callers that play one env on their own (the scripted players of the
    tokenizer corpus, the warm start, DPO pairs). After a timeout the hung env is dropped (its
    thread may still run; it never keeps the process alive) and the next ``reset`` plays on a
    new one from ``env_fn``; ``unwrapped`` is always the env in use.

    Args:
        env_fn: makes the env (once now, and again after each timeout).
        timeout_s: seconds one call may take; None: no deadline (calls run in the caller's thread).
    """

    def __init__(self, env_fn: Callable[[], gymnasium.Env], timeout_s: float | None) -> None:
        super().__init__(env_fn())
        self._env_fn, self._calls, self._hung = env_fn, EnvCalls(1, timeout_s), False

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self._hung:  # the last call hung: play on a new env
            self.env, self._hung = self._env_fn(), False
        env = self.env
        return self._call(lambda: env.reset(seed=seed, options=options), "env reset")

    def step(self, action):
        if self._hung:
            raise RuntimeError("step() after a call that timed out: call reset() first (it makes a new env)")
        env = self.env
        return self._call(lambda: env.step(action), "env step")

    def close(self) -> None:
        if not self._hung:  # (a hung env is still inside its call)
            self.env.close()
        self._calls.close()

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        result = self._calls.map([fn], what)[0]
        if isinstance(result, StepTimeout):
            self._hung = True
        if isinstance(result, BaseException):
            raise result
        return result

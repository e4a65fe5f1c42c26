"""Running one agent program in the background: an ``async def`` function (on an event loop of
its own thread), a plain function (in a thread) or a command (a process of its own group).

Every kind is called with the episode's ``base_url``, ``api_key`` and ``task``:

* a function: ``agent(base_url, api_key, task)``; what it returns (or raises) is the run's result;
* a command (a string split like a shell's, or a list of arguments): run with
  ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``TURNRL_TASK`` (the task as JSON) in its
  environment, which the ``openai`` SDK and most agent libraries read; its result is the last
  line of its standard output that is not empty, read as JSON (a number, or an object with
  ``reward`` and optionally ``success`` and ``call_rewards``). A non-zero exit is a failure
  carrying the end of its standard error.

``stop()`` ends a run early: a coroutine is cancelled, a process group killed; a plain
function cannot be interrupted and finishes on its own (its next call to the gateway is
refused, which ends most agents).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["AgentFailed", "AgentRun", "task_json"]

_STDERR_SHOWN = 2000
"""Characters of a failed command's standard error kept in its error."""


class AgentFailed(RuntimeError):
    """The agent program raised, exited non-zero or printed no result (an infrastructure failure:
    the episode ends with ``env_error`` and is kept out of the gradient)."""


def task_json(task: Any) -> str:
    """``task`` as JSON text (what a command reads from ``TURNRL_TASK``)."""
    return json.dumps(task, sort_keys=True, default=str)


class AgentRun:
    """One run of ``agent`` on ``task`` against ``base_url``/``api_key``; ``done(result)`` is
    called once, from the run's thread, with what it returned or the exception that ended it
    (``AgentFailed`` for a command's failure).

    Args:
        agent: an ``async def`` or plain function, or a command (``str`` or argument list).
        base_url, api_key: the episode's session on the gateway.
        task: the task, as the env drew it.
        done: called with the result (or exception) when the run ends, not after ``stop()``.
    """

    def __init__(self, agent: Callable | str | Sequence[str], base_url: str, api_key: str, task: Any,
                 done: Callable[[Any], None]) -> None:
        self._done, self._stopped = done, threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._proc: subprocess.Popen | None = None
        if callable(agent):
            target = self._coroutine if inspect.iscoroutinefunction(agent) else self._function
            args: tuple = (agent, base_url, api_key, task)
        else:
            command = shlex.split(agent) if isinstance(agent, str) else [str(a) for a in agent]
            if not command:
                raise ValueError("the agent command is empty: give a program and its arguments")
            target, args = self._command, (command, base_url, api_key, task)
        self._thread = threading.Thread(target=target, args=args, name="agent-run", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the run early (see the module docstring); ``done`` is not called after this."""
        self._stopped.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop has closed: the run is over
                pass
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _finish(self, result: Any) -> None:
        if not self._stopped.is_set():
            self._done(result)

    def _coroutine(self, agent: Callable, base_url: str, api_key: str, task: Any) -> None:
        async def main() -> Any:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
            if self._stopped.is_set():
                raise asyncio.CancelledError
            return await agent(base_url, api_key, task)

        try:
            result = asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 (the run's failure is its result)
            result = e
        self._finish(result)

    def _function(self, agent: Callable, base_url: str, api_key: str, task: Any) -> None:
        try:
            result = agent(base_url, api_key, task)
        except BaseException as e:  # noqa: BLE001
            result = e
        self._finish(result)

    def _command(self, command: list[str], base_url: str, api_key: str, task: Any) -> None:
        no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY", ""), "127.0.0.1", "localhost"]))
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "TURNRL_TASK": task_json(task),
               "NO_PROXY": no_proxy, "no_proxy": no_proxy}  # the gateway is on loopback: never through a proxy
        try:
            self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=env, text=True, errors="replace",
                                          start_new_session=True)
        except OSError as e:
            self._finish(AgentFailed(f"the agent command {command[0]!r} could not start: {e}"))
            return
        if self._stopped.is_set():
            self.stop()
        out, err = self._proc.communicate()
        if self._proc.returncode != 0:
            self._finish(AgentFailed(f"the agent command exited with status {self._proc.returncode}; its standard "
                                     f"error ends: {err[-_STDERR_SHOWN:]!r}"))
            return
        lines = [line for line in out.splitlines() if line.strip()]
        if not lines:
            self._finish(AgentFailed("the agent command printed no result: print the reward (a number, or JSON "
                                     '{"reward": ..., "success": ...}) as the last line of standard output'))
            return
        try:
            self._finish(json.loads(lines[-1]))
        except ValueError:
            self._finish(AgentFailed(f"the last line the agent command printed, {lines[-1][:200]!r}, is not JSON: "
                                     'print the reward (a number, or {"reward": ..., "success": ...}) last'))

"""Execute parsed tool calls; every failure becomes an error ``ToolResult``, classed as the
model's or the infrastructure's.

The model's failures (its call or the program it wrote was wrong) become an error message in
the observation and the episode goes on, so the model learns from them:

* ``unknown_tool``: no tool of that name;
* ``bad_arguments``: arguments that break the tool's schema (or text a sandbox cannot carry);
* ``exception``: a plain tool raised an ordinary exception (it refused the input), or a tool
  server refused the call (HTTP 4xx);
* ``limit``: a program the model wrote hit a sandbox limit (CPU, wall time, memory, output,
  processes, file size, disk); a program that merely crashes is no error at all: its exit
  status and output are the observation.

The infrastructure's failures are ``unavailable``: nothing in the call was wrong, so the
episode says nothing about the policy. ``MultiTurnEnv.step`` raises ``ToolUnavailableError``
for them, and the rollout collector ends the episode with termination ``"tool_error"``
(``turnrl.rollout.termination``). They are:

* a sandbox, docker or remote executor that cannot start a sandbox or reach its backend (no
  namespaces, the docker engine or the container gone, the tool server gone, answering 5xx or
  nothing within its timeout, or answering what is not a result), or whose call outlived the
  executor's ``timeout_s`` backstop (a program's own time is bounded by ``Limits.wall_s``);
* a plain in-process tool that ran longer than its executor's ``timeout_s`` (it hung), or an
  in-process executor with too many hung calls to take more;
* a tool that raised ``ToolUnavailableError`` (a tool author's "not your fault, I am broken"),
  ``ConnectionError`` (refused, reset, broken pipe), ``httpx.TransportError`` or the
  ``requests`` library's ``ConnectionError``/``Timeout``;
* a tool that cannot run as the env is set up: a code tool on the in-process executor, a plain
  tool on a sandbox, a remote tool without a server.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from turnrl.tools.parsers import ToolCall
from turnrl.tools.program import Program
from turnrl.tools.tool import Tool
from turnrl.tools.validation import validate_arguments

ToolError = Literal[None, "unknown_tool", "bad_arguments", "exception", "limit", "unavailable"]
"""Why a call failed (see the module docstring): ``unavailable`` is the infrastructure's
failure, every other kind the model's."""


class ToolUnavailableError(RuntimeError):
    """A tool failed for a reason that is not the model's input: its backend is down, it hung.

    A tool raises it to say "not your fault, I am broken"; ``MultiTurnEnv.step`` raises it when
    a call of the turn failed that way, so the episode ends as the infrastructure's failure.

    Args:
        tool: The tool's name.
        reason: What went wrong, for the log.
    """

    def __init__(self, tool: str, reason: str) -> None:
        super().__init__(f"tool {tool!r} is unavailable: {reason}")
        self.tool = tool
        self.reason = reason

    def __reduce__(self):  # picklable across processes with both arguments
        return type(self), (self.tool, self.reason)

    @classmethod
    def of(cls, result: ToolResult) -> ToolUnavailableError:
        """The error an ``"unavailable"`` result stands for (its tool, and its text as the reason)."""
        name = result.call.name
        return cls(name, result.content.removeprefix(f"Error: tool {name!r} is unavailable: "))


@dataclass(frozen=True)
class ToolResult:
    """The observation produced by one tool call.

    Attributes:
        call: The call that was executed.
        content: ``str(return value)`` on success, else an ``"Error: ..."`` text
            meant for the model.
        error: None on success, else the failure kind (``ToolError``).
    """

    call: ToolCall
    content: str
    error: ToolError

    @property
    def ok(self) -> bool:
        """True when the tool ran and returned normally."""
        return self.error is None

    @property
    def unavailable(self) -> bool:
        """True when the call failed for a reason that is not the model's (``"unavailable"``)."""
        return self.error == "unavailable"


def unavailable_result(call: ToolCall, tool: str, reason: str) -> ToolResult:
    """The ``"unavailable"`` result of ``call``: ``tool`` failed for ``reason``, not the model's input."""
    return ToolResult(call, f"Error: tool {tool!r} is unavailable: {reason}", "unavailable")


def is_infra_error(error: BaseException) -> bool:
    """Whether an exception a tool raised is the infrastructure's, not a refusal of its input:
    ``ToolUnavailableError``, ``ConnectionError``, ``httpx.TransportError``, or the ``requests``
    library's ``ConnectionError``/``Timeout`` (those two only where the library is imported)."""
    if isinstance(error, (ToolUnavailableError, ConnectionError)):
        return True
    httpx, requests = sys.modules.get("httpx"), sys.modules.get("requests.exceptions")
    return ((httpx is not None and isinstance(error, httpx.TransportError))
            or (requests is not None and isinstance(error, (requests.ConnectionError, requests.Timeout))))


def raised_result(call: ToolCall, tool: str, error: Exception) -> ToolResult:
    """The result of ``call`` when ``tool``'s function raised ``error``: ``"unavailable"`` for an
    infrastructure failure (``is_infra_error``), else ``"exception"`` with the error's text."""
    if isinstance(error, ToolUnavailableError):
        return unavailable_result(call, tool, error.reason)
    if is_infra_error(error):
        return unavailable_result(call, tool, f"{type(error).__name__}: {error}")
    return ToolResult(call, f"Error: tool {tool!r} raised {type(error).__name__}: {error}", "exception")


def check_call(call: ToolCall, tools: Mapping[str, Tool]) -> Tool | ToolResult:
    """Look up and validate one call without running it.

    Args:
        call: The parsed call.
        tools: Available tools by name.

    Returns:
        The tool to run, or the error result (``"unknown_tool"`` or ``"bad_arguments"``).
    """
    chosen = tools.get(call.name)
    if chosen is None:
        available = ", ".join(sorted(tools))
        hint = f"Available tools: {available}." if available else "No tools are available in this task."
        return ToolResult(call, f"Error: unknown tool {call.name!r}. {hint}", "unknown_tool")
    _strings_as_written(call, chosen.parameters)
    problem = validate_arguments(call.arguments, chosen.parameters)
    if problem is not None:
        return ToolResult(call, f"Error: bad arguments for tool {chosen.name!r}: {problem}.", "bad_arguments")
    return chosen


def _strings_as_written(call: ToolCall, parameters: Mapping) -> None:
    """Give each argument the schema types as a string, in a raw-value format (``call.raw``), its
    text as written, in place: the real templates render every string bare (``"5"`` as ``5``,
    ``'"q"'`` as ``"q"``), so the text is the string, whatever JSON it also reads as (vLLM's
    parsers for these formats do the same)."""
    if not call.raw:
        return
    properties = parameters.get("properties", {}) if isinstance(parameters, Mapping) else {}
    for key, text in call.raw.items():
        spec = properties.get(key)
        if isinstance(spec, Mapping) and spec.get("type") == "string":
            call.arguments[key] = text


def run_validated(chosen: Tool, call: ToolCall) -> ToolResult:
    """Run an already validated call in this thread; an exception becomes an error result
    (``raised_result``: ``"exception"``, or ``"unavailable"`` for an infrastructure failure).

    A code tool (one whose ``fn`` returns a ``turnrl.tools.executors.Program``) is refused
    with an ``"unavailable"`` result: its program must run in a sandboxing executor, which is
    the env's setup, not the model's call.
    """
    try:
        value = chosen.fn(**call.arguments)
    except Exception as e:
        return raised_result(call, chosen.name, e)
    if isinstance(value, Program):
        return unavailable_result(
            call, chosen.name, "it is a code tool (it returns a Program) and cannot run in-process; "
            "run it with a sandboxing executor (executor='sandbox' or 'docker').")
    return ToolResult(call, str(value), None)


def execute_call(call: ToolCall, tools: Mapping[str, Tool]) -> ToolResult:
    """Validate and run one call synchronously, in this thread (no executor).

    Never raises for ordinary exceptions (``KeyboardInterrupt``/``SystemExit``
    propagate). Validation failures and tool exceptions become error results.

    Args:
        call: The parsed call.
        tools: Available tools by name.

    Returns:
        The result; ``error`` is ``"unknown_tool"``, ``"bad_arguments"``, ``"exception"``,
        ``"unavailable"`` or None.
    """
    checked = check_call(call, tools)
    return checked if isinstance(checked, ToolResult) else run_validated(checked, call)

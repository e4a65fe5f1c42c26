"""Execute parsed tool calls; every failure becomes an error ``ToolResult``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from turnrl.tools.parsers import ToolCall
from turnrl.tools.tool import Tool
from turnrl.tools.validation import validate_arguments

ToolError = Literal[None, "unknown_tool", "bad_arguments", "exception", "timeout", "limit"]
"""Why a call failed: no such tool, arguments that break its schema, the tool raised, it took
longer than its executor's ``timeout_s``, or a sandbox limit stopped the program it ran."""


@dataclass(frozen=True)
class ToolResult:
    """The observation produced by one tool call.

    Attributes:
        call: The call that was executed.
        content: ``str(return value)`` on success, else an ``"Error: ..."`` text
            meant for the model.
        error: None on success, else the failure kind.
    """

    call: ToolCall
    content: str
    error: ToolError

    @property
    def ok(self) -> bool:
        """True when the tool ran and returned normally."""
        return self.error is None


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
    problem = validate_arguments(call.arguments, chosen.parameters)
    if problem is not None:
        return ToolResult(call, f"Error: bad arguments for tool {chosen.name!r}: {problem}.", "bad_arguments")
    return chosen


def run_validated(chosen: Tool, call: ToolCall) -> ToolResult:
    """Run an already validated call in this thread; an exception becomes an error result.

    A code tool (one whose ``fn`` returns a ``turnrl.tools.executors.Program``) is refused
    with an ``"exception"`` result: its program must run in a sandboxing executor.
    """
    try:
        value = chosen.fn(**call.arguments)
    except Exception as e:
        return ToolResult(call, f"Error: tool {chosen.name!r} raised {type(e).__name__}: {e}", "exception")
    from turnrl.tools.executors.base import Program  # here: the executors package imports this module

    if isinstance(value, Program):
        return ToolResult(
            call,
            f"Error: tool {chosen.name!r} is a code tool (it returns a Program) and cannot run in-process; "
            f"run it with a sandboxing executor (executor='sandbox' or 'docker').",
            "exception",
        )
    return ToolResult(call, str(value), None)


def execute_call(call: ToolCall, tools: Mapping[str, Tool]) -> ToolResult:
    """Validate and run one call synchronously, in this thread (no executor).

    Never raises for ordinary exceptions (``KeyboardInterrupt``/``SystemExit``
    propagate). Validation failures and tool exceptions become error results.

    Args:
        call: The parsed call.
        tools: Available tools by name.

    Returns:
        The result; ``error`` is ``"unknown_tool"``, ``"bad_arguments"``,
        ``"exception"`` or None.
    """
    checked = check_call(call, tools)
    return checked if isinstance(checked, ToolResult) else run_validated(checked, call)

"""Execute parsed tool calls; every failure becomes an error ``ToolResult``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from turnrl.tools.parsers import ToolCall
from turnrl.tools.tool import Tool
from turnrl.tools.validation import validate_arguments

ToolError = Literal[None, "unknown_tool", "bad_arguments", "exception"]


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


def execute_call(call: ToolCall, tools: Mapping[str, Tool]) -> ToolResult:
    """Validate and run one call.

    Never raises for ordinary exceptions (``KeyboardInterrupt``/``SystemExit``
    propagate). Validation failures and tool exceptions become error results.

    Args:
        call: The parsed call.
        tools: Available tools by name.

    Returns:
        The result; ``error`` is ``"unknown_tool"``, ``"bad_arguments"``,
        ``"exception"`` or None.
    """
    chosen = tools.get(call.name)
    if chosen is None:
        available = ", ".join(sorted(tools))
        hint = f"Available tools: {available}." if available else "No tools are available in this task."
        return ToolResult(call, f"Error: unknown tool {call.name!r}. {hint}", "unknown_tool")
    problem = validate_arguments(call.arguments, chosen.parameters)
    if problem is not None:
        return ToolResult(call, f"Error: bad arguments for tool {chosen.name!r}: {problem}.", "bad_arguments")
    try:
        value = chosen.fn(**call.arguments)
        return ToolResult(call, str(value), None)
    except Exception as e:
        return ToolResult(call, f"Error: tool {chosen.name!r} raised {type(e).__name__}: {e}", "exception")

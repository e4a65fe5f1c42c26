"""Tools for LLM agents: schemas, call parsing, safe execution, and built-in tools."""

from turnrl.tools.calculator import calculator
from turnrl.tools.execute import ToolError, ToolResult, ToolUnavailableError, check_call, execute_call
from turnrl.tools.parsers import (
    FORMATTERS,
    PARSERS,
    ParseResult,
    ToolCall,
    format_call,
    get_parser,
    other_formats,
    register_formatter,
    register_parser,
)
from turnrl.tools import family_parsers  # noqa: F401  (registers the model families' formats)
from turnrl.tools.tool import Tool, ToolMethod, bind_tools, tool, tool_map
from turnrl.tools.prompt import example_call, tools_prompt

# Last: the executors and code tools import the modules above.
from turnrl.tools.executors import EXECUTORS, Executor, Limits, Program, RunResult, get_executor, run_sync  # noqa: E402
from turnrl.tools.code import run_python, run_shell  # noqa: E402

__all__ = [
    "EXECUTORS",
    "Executor",
    "FORMATTERS",
    "Limits",
    "PARSERS",
    "ParseResult",
    "Program",
    "RunResult",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolMethod",
    "ToolResult",
    "ToolUnavailableError",
    "bind_tools",
    "calculator",
    "check_call",
    "example_call",
    "execute_call",
    "format_call",
    "get_executor",
    "get_parser",
    "other_formats",
    "register_formatter",
    "register_parser",
    "run_python",
    "run_shell",
    "run_sync",
    "tool",
    "tool_map",
    "tools_prompt",
]

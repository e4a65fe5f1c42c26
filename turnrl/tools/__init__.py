"""Tools for LLM agents: schemas, call parsing, safe execution, and built-in tools."""

from turnrl.tools.calculator import calculator
from turnrl.tools.execute import ToolResult, execute_call
from turnrl.tools.parsers import (
    FORMATTERS,
    PARSERS,
    ParseResult,
    ToolCall,
    format_call,
    get_parser,
    register_formatter,
    register_parser,
)
from turnrl.tools.tool import Tool, tool, tool_map

__all__ = [
    "FORMATTERS",
    "PARSERS",
    "ParseResult",
    "Tool",
    "ToolCall",
    "ToolResult",
    "calculator",
    "execute_call",
    "format_call",
    "get_parser",
    "register_formatter",
    "register_parser",
    "tool",
    "tool_map",
]

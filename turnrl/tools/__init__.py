"""Tools for LLM agents: schemas, call parsing, safe execution, and built-in tools."""

from turnrl.tools.calculator import calculator
from turnrl.tools.execute import ToolResult, execute_call
from turnrl.tools.parsers import PARSERS, ParseResult, ToolCall, get_parser, register_parser
from turnrl.tools.tool import Tool, tool, tool_map

__all__ = [
    "PARSERS",
    "ParseResult",
    "Tool",
    "ToolCall",
    "ToolResult",
    "calculator",
    "execute_call",
    "get_parser",
    "register_parser",
    "tool",
    "tool_map",
]

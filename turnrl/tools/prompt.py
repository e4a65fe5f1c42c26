"""How to call tools, as prompt text: the one place that writes it, from the tools and the parser.

``tools_prompt(tools, parser)`` lists each tool's JSON schema and shows a call written by the
parser's own formatter (``format_call``), so a prompt always demonstrates the format the env
reads: an env never hand-writes a call format or a tool description.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from turnrl.tools.parsers import ToolCall, format_call
from turnrl.tools.tool import Tool

PLACEHOLDERS = {"string": "...", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
"""The value an example call gives a required argument of each JSON type."""


def example_call(t: Tool | dict) -> ToolCall:
    """A call of ``t`` (a tool or its JSON schema) with a placeholder for each required argument
    (an enum's first value, else ``PLACEHOLDERS`` of its type): a demonstration of the call
    format, not a meaningful call."""
    name, parameters = _name_and_parameters(t)
    properties = parameters.get("properties", {})
    arguments: dict[str, Any] = {}
    for arg in parameters.get("required", []):
        spec = properties.get(arg, {})
        arguments[arg] = spec["enum"][0] if spec.get("enum") else PLACEHOLDERS.get(spec.get("type"), "...")
    return ToolCall(name, arguments)


def _name_and_parameters(t: Tool | dict) -> tuple[str, dict]:
    if isinstance(t, Tool):
        return t.name, t.parameters
    function = t.get("function", t)
    return function["name"], function.get("parameters", {})


def tools_prompt(tools: Sequence[Tool | dict], parser: str, example: ToolCall | None = None) -> str:
    """The text that tells a model which tools it has and how to call them.

    One ``Tool: <JSON schema>`` line per tool, then ``Call a tool like this:`` and ``example``
    (default: ``example_call(tools[0])``) written in the ``parser`` format by ``format_call``.
    A model that copies the example writes a call the ``parser`` reads.

    Args:
        tools: The tools (or their JSON schemas, as ``Tool.schema()`` gives), at least one.
        parser: A registered parser name (``turnrl.tools.PARSERS``).
        example: The call to show; a meaningful one teaches more than placeholders.

    Raises:
        ValueError: If ``tools`` is empty (an env without tools has nothing to describe).
        KeyError: If ``parser`` is unknown (the message lists the valid names).
    """
    if not tools:
        raise ValueError("tools_prompt() needs at least one tool; an env without tools has no call format to show")
    example = example_call(tools[0]) if example is None else example
    schemas = "\n".join(f"Tool: {json.dumps(t.schema() if isinstance(t, Tool) else dict(t))}" for t in tools)
    return f"{schemas}\nCall a tool like this:\n{format_call(example, parser)}"

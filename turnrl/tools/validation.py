"""Validate decoded JSON tool arguments against a tool's parameter schema."""

from __future__ import annotations

from typing import Any

from turnrl.tools.schema import json_type_name


def validate_arguments(arguments: dict, parameters: dict) -> str | None:
    """Check call arguments against an object schema built by ``tool()``.

    Rules: every required property present, no unexpected property, and each
    value of the declared JSON type (``bool`` is not ``integer``; ``integer`` is
    accepted for ``number``), recursively for arrays/objects, and in ``enum``.

    Args:
        arguments: Decoded JSON arguments.
        parameters: The tool's ``{"type": "object", "properties", "required"}`` schema.

    Returns:
        None if valid, else a message naming the argument, the expected type and
        what was given.
    """
    properties: dict = parameters.get("properties", {})
    for name in arguments:
        if name not in properties:
            expected = ", ".join(properties) or "none"
            return f"unexpected argument {name!r}; the arguments are: {expected}"
    for name in parameters.get("required", []):
        if name not in arguments:
            return f"missing required argument {name!r} ({describe(properties[name])})"
    for name, value in arguments.items():
        problem = check_value(value, properties[name], name)
        if problem is not None:
            return problem
    return None


def check_value(value: Any, schema: dict, path: str) -> str | None:
    """Check one value against a schema fragment; returns a message or None."""
    expected = schema.get("type")
    if expected is not None and not _has_type(value, expected):
        return f"argument {path!r} must be {expected}, got {json_type_name(value)} ({_preview(value)})"
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        return f"argument {path!r} must be one of {schema['enum']}, got {_preview(value)}"
    if expected == "array" and "items" in schema:
        for i, item in enumerate(value):
            problem = check_value(item, schema["items"], f"{path}[{i}]")
            if problem is not None:
                return problem
    if expected == "object" and "additionalProperties" in schema:
        for key, item in value.items():
            problem = check_value(item, schema["additionalProperties"], f"{path}.{key}")
            if problem is not None:
                return problem
    return None


def describe(schema: dict) -> str:
    """Short human description of a schema fragment, e.g. ``string`` or ``one of ['a', 'b']``."""
    if "enum" in schema:
        return f"one of {schema['enum']}"
    if schema.get("type") == "array" and "items" in schema:
        return f"array of {describe(schema['items'])}"
    return str(schema.get("type", "any value"))


def _has_type(value: Any, expected: str) -> bool:
    actual = json_type_name(value)
    return actual == expected or (expected == "number" and actual == "integer")


def _same(value: Any, option: Any) -> bool:
    return json_type_name(value) == json_type_name(option) and value == option


def _preview(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

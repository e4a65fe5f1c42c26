"""Python type hints -> JSON schema, and JSON-type naming.

The subset of JSON schema used by tools is deliberately small, the subset
that chat templates (OpenAI / Qwen function calling) show to a model:
``integer``, ``number``, ``string``, ``boolean``, ``array`` (with ``items``),
``object`` and ``enum``.
"""

from __future__ import annotations

import types
import typing
from types import MappingProxyType
from typing import Any, Literal

_SCALARS = MappingProxyType({int: "integer", float: "number", str: "string", bool: "boolean"})

SUPPORTED_HINTS = "int, float, str, bool, list[X], dict[str, X], Literal[...], Optional[X]"


def json_type_name(value: Any) -> str:
    """The JSON type name of a decoded JSON value (``bool`` is ``boolean``, not ``integer``).

    Args:
        value: A value as produced by ``json.loads``.

    Returns:
        One of ``null``, ``boolean``, ``integer``, ``number``, ``string``, ``array``,
        ``object``, or the Python type name for non-JSON values.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """Split ``Optional[X]`` / ``X | None`` into ``(X, True)``; other hints give ``(hint, False)``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def hint_to_schema(hint: Any) -> dict:
    """Convert a (non-Optional) type hint to a JSON schema fragment.

    Args:
        hint: A type hint such as ``int``, ``list[str]`` or ``Literal["a", "b"]``.

    Returns:
        A fresh JSON schema dict, e.g. ``{"type": "array", "items": {"type": "string"}}``.

    Raises:
        TypeError: If the hint is not one of ``SUPPORTED_HINTS``.
    """
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is list or origin is list:
        if len(args) > 1:
            raise TypeError(f"list hint {hint!r} must have at most one item type")
        return {"type": "array", "items": hint_to_schema(args[0])} if args else {"type": "array"}
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"dict hint {hint!r} must have str keys (JSON objects have string keys)")
        if len(args) == 2:
            return {"type": "object", "additionalProperties": hint_to_schema(args[1])}
        return {"type": "object"}
    if origin is Literal:
        return _literal_schema(hint, args)
    raise TypeError(f"unsupported type hint {hint!r}; supported: {SUPPORTED_HINTS}")


def _literal_schema(hint: Any, values: tuple) -> dict:
    kinds = {json_type_name(v) for v in values}
    if not values or not kinds <= {"string", "integer", "number", "boolean"}:
        raise TypeError(f"Literal hint {hint!r} must list str, int, float or bool values")
    schema: dict = {"enum": list(values)}
    if len(kinds) == 1:
        schema = {"type": kinds.pop(), **schema}
    return schema

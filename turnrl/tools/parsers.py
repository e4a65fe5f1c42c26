"""Tool-call parsers: model text -> ``ParseResult``, in a registry by format name.

A parser is a pure function ``(text: str) -> ParseResult`` that never raises.
Register new formats with ``@register_parser("name")``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from turnrl.tools.schema import json_type_name


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call.

    Attributes:
        name: Tool name as written by the model.
        arguments: Decoded JSON arguments object (``{}`` when omitted).
    """

    name: str
    arguments: dict = field(hash=False)


@dataclass(frozen=True)
class ParseResult:
    """The outcome of parsing one assistant turn.

    Attributes:
        status: ``"ok"`` (one or more well-formed calls), ``"malformed"`` (some call
            markup is broken; ``calls`` is then empty and nothing is executed), or
            ``"absent"`` (no call markup at all).
        calls: The parsed calls, in order of appearance.
        content: The text outside the complete call blocks, stripped.
        error: For ``"malformed"``, what is wrong and how to fix it; else None.
    """

    status: Literal["ok", "malformed", "absent"]
    calls: tuple[ToolCall, ...]
    content: str
    error: str | None


Parser = Callable[[str], ParseResult]

PARSERS: dict[str, Parser] = {}
"""Registry: parser name -> parser function. Use ``register_parser`` to add."""


def register_parser(name: str) -> Callable[[Parser], Parser]:
    """Decorator registering a parser function under ``name``.

    Raises:
        ValueError: If ``name`` is already registered.
    """

    def decorate(fn: Parser) -> Parser:
        if name in PARSERS:
            raise ValueError(f"tool parser {name!r} is already registered; choose another name")
        PARSERS[name] = fn
        return fn

    return decorate


def get_parser(name: str) -> Parser:
    """Look up a registered parser.

    Raises:
        KeyError: If ``name`` is unknown; the message lists the valid names.
    """
    if name not in PARSERS:
        raise KeyError(f"unknown tool parser {name!r}; valid parsers: {sorted(PARSERS)}")
    return PARSERS[name]


OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL_SHAPE = '{"name": "<tool name>", "arguments": {...}}'


@register_parser("hermes")
def parse_hermes(text: str) -> ParseResult:
    """Parse Hermes/Qwen calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    Several blocks per text are allowed; whitespace around the JSON is optional.
    Missing ``arguments`` means ``{}``. Never raises.

    Args:
        text: The assistant turn.

    Returns:
        The parse; see ``ParseResult``.
    """
    if not isinstance(text, str):
        return ParseResult("malformed", (), "", f"expected the turn as text, got {type(text).__name__}")
    if OPEN not in text and CLOSE not in text:
        return ParseResult("absent", (), text.strip(), None)
    bodies, outside, error = _split_blocks(text)
    content = "\n".join(part.strip() for part in outside if part.strip())
    if error is not None:
        return ParseResult("malformed", (), content, error)
    calls: list[ToolCall] = []
    for index, body in enumerate(bodies, start=1):
        call = _decode_call(body, index)
        if isinstance(call, str):
            return ParseResult("malformed", (), content, call)
        calls.append(call)
    return ParseResult("ok", tuple(calls), content, None)


def _split_blocks(text: str) -> tuple[list[str], list[str], str | None]:
    """Split into call bodies and outside text; the error is for broken tag structure."""
    bodies: list[str] = []
    outside: list[str] = []
    pos = 0
    while True:
        start, stray = text.find(OPEN, pos), text.find(CLOSE, pos)
        if stray != -1 and (start == -1 or stray < start):
            outside.append(text[pos:])
            return bodies, outside, (
                f"stray {CLOSE} at character {stray} without a matching {OPEN}; "
                f"wrap each call as {OPEN}{_CALL_SHAPE}{CLOSE}"
            )
        if start == -1:
            outside.append(text[pos:])
            return bodies, outside, None
        outside.append(text[pos:start])
        body_start = start + len(OPEN)
        end, reopen = text.find(CLOSE, body_start), text.find(OPEN, body_start)
        if end == -1 or (reopen != -1 and reopen < end):
            outside.append(text[start:])
            return bodies, outside, (
                f"unclosed {OPEN} at character {start}; end each call with {CLOSE} "
                "before starting another"
            )
        bodies.append(text[body_start:end])
        pos = end + len(CLOSE)


def _decode_call(body: str, index: int) -> ToolCall | str:
    """Decode one block body; returns the call, or an error message."""
    where = f"tool call {index}"
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return f"{where} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); write {_CALL_SHAPE}"
    except (ValueError, RecursionError) as e:
        return f"{where} is not valid JSON ({type(e).__name__}); write {_CALL_SHAPE}"
    if not isinstance(obj, dict):
        return f"{where} must be a JSON object {_CALL_SHAPE}, got {json_type_name(obj)}"
    if "name" not in obj:
        return f'{where} has no "name"; write {_CALL_SHAPE}'
    name = obj["name"]
    if not isinstance(name, str) or not name.strip():
        return f'{where}: "name" must be a non-empty string, got {json_type_name(name)}'
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, dict):
        return f'{where}: "arguments" must be a JSON object like {{"x": 1}}, got {json_type_name(arguments)}'
    return ToolCall(name=name, arguments=arguments)

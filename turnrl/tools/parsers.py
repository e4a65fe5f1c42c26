"""Tool-call parsers: model text -> ``ParseResult``, in a registry by format name.

A parser is a pure function ``(text: str) -> ParseResult`` that never raises.
Register new formats with ``@register_parser("name")``, and the inverse, writing one
``ToolCall`` in that format, with ``@register_formatter("name")``.

Formats: ``"hermes"`` (``<tool_call>{json}</tool_call>``), ``"json_fenced"`` (Markdown
code blocks tagged ``json`` or ``tool_call``) and ``"xml"`` (``<tool>NAME</tool><args>{json}</args>``).
``other_formats`` tells which other formats read calls from a text the chosen parser finds none
in (a model, or a prompt, writing calls in a format the env does not read).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from turnrl.registry import Registry
from turnrl.tools.schema import json_type_name


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call.

    Attributes:
        name: Tool name as written by the model.
        arguments: Decoded JSON arguments object (``{}`` when omitted).
        raw: For formats that write values without JSON framing (``qwen3_coder``, ``glm4``):
            each argument's text as written. A value written bare reads as JSON where it can
            (``5``, ``true``, ``null``), so ``check_call`` gives a parameter the tool's schema
            types as a string its raw text back (the real templates render the string ``"5"``
            as ``5``). None for JSON formats.
    """

    name: str
    arguments: dict = field(hash=False)
    raw: dict | None = field(default=None, hash=False, compare=False, repr=False)


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

PARSERS: Registry[Parser] = Registry("tool parser")
"""Registry: parser name -> parser function."""

register_parser = PARSERS.register
"""Decorator registering a parser function under a name (a taken name raises ValueError)."""


def get_parser(name: str) -> Parser:
    """Look up a registered parser.

    Raises:
        KeyError: If ``name`` is unknown; the message lists the valid names.
    """
    return PARSERS.get(name)


def other_formats(text: str, parser: str, tool_names: Collection[str]) -> list[str]:
    """The registered formats other than ``parser`` that read well-formed calls of one of
    ``tool_names`` in ``text`` (sorted; empty when none does).

    A turn that ``parser`` finds no call in, but another format reads a call of a known tool
    in, is a call written in the wrong format: the env cannot read it and says so.
    """
    found = []
    for name in PARSERS.names():
        if name == parser:
            continue
        parse = PARSERS[name](text)
        if parse.status == "ok" and any(call.name in tool_names for call in parse.calls):
            found.append(name)
    return found


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
        return _not_text(text)
    if OPEN not in text and CLOSE not in text:
        return ParseResult("absent", (), text.strip(), None)
    bodies, outside, error = _split_blocks(text)
    content = _join(outside)
    if error is not None:
        return ParseResult("malformed", (), content, error)
    calls: list[ToolCall] = []
    for index, body in enumerate(bodies, start=1):
        call = _decode_call(body, index)
        if isinstance(call, str):
            return ParseResult("malformed", (), content, call)
        calls.append(call)
    return ParseResult("ok", tuple(calls), content, None)


def _not_text(value: object) -> ParseResult:
    return ParseResult("malformed", (), "", f"expected the turn as text, got {type(value).__name__}")


def _join(outside: list[str]) -> str:
    """The ``content`` of a parse: the non-blank outside pieces, each stripped, one per line."""
    return "\n".join(part.strip() for part in outside if part.strip())


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


def _load_json(body: str) -> tuple[Any, str | None]:
    """Decode JSON text; returns ``(value, None)``, or ``(None, why)`` when it is not valid JSON."""
    try:
        return json.loads(body), None
    except json.JSONDecodeError as e:
        return None, f"{e.msg} at line {e.lineno} column {e.colno}"
    except (ValueError, RecursionError) as e:
        return None, type(e).__name__


def _decode_call(body: str, index: int) -> ToolCall | str:
    """Decode one block body; returns the call, or an error message."""
    obj, problem = _load_json(body)
    if problem is not None:
        return f"tool call {index} is not valid JSON ({problem}); write {_CALL_SHAPE}"
    return _call_from_object(obj, index)


def _call_from_object(obj: Any, index: int) -> ToolCall | str:
    """Check one decoded ``{"name": ..., "arguments": ...}`` value; returns the call, or an error message."""
    where = f"tool call {index}"
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


FENCE = "```"
FENCE_TAGS = ("json", "tool_call")
"""Fence tags (case-insensitive) that mark a call block; other fenced blocks are ordinary content."""
_FENCE_TAG = re.compile(r"[ \t]*([A-Za-z_][\w.+-]*)")


@register_parser("json_fenced")
def parse_json_fenced(text: str) -> ParseResult:
    """Parse calls written as Markdown code blocks tagged ``json`` or ``tool_call``.

    Format::

        ```json
        {"name": "calculator", "arguments": {"expression": "2 + 3"}}
        ```

    A block holds one call object or a JSON list of them (several calls). Several
    blocks per text are allowed; each call is checked exactly as for ``"hermes"``.
    Blocks with any other tag, or none, are ordinary content; a turn without a
    call-tagged block is ``"absent"``. A fence may start anywhere, not only at a line
    start, and a block ends at the next three backticks, so no block may contain them.
    Never raises.

    Args:
        text: The assistant turn.

    Returns:
        The parse; see ``ParseResult``. ``content`` keeps non-call blocks verbatim.
    """
    if not isinstance(text, str):
        return _not_text(text)
    bodies, outside, error = _split_fences(text)
    content = _join(outside)
    if error is not None:
        return ParseResult("malformed", (), content, error)
    if not bodies:
        return ParseResult("absent", (), text.strip(), None)
    calls: list[ToolCall] = []
    for block, body in enumerate(bodies, start=1):
        obj, problem = _load_json(body)
        if problem is not None:
            return ParseResult("malformed", (), content, (
                f"json block {block} is not valid JSON ({problem}); write {_CALL_SHAPE} "
                "or a JSON list of them"
            ))
        items = obj if isinstance(obj, list) else [obj]
        if not items:
            return ParseResult("malformed", (), content, (
                f"json block {block} is an empty list; put at least one {_CALL_SHAPE} in it"
            ))
        for item in items:
            call = _call_from_object(item, len(calls) + 1)
            if isinstance(call, str):
                return ParseResult("malformed", (), content, call)
            calls.append(call)
    return ParseResult("ok", tuple(calls), content, None)


def _split_fences(text: str) -> tuple[list[str], list[str], str | None]:
    """Split into call-block bodies and outside text; the error is for an unclosed call block."""
    bodies: list[str] = []
    outside: list[str] = []
    pos = scan = 0  # pos: start of pending outside text; scan: where to look for the next fence
    while True:
        start = text.find(FENCE, scan)
        if start == -1:
            outside.append(text[pos:])
            return bodies, outside, None
        tag_match = _FENCE_TAG.match(text, start + len(FENCE))
        tag = tag_match.group(1).lower() if tag_match else ""
        body_start = tag_match.end() if tag_match else start + len(FENCE)
        end = text.find(FENCE, body_start)
        if tag not in FENCE_TAGS:  # an ordinary block: it stays in the outside text
            if end == -1:
                outside.append(text[pos:])
                return bodies, outside, None
            scan = end + len(FENCE)
            continue
        if end == -1:
            outside.append(text[pos:])
            return bodies, outside, (
                f"unclosed {FENCE}{tag} block at character {start}; end each call block "
                f"with a line of three backticks ({FENCE})"
            )
        outside.append(text[pos:start])
        bodies.append(text[body_start:end])
        pos = scan = end + len(FENCE)


TOOL_OPEN, TOOL_CLOSE, ARGS_OPEN, ARGS_CLOSE = "<tool>", "</tool>", "<args>", "</args>"
_XML_SHAPE = '<tool>NAME</tool><args>{"x": 1}</args>'
_XML_TAG = re.compile(r"</?(?:tool|args)>")
_ARGS_NEXT = re.compile(r"\s*<args>")


@register_parser("xml")
def parse_xml(text: str) -> ParseResult:
    """Parse XML-tag calls: ``<tool>NAME</tool>`` optionally followed by ``<args>{json}</args>``.

    Format::

        <tool>calculator</tool><args>{"expression": "2 + 3"}</args>

    Whitespace may separate ``</tool>`` and ``<args>`` and surround the name, which
    is stripped. Without ``<args>`` the arguments are ``{}``. Several pairs per text
    give several calls. Text without any of the four tags is ``"absent"``. Never raises.

    Args:
        text: The assistant turn.

    Returns:
        The parse; see ``ParseResult``.
    """
    if not isinstance(text, str):
        return _not_text(text)
    if _XML_TAG.search(text) is None:
        return ParseResult("absent", (), text.strip(), None)
    pairs, outside, error = _split_xml(text)
    content = _join(outside)
    if error is not None:
        return ParseResult("malformed", (), content, error)
    calls: list[ToolCall] = []
    for index, (raw_name, raw_args) in enumerate(pairs, start=1):
        call = _decode_xml_call(raw_name, raw_args, index)
        if isinstance(call, str):
            return ParseResult("malformed", (), content, call)
        calls.append(call)
    return ParseResult("ok", tuple(calls), content, None)


def _split_xml(text: str) -> tuple[list[tuple[str, str | None]], list[str], str | None]:
    """Split into ``(name, args or None)`` pairs and outside text; the error is for broken tags."""
    pairs: list[tuple[str, str | None]] = []
    outside: list[str] = []
    pos = 0
    while True:
        tag = _XML_TAG.search(text, pos)
        if tag is None:
            outside.append(text[pos:])
            return pairs, outside, None
        if tag.group() != TOOL_OPEN:
            outside.append(text[pos:])
            where = f"stray {tag.group()} at character {tag.start()}"
            if tag.group() == ARGS_OPEN:
                return pairs, outside, f"{where}: <args> must directly follow <tool>NAME</tool>, as {_XML_SHAPE}"
            return pairs, outside, f"{where} without its opening tag; write each call as {_XML_SHAPE}"
        outside.append(text[pos:tag.start()])
        name_end = _XML_TAG.search(text, tag.end())
        if name_end is None or name_end.group() != TOOL_CLOSE:
            outside.append(text[tag.start():])
            return pairs, outside, (
                f"unclosed <tool> at character {tag.start()}; write the tool name then </tool>, as {_XML_SHAPE}"
            )
        name, pos, args = text[tag.end():name_end.start()], name_end.end(), None
        args_open = _ARGS_NEXT.match(text, pos)
        if args_open is not None:
            args_end = _XML_TAG.search(text, args_open.end())
            if args_end is None or args_end.group() != ARGS_CLOSE:
                outside.append(text[tag.start():])
                return pairs, outside, (
                    f"unclosed <args> at character {args_open.end() - len(ARGS_OPEN)}; "
                    "end the arguments object with </args>"
                )
            args, pos = text[args_open.end():args_end.start()], args_end.end()
        pairs.append((name, args))


def _decode_xml_call(raw_name: str, raw_args: str | None, index: int) -> ToolCall | str:
    """Check one ``<tool>``/``<args>`` pair; returns the call, or an error message."""
    name = raw_name.strip()
    if not name:
        return f"tool call {index} has an empty name; write the tool name between the tags, as <tool>calculator</tool>"
    if raw_args is None:
        return ToolCall(name=name, arguments={})
    arguments, problem = _load_json(raw_args)
    where = f"tool call {index} ({name})"
    if problem is not None:
        return (f'{where}: <args> is not valid JSON ({problem}); write a JSON object like <args>{{"x": 1}}</args>, '
                "or omit <args> when there are no arguments")
    if not isinstance(arguments, dict):
        return f'{where}: <args> must hold a JSON object like {{"x": 1}}, got {json_type_name(arguments)}'
    return ToolCall(name=name, arguments=arguments)


Formatter = Callable[[ToolCall], str]

FORMATTERS: Registry[Formatter] = Registry("tool-call format")
"""Registry: format name -> function writing one ``ToolCall`` in that format (the inverse of
``PARSERS[name]``)."""

register_formatter = FORMATTERS.register
"""Decorator registering a formatter under a name (normally its parser's name)."""


def format_call(call: ToolCall, name: str) -> str:
    """Write ``call`` in format ``name``, e.g. for prompts or demonstrations.

    Contract: ``get_parser(name)(format_call(call, name))`` is ``ok`` with ``calls == (call,)``
    and empty ``content``; several formatted calls joined by newlines parse to all of them.

    Raises:
        KeyError: If ``name`` is unknown; the message lists the valid names.
        ValueError: If the call cannot be written in that format (see each formatter).
    """
    return FORMATTERS.get(name)(call)


def _dump_json(value: Any) -> str:
    """JSON text with ``<`` and backticks escaped, so no string inside can close a block."""
    return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c").replace("`", "\\u0060")


@register_formatter("hermes")
def _format_hermes(call: ToolCall) -> str:
    return f"{OPEN}\n{_dump_json({'name': call.name, 'arguments': call.arguments})}\n{CLOSE}"


@register_formatter("json_fenced")
def _format_json_fenced(call: ToolCall) -> str:
    return f"{FENCE}json\n{_dump_json({'name': call.name, 'arguments': call.arguments})}\n{FENCE}"


@register_formatter("xml")
def _format_xml(call: ToolCall) -> str:
    """Raises ValueError if the name is blank, has surrounding whitespace, or contains ``<``."""
    if not call.name.strip() or call.name != call.name.strip() or "<" in call.name:
        raise ValueError(f"tool name {call.name!r} cannot be written between <tool> tags; "
                         "use a name without '<' or surrounding whitespace")
    return f"{TOOL_OPEN}{call.name}{TOOL_CLOSE}{ARGS_OPEN}{_dump_json(call.arguments)}{ARGS_CLOSE}"

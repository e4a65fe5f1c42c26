"""The native tool-call formats of the model families people train: a parser and its formatter each.

Each formatter writes one call as that family's chat template renders an assistant message whose
``tool_calls`` holds it (content empty), between the generation prompt and the end-of-turn token,
so a model trained on the expert's calls writes what the template re-renders. Where a formatter
cannot equal its template, its parser's docstring says where and why. The templates are TRL's copies
(``trl/chat_templates/*.jinja``); tests/tools/test_family_parsers.py renders them and compares.

Formats: ``qwen3_coder`` (Qwen3.5/3.6, Qwen3-Coder, Nemotron 3), ``llama3_json`` (Llama 3.1/3.2),
``harmony`` (gpt-oss), ``deepseek_v3`` (DeepSeek-V3), ``glm4`` (GLM-4.5, GLM-4-MoE), ``gemma4``
(Gemma 4) and ``pythonic`` (LFM2, LFM2.5).

Three formats share the ``<tool_call>`` tags: ``hermes`` (JSON inside), ``qwen3_coder``
(``<function=`` inside) and ``glm4`` (a bare name inside). The last two read only the blocks shaped
their way and call a turn whose blocks are all shaped otherwise ``absent``, so ``other_formats``
names the format that wrote it.
"""

from __future__ import annotations

import ast
import json
import keyword
import re
from collections.abc import Callable
from typing import Any

from turnrl.tools.parsers import (
    ParseResult,
    ToolCall,
    _join,
    _load_json,
    _not_text,
    register_formatter,
    register_parser,
)
from turnrl.tools.schema import json_type_name

Decode = Callable[[str, int], "list[ToolCall] | str"]


# ---- shared helpers ----------------------------------------------------------------------------


def _split(text: str, open_: str, close: str, shape: str) -> tuple[list[str], list[str], str | None]:
    """Split ``text`` at ``open_ ... close`` blocks into bodies and outside text; the error is for a
    stray ``close`` or an unclosed ``open_`` (whose rest of text is then the last body)."""
    bodies: list[str] = []
    outside: list[str] = []
    pos = 0
    while True:
        start, stray = text.find(open_, pos), text.find(close, pos)
        if stray != -1 and (start == -1 or stray < start):
            outside.append(text[pos:])
            return bodies, outside, (f"stray {close} at character {stray} without a matching {open_}; "
                                     f"write each call as {shape}")
        if start == -1:
            outside.append(text[pos:])
            return bodies, outside, None
        outside.append(text[pos:start])
        body_start = start + len(open_)
        end, reopen = text.find(close, body_start), text.find(open_, body_start)
        if end == -1 or (reopen != -1 and reopen < end):
            outside.append(text[start:])
            bodies.append(text[body_start:])
            return bodies, outside, (f"unclosed {open_} at character {start}; end each call with {close} "
                                     "before starting another")
        bodies.append(text[body_start:end])
        pos = end + len(close)


def _parse_blocks(text: Any, open_: str, close: str, shape: str, decode: Decode,
                  claims: Callable[[str], bool] = lambda body: True, fmt: str = "") -> ParseResult:
    """Parse a format whose calls sit in ``open_ ... close`` blocks, each decoded by ``decode``.

    ``claims(body)`` tells a block of this format from one of another format sharing the tags: a
    text none of whose blocks it claims is ``absent`` (for ``other_formats`` to name the writer)."""
    if not isinstance(text, str):
        return _not_text(text)
    if open_ not in text and close not in text:
        return ParseResult("absent", (), text.strip(), None)
    bodies, outside, error = _split(text, open_, close, shape)
    if not any(claims(body) for body in bodies):
        return ParseResult("absent", (), text.strip(), None)
    content = _join(outside)
    if error is not None:
        return ParseResult("malformed", (), content, error)
    calls: list[ToolCall] = []
    for index, body in enumerate(bodies, start=1):
        got = decode(body, index) if claims(body) else (
            f"tool call {index} is not in the {fmt} format; write each call as {shape}")
        if isinstance(got, str):
            return ParseResult("malformed", (), content, got)
        calls.extend(got)
    return ParseResult("ok", tuple(calls), content, None)


def _json(value: Any, closers: tuple[str, ...] = ()) -> str:
    """``value`` as the templates' ``tojson`` writes it; ``<`` escaped when a closing tag would
    appear in it (the templates would write a call that no parser can read back)."""
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("<", "\\u003c") if any(c in text for c in closers) else text


def _raw_or_json(value: Any, closers: tuple[str, ...]) -> str:
    """A value as the XML-ish templates write it: a string raw (``"5"`` as ``5``, as the real
    templates render it: ``check_call`` reads it back as the string the schema asks for), anything
    else as JSON. A string holding a closing tag is written as a JSON string instead: raw, it
    would end the block (the templates write it raw and cannot be read back)."""
    if isinstance(value, str) and not any(c in value for c in closers):
        return value
    return _json(value, closers)


def _raw_value(text: str) -> Any:
    """The inverse of ``_raw_or_json``: JSON when the text is JSON, else the raw string."""
    value, problem = _load_json(text)
    return text if problem is not None else value


def _name_ok(name: str, index: int, example: str) -> str | None:
    if not name.strip():
        return f"tool call {index} has an empty name; write it as {example}"
    return None


def _arguments(obj: Any, where: str, example: str) -> dict | str:
    if not isinstance(obj, dict):
        return f"{where}: the arguments must be a JSON object like {example}, got {json_type_name(obj)}"
    return obj


# ---- qwen3_coder ---------------------------------------------------------------------------------

QWEN_OPEN, QWEN_CLOSE = "<tool_call>", "</tool_call>"
_QWEN_SHAPE = "<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>"
_QWEN_CLOSERS = ("</parameter>", "</function>", QWEN_CLOSE)
_QWEN_FUNCTION = re.compile(r"\s*<function=([^>\n]*)>(.*?)</function>\s*", re.S)
_QWEN_PARAM = re.compile(r"\s*<parameter=([^>\n]*)>(.*?)</parameter>", re.S)


@register_parser("qwen3_coder")
def parse_qwen3_coder(text: str) -> ParseResult:
    """Parse Qwen3.5 / Qwen3.6 / Qwen3-Coder / Nemotron 3 calls (XML parameters, values raw).

    Format::

        <tool_call>
        <function=calculator>
        <parameter=expression>
        2 + 3
        </parameter>
        </function>
        </tool_call>

    A value is JSON when it reads as JSON (``3``, ``true``, ``["a"]``), else the raw string; one
    newline after ``<parameter=K>`` and before ``</parameter>`` is framing. Several blocks per text.
    ``<tool_call>`` blocks not starting with ``<function=`` (hermes JSON, glm4) are not this format.

    Template: equal to qwen3_6 and, without booleans, to qwen3_5 and nemotron_3_nano (they render a
    boolean as Python's ``True``). A string is written raw as the templates write it, so ``"5"``
    reads back as ``5`` here and ``check_call`` gives a string-typed parameter its text as written
    (``ToolCall.raw``); only a string holding a closing tag is written as a JSON string.
    """
    return _parse_blocks(text, QWEN_OPEN, QWEN_CLOSE, _QWEN_SHAPE, _decode_qwen,
                         claims=lambda body: body.lstrip().startswith("<function="), fmt="qwen3_coder")


def _decode_qwen(body: str, index: int) -> list[ToolCall] | str:
    function = _QWEN_FUNCTION.fullmatch(body)
    if function is None:
        return f"tool call {index} must hold one <function=NAME> ... </function> block; write {_QWEN_SHAPE}"
    name, inner = function.group(1).strip(), function.group(2)
    if (problem := _name_ok(name, index, "<function=calculator>")) is not None:
        return problem
    return _tagged_arguments(_QWEN_PARAM, inner, name, index, " in <function=...>",
                             "<parameter=KEY>\nVALUE\n</parameter>", _strip_one_newline)


def _strip_one_newline(raw: str) -> str:
    """A value written on lines of its own: one newline off each end."""
    raw = raw[1:] if raw.startswith("\n") else raw
    return raw[:-1] if raw.endswith("\n") else raw


def _tagged_arguments(pattern: re.Pattern, inner: str, name: str, index: int, where: str, shape: str,
                      clean=lambda raw: raw) -> list[ToolCall] | str:
    """The call ``name`` whose arguments are ``pattern`` matches (key, raw value) filling ``inner``;
    or what is wrong (text between them) and the ``shape`` to write each argument in."""
    arguments: dict[str, Any] = {}
    raw: dict[str, str] = {}
    pos = 0
    while (arg := pattern.match(inner, pos)) is not None:
        raw[arg.group(1)] = clean(arg.group(2))
        arguments[arg.group(1)] = _raw_value(raw[arg.group(1)])
        pos = arg.end()
    if inner[pos:].strip():
        return (f"tool call {index} ({name}): unexpected text {inner[pos:].strip()[:40]!r}{where}; write each "
                f"argument as {shape}")
    return [ToolCall(name, arguments, raw=raw)]


@register_formatter("qwen3_coder")
def _format_qwen3_coder(call: ToolCall) -> str:
    params = "".join(f"<parameter={k}>\n{_raw_or_json(v, _QWEN_CLOSERS)}\n</parameter>\n"
                     for k, v in call.arguments.items())
    return f"{QWEN_OPEN}\n<function={call.name}>\n{params}</function>\n{QWEN_CLOSE}"


# ---- llama3_json ---------------------------------------------------------------------------------

PYTHON_TAG = "<|python_tag|>"
_LLAMA_SHAPE = '{"name": "<tool name>", "parameters": {...}} on a line of its own'
_LLAMA_START = re.compile(r'^[ \t]*(?:<\|python_tag\|>)?[ \t]*(?=\{\s*"name"\s*:)', re.M)
_LLAMA_INSIDE = re.compile(r"(?:<tool_call>|```[ \t]*(?:json|tool_call))$", re.I)


@register_parser("llama3_json")
def parse_llama3_json(text: str) -> ParseResult:
    """Parse Llama 3.1 / 3.2 JSON calls: a JSON object on a line of its own.

    Format::

        {"name": "calculator", "parameters": {"expression": "2 + 3"}}

    A call starts a line with ``{"name"`` (after an optional ``<|python_tag|>``) and its object
    ends that line; text around it is content. An object followed by more text on its line is
    prose, and one that opens a hermes or fenced block is that format's. ``"arguments"`` is
    accepted for ``"parameters"``. Several calls are read, though the templates render one per turn
    (they raise on several). Template: equal (llama3_1, llama3_2).
    """
    if not isinstance(text, str):
        return _not_text(text)
    outside: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    for start in _LLAMA_START.finditer(text):
        if start.start() < pos or _LLAMA_INSIDE.search(text[max(0, start.start() - 40):start.start()].rstrip()):
            continue
        index, content = len(calls) + 1, _join([*outside, text[pos:start.start()]])
        try:
            obj, end = json.JSONDecoder().raw_decode(text, start.end())
        except json.JSONDecodeError as e:
            return ParseResult("malformed", (), content, f"tool call {index} is not valid JSON ({e.msg} at line "
                                                         f"{e.lineno} column {e.colno}); write {_LLAMA_SHAPE}")
        except (ValueError, RecursionError) as e:
            return ParseResult("malformed", (), content, f"tool call {index} is not valid JSON "
                                                         f"({type(e).__name__}); write {_LLAMA_SHAPE}")
        if text[end:].split("\n", 1)[0].strip():
            continue  # more text on its line: an object in prose, not a call
        if not isinstance(obj.get("name"), str) or not obj["name"].strip():
            return ParseResult("malformed", (), content, f'tool call {index}: "name" must be a non-empty string; '
                                                         f"write {_LLAMA_SHAPE}")
        arguments = _arguments(obj.get("parameters", obj.get("arguments", {})), f"tool call {index} ({obj['name']})",
                               '"parameters": {"x": 1}')
        if isinstance(arguments, str):
            return ParseResult("malformed", (), content, arguments)
        outside.append(text[pos:start.start()])
        calls.append(ToolCall(obj["name"], arguments))
        pos = end
    if not calls:
        return ParseResult("absent", (), text.strip(), None)
    return ParseResult("ok", tuple(calls), _join([*outside, text[pos:]]), None)


@register_formatter("llama3_json")
def _format_llama3_json(call: ToolCall) -> str:
    return json.dumps({"name": call.name, "parameters": call.arguments}, ensure_ascii=False)


# ---- harmony -------------------------------------------------------------------------------------

H_START, H_CHANNEL, H_MESSAGE, H_CALL = "<|start|>", "<|channel|>", "<|message|>", "<|call|>"
_H_TOKENS = re.compile(r"<\|(?:start|channel|message|end|call|return|constrain)\|>")
_H_END = re.compile(r"<\|(?:end|call|return|start)\|>")
_H_HEADER = re.compile(r"(?P<pre>.*?)(?:assistant)?\s*(?:to=(?P<r1>[^\s<]+))?\s*(?:<\|channel\|>(?P<chan>\w+))?"
                       r"\s*(?:to=(?P<r2>[^\s<]+))?\s*(?:<\|constrain\|>)?\s*(?:json)?\s*", re.S)
_H_UNFINISHED = re.compile(r"<\|(?:start|channel)\|>|to=functions\.")
_H_SHAPE = "<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{ARGS}<|call|>"


@register_parser("harmony")
def parse_harmony(text: str) -> ParseResult:
    """Parse gpt-oss (harmony) turns: a call is a message to ``functions.NAME`` with JSON arguments.

    Format::

        <|channel|>analysis<|message|>Add them.<|end|><|start|>assistant to=functions.calculator
        <|channel|>commentary json<|message|>{"expression": "2 + 3"}<|call|>

    (one line). A turn sampled after the generation prompt ``<|start|>assistant`` may begin with
    `` to=functions...``; the recipient may also follow the channel (``<|channel|>commentary
    to=functions.NAME <|constrain|>json``). A message ends at ``<|end|>``, ``<|call|>``,
    ``<|return|>``, the next ``<|start|>`` or the end of text (vLLM drops the stop token). Content is
    the ``final`` and recipient-less ``commentary`` text and any text outside messages; ``analysis``
    is reasoning and dropped. Several calls are several messages.

    Template (gptoss): the formatter writes the whole message, the generation prompt
    ``<|start|>assistant`` included, so that several calls join as the template renders them.
    """
    if not isinstance(text, str):
        return _not_text(text)
    if _H_TOKENS.search(text) is None:
        return ParseResult("absent", (), text.strip(), None)
    outside: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while (message := text.find(H_MESSAGE, pos)) != -1:
        head = text[pos:message]
        if H_START in head:
            outside.append(head[:head.rfind(H_START)])
            head = head[head.rfind(H_START) + len(H_START):]
        header = _H_HEADER.fullmatch(head)  # always matches: every part is optional
        body_start = message + len(H_MESSAGE)
        end = _H_END.search(text, body_start)
        body_end = end.start() if end else len(text)
        body = text[body_start:body_end]
        pos = end.end() if end and end.group() != H_START else body_end
        outside.append(header.group("pre"))
        recipient = header.group("r1") or header.group("r2")
        if not recipient:  # a final answer or a preamble is content; analysis is reasoning
            if header.group("chan") != "analysis":
                outside.append(body)
            continue
        index = len(calls) + 1
        name = recipient.removeprefix("functions.")
        if not name:
            return ParseResult("malformed", (), _join(outside), f"tool call {index} has an empty recipient; "
                                                                f"write {_H_SHAPE}")
        obj, problem = _load_json(body)
        if problem is not None:
            return ParseResult("malformed", (), _join(outside), (
                f"tool call {index} ({name}): the message is not valid JSON ({problem}); write {_H_SHAPE}"))
        arguments = _arguments(obj, f"tool call {index} ({name})", '{"x": 1}')
        if isinstance(arguments, str):
            return ParseResult("malformed", (), _join(outside), arguments)
        calls.append(ToolCall(name, arguments))
    rest = text[pos:]
    if (unfinished := _H_UNFINISHED.search(rest)) is not None:
        return ParseResult("malformed", (), _join(outside), (
            f"unfinished message at character {pos + unfinished.start()}: its header has no <|message|>; "
            f"write {_H_SHAPE}"))
    outside.append(rest)
    content = _join(outside)
    return ParseResult("ok", tuple(calls), content, None) if calls else ParseResult("absent", (), content, None)


@register_formatter("harmony")
def _format_harmony(call: ToolCall) -> str:
    args = _json(call.arguments, ("<|",))
    return f"{H_START}assistant to=functions.{call.name}{H_CHANNEL}commentary json{H_MESSAGE}{args}{H_CALL}"


# ---- deepseek_v3 ---------------------------------------------------------------------------------

DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_DS_SHAPE = f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}NAME\n```json\n{{ARGS}}\n```{DS_CALL_END}{DS_CALLS_END}"
_DS_V3_ARGS = re.compile(r"([^\n]*)\n```(?:json)?\n(.*)\n```\s*", re.S)


@register_parser("deepseek_v3")
def parse_deepseek_v3(text: str) -> ParseResult:
    """Parse DeepSeek-V3 calls: fenced JSON arguments inside the tool-call tokens.

    Format::

        <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator
        ```json
        {"expression": "2 + 3"}
        ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

    One ``<｜tool▁calls▁begin｜>`` block holds one or more calls (newline-separated); several blocks
    per text are allowed. DeepSeek-V3.1's ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}`` is read too.

    Template (deepseekv3): equal, given ``arguments`` as the JSON text ``json.dumps`` writes (the
    template concatenates it as a string; a dict raises there).
    """
    return _parse_blocks(text, DS_CALLS_BEGIN, DS_CALLS_END, _DS_SHAPE, _decode_deepseek, fmt="deepseek_v3")


def _decode_deepseek(body: str, first: int) -> list[ToolCall] | str:
    bodies, outside, error = _split(body, DS_CALL_BEGIN, DS_CALL_END, _DS_SHAPE)
    if error is None and (_join(outside) or not bodies):
        error = f"only {DS_CALL_BEGIN}...{DS_CALL_END} calls may stand between {DS_CALLS_BEGIN} and {DS_CALLS_END}"
    if error is not None:
        return f"tool calls block: {error}; write {_DS_SHAPE}"
    calls = []
    for index, call in enumerate(bodies, start=first):
        kind, sep, rest = call.partition(DS_SEP)
        v3 = _DS_V3_ARGS.fullmatch(rest) if kind.strip() == "function" else None
        name, args = (v3.group(1), v3.group(2)) if v3 else (kind, rest)
        if not sep or (kind.strip() == "function" and v3 is None):
            return f"tool call {index} must be function{DS_SEP}NAME then the arguments in a ```json block; write {_DS_SHAPE}"
        if (problem := _name_ok(name, index, f"function{DS_SEP}calculator")) is not None:
            return problem
        obj, problem = _load_json(args)
        if problem is not None:
            return f"tool call {index} ({name.strip()}): the arguments are not valid JSON ({problem}); write {_DS_SHAPE}"
        arguments = _arguments(obj, f"tool call {index} ({name.strip()})", '{"x": 1}')
        if isinstance(arguments, str):
            return arguments
        calls.append(ToolCall(name.strip(), arguments))
    return calls


@register_formatter("deepseek_v3")
def _format_deepseek_v3(call: ToolCall) -> str:
    args = _json(call.arguments, ("```", "<｜"))
    return f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}{call.name}\n```json\n{args}\n```{DS_CALL_END}{DS_CALLS_END}"


# ---- glm4 ----------------------------------------------------------------------------------------

_GLM_SHAPE = "<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>"
_GLM_CLOSERS = ("</arg_value>", "</arg_key>", QWEN_CLOSE)
_GLM_ARG = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


@register_parser("glm4")
def parse_glm4(text: str) -> ParseResult:
    """Parse GLM-4.5 / GLM-4-MoE calls: the name, then key/value tag pairs (values raw).

    Format::

        <tool_call>calculator
        <arg_key>expression</arg_key>
        <arg_value>2 + 3</arg_value>
        </tool_call>

    A value is JSON when it reads as JSON, else the raw string. Several blocks per text.
    ``<tool_call>`` blocks starting with ``{`` or ``<`` (hermes, qwen3_coder) are not this format.

    Template (glm4moe): equal; a string is written raw as the template writes it (``check_call``
    gives a string-typed parameter its text as written), one holding a closing tag as a JSON string.
    """
    return _parse_blocks(text, QWEN_OPEN, QWEN_CLOSE, _GLM_SHAPE, _decode_glm4,
                         claims=lambda body: body.strip()[:1] not in ("", "{", "[", "<"), fmt="glm4")


def _decode_glm4(body: str, index: int) -> list[ToolCall] | str:
    cut = body.find("<arg_key>")
    name, inner = (body, "") if cut == -1 else (body[:cut], body[cut:])
    name = name.strip()
    if "\n" in name or "<" in name:
        return f"tool call {index}: the name must be one line before the arguments; write {_GLM_SHAPE}"
    return _tagged_arguments(_GLM_ARG, inner, name, index, "", "<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>")


@register_formatter("glm4")
def _format_glm4(call: ToolCall) -> str:
    args = "".join(f"\n<arg_key>{k}</arg_key>\n<arg_value>{_raw_or_json(v, _GLM_CLOSERS)}</arg_value>"
                   for k, v in call.arguments.items())
    return f"{QWEN_OPEN}{call.name}{args}\n{QWEN_CLOSE}"


# ---- gemma4 --------------------------------------------------------------------------------------

G_OPEN, G_CLOSE, G_QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_G_SHAPE = '<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>'
_G_BARE = re.compile(r"[^,:{}\[\]<]*")
_G_KEY = re.compile(r"[A-Za-z_][\w.-]*")
_G_WORDS = {"true": True, "false": False, "null": None, "None": None}


class _Bad(ValueError):
    """A syntax error in a Gemma 4 or pythonic argument list."""


@register_parser("gemma4")
def parse_gemma4(text: str) -> ParseResult:
    """Parse Gemma 4 calls: ``call:NAME{...}`` with bare keys and ``<|"|>``-quoted strings.

    Format::

        <|tool_call>call:calculator{expression:<|"|>2 + 3<|"|>,n:1}<tool_call|>

    Values: ``<|"|>text<|"|>``, numbers, ``true``/``false``/``null`` (``None`` too), ``[...]`` and
    ``{...}``; keys bare or quoted. Several blocks per text.

    Template (gemma4): equal (keys sorted case-insensitively as ``dictsort`` does; ``None`` for
    null, as the template prints it), except that a key that is not a bare word is quoted; a string
    holding ``<|"|>`` cannot be written (ValueError).
    """
    return _parse_blocks(text, G_OPEN, G_CLOSE, _G_SHAPE, _decode_gemma4, fmt="gemma4")


def _decode_gemma4(body: str, index: int) -> list[ToolCall] | str:
    if not body.startswith("call:") or "{" not in body:
        return f"tool call {index} must be call:NAME{{...}}; write {_G_SHAPE}"
    name = body[len("call:"):body.find("{")].strip()
    if (problem := _name_ok(name, index, "call:calculator{}")) is not None:
        return problem
    try:
        arguments, end = _gemma_value(body, body.find("{"))
        if body[end:].strip():
            raise _Bad(f"unexpected {body[end:].strip()[:20]!r} after the arguments")
    except (_Bad, RecursionError) as e:
        why = str(e) if isinstance(e, _Bad) else "nested too deeply"
        return f"tool call {index} ({name}): bad arguments ({why}); write {_G_SHAPE}"
    return [ToolCall(name, arguments)]


def _gemma_value(s: str, i: int) -> tuple[Any, int]:
    """The value starting at ``s[i]`` and the index after it."""
    if s.startswith(G_QUOTE, i):
        end = s.find(G_QUOTE, i + len(G_QUOTE))
        if end == -1:
            raise _Bad(f"unclosed {G_QUOTE} string")
        return s[i + len(G_QUOTE):end], end + len(G_QUOTE)
    if s.startswith(("{", "["), i):
        is_map, items, close = s[i] == "{", [], "}" if s[i] == "{" else "]"
        i += 1
        while not s.startswith(close, i):
            if items:
                if not s.startswith(",", i):
                    raise _Bad(f"expected , or {close} at character {i}")
                i += 1
            if is_map:
                key, i = _gemma_value(s, i) if s.startswith(G_QUOTE, i) else _bare(s, i, key=True)
                if not s.startswith(":", i):
                    raise _Bad(f"expected : after key {key!r}")
                value, i = _gemma_value(s, i + 1)
                items.append((key, value))
            else:
                value, i = _gemma_value(s, i)
                items.append(value)
            if i >= len(s):
                raise _Bad(f"unclosed {'{' if is_map else '['}")
        return (dict(items) if is_map else items), i + 1
    return _bare(s, i)


def _bare(s: str, i: int, key: bool = False) -> tuple[Any, int]:
    word = _G_BARE.match(s, i).group()
    if not word.strip():
        raise _Bad(f"expected a value at character {i}")
    if key:
        return word.strip(), i + len(word)
    if word.strip() in _G_WORDS:
        return _G_WORDS[word.strip()], i + len(word)
    value, problem = _load_json(word)
    if problem is not None or not isinstance(value, (int, float)):
        raise _Bad(f"{word.strip()!r} is not a value; quote text as {G_QUOTE}text{G_QUOTE}")
    return value, i + len(word)


def _gemma_write(value: Any, top: bool = False) -> str:
    if isinstance(value, str):
        if G_QUOTE in value:
            raise ValueError(f"the string {value[:40]!r} holds {G_QUOTE}, which Gemma 4 cannot quote")
        return f"{G_QUOTE}{value}{G_QUOTE}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "None"
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0].lower())
        keys = [k if _G_KEY.fullmatch(k) else _gemma_write(k) for k, _ in items]
        return "{" + ",".join(f"{k}:{_gemma_write(v)}" for k, (_, v) in zip(keys, items)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_gemma_write(v) for v in value) + "]"
    return str(value)


@register_formatter("gemma4")
def _format_gemma4(call: ToolCall) -> str:
    """Raises ValueError for a string argument holding ``<|"|>``."""
    return f"{G_OPEN}call:{call.name}{_gemma_write(call.arguments)}{G_CLOSE}"


# ---- pythonic ------------------------------------------------------------------------------------

P_OPEN, P_CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"
_P_SHAPE = "<|tool_call_start|>[name(key='text', n=1)]<|tool_call_end|>"
_P_WORDS = {"true": True, "false": False, "null": None}


@register_parser("pythonic")
def parse_pythonic(text: str) -> ParseResult:
    """Parse LFM2 / LFM2.5 calls: a Python list of calls with keyword arguments.

    Format::

        <|tool_call_start|>[calculator(expression='2 + 3'), lookup(n=1)]<|tool_call_end|>

    Values are Python or JSON literals (``True`` and ``true``, ``None`` and ``null``). A block
    holds one or more calls; several blocks per text.

    Template: equal to lfm2_v2 (strings quoted with ``\\``, ``'``, newline and return escaped;
    lists and dicts as JSON). lfm2_2_5 writes strings unescaped and lists as Python, so it differs
    for strings holding a quote or newline, and for lists. Names and keys must be Python identifiers.
    """
    return _parse_blocks(text, P_OPEN, P_CLOSE, _P_SHAPE, _decode_pythonic, fmt="pythonic")


def _decode_pythonic(body: str, first: int) -> list[ToolCall] | str:
    try:
        tree = ast.parse(body.strip(), mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            raise _Bad("the block must hold a non-empty list [name(key=value), ...]")
        calls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                raise _Bad("each item must be a call name(key=value, ...) with keyword arguments only")
            calls.append(ToolCall(node.func.id, {kw.arg: _literal(kw.value) for kw in node.keywords}))
        return calls
    except (_Bad, SyntaxError, ValueError, RecursionError, MemoryError) as e:
        why = str(e) if isinstance(e, _Bad) else f"{type(e).__name__}: {getattr(e, 'msg', e)}"
        return f"tool call {first}: not a Python list of calls ({why}); write {_P_SHAPE}"


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and not isinstance(node.value, (bytes, complex)) and node.value is not ...:
        return node.value
    if isinstance(node, ast.Name) and node.id in _P_WORDS:
        return _P_WORDS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
        return {k.value: _literal(v) for k, v in zip(node.keys, node.values)}
    raise _Bad(f"{ast.unparse(node)[:30]!r} is not a literal value")


def _python_write(value: Any) -> str:
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
        return "'" + escaped.replace("\0", "\\x00") + "'"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


@register_formatter("pythonic")
def _format_pythonic(call: ToolCall) -> str:
    """Raises ValueError for a name or key that is not a Python identifier."""
    for word in (call.name, *call.arguments):
        if not word.isidentifier() or keyword.iskeyword(word):
            raise ValueError(f"{word!r} is not a Python identifier, so the pythonic format cannot write it")
    args = ", ".join(f"{k}={_python_write(v)}" for k, v in call.arguments.items())
    return f"{P_OPEN}[{call.name}({args})]{P_CLOSE}"

"""The OpenAI chat surface of ``turnrl.policies.server``: request bodies of tool-using clients,
their rendering through the chat template, reply text and tool calls, logprobs and the
server-sent event stream (``stream: true``).

What each part promises (the server's module docstring is the user-facing reference):

* ``StrictBody`` and its helpers (``must``, ``bad``, ``show``, ``check_text``, ``check_strings``):
  the request-body base both endpoints share: strict types, ``null`` as absent, unknown fields
  ignored, a 400 naming the field's path for anything else; text must be encodable as UTF-8
  (no lone surrogates).
* ``ChatMessage`` / ``ToolParam``: messages as the official ``openai`` client sends them
  (``content`` a string, a list of text parts or null; assistant ``tool_calls`` whose
  ``arguments`` are JSON text; ``tool`` messages with ``tool_call_id``; ``name``) and function
  tools. ``template_messages`` / ``template_tools`` turn them into what Hugging Face chat
  templates read, as vLLM does: text parts joined by newlines, a null content as ``""``,
  ``arguments`` parsed into dicts (malformed JSON is a 400 naming
  ``messages[i].tool_calls[j].function.arguments``), an empty ``tool_calls`` dropped.
* ``tool_parser_for``: the tool-call parser of a tokenizer's chat template (the chat format
  ``turnrl.chat.formats.detect`` finds, as the trainer's ``agent.tool_parser=auto``), or a
  registered parser by name.
* ``ChoiceText``: one choice's text as its tokens arrive: incremental decoding, stop strings
  (the turn ends at the first one, which the text leaves out) and the part of it that is safe
  to stream (what can no longer turn into a stop string or a tool call). ``final_text`` is the
  text a whole reply holds; ``ChoiceText`` streams a prefix of it.
* ``reply_message``: a reply's ``message`` (``content`` and ``tool_calls``) from its text.
* ``ChatStream`` / ``CompletionStream``: the ``chat.completion.chunk`` / ``text_completion``
  chunks of a streamed reply, and ``sse`` / ``SSE_DONE`` their wire form.
* ``EventChannel``: carries a streamed request's events from the sampling thread to the
  event loop that writes its reply.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WrapValidator, field_validator, model_validator
from pydantic_core import PydanticCustomError

from turnrl.chat.formats import detect
from turnrl.policies.sampling import Generation
from turnrl.serving import APIError
from turnrl.tools.parsers import PARSERS, get_parser

__all__ = ["CALL_MARKERS", "ChatMessage", "ChatStream", "ChoiceText", "CompletionStream", "EventChannel",
           "FunctionCallParam", "FunctionDefinition", "MAX_STOP", "SSE_DONE", "StopStrings", "StreamOptions",
           "StrictBody", "TokenStrings", "ToolCallParam", "ToolParam", "bad", "check_strings", "check_text",
           "final_text", "must", "reply_message", "show", "sse", "template_messages", "template_tools",
           "tool_parser_for", "usage"]

_SHOWN = 100
"""Characters of a refused value quoted in an error message."""
MAX_STOP = 4
"""Most stop strings a request may send (OpenAI's bound)."""


# ------------------------------------------------------------ body basics
def bad(message: str, param: str | None = None) -> APIError:
    """A 400 saying ``message`` about the field ``param``."""
    return APIError(400, message, param=param)


def show(value: Any) -> str:
    """``repr(value)``, cut to ``_SHOWN`` characters (a refused value may be megabytes)."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def check_text(text: str, where: str, param: str) -> None:
    """Refuse text without a UTF-8 encoding (JSON's ``\\ud800`` escapes decode to lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad(f"{where} holds {show(text[e.start:e.end])} at character {e.start}, a lone UTF-16 surrogate "
                  "that no text can hold; send valid Unicode", param) from None


def check_strings(value: Any, path: str) -> None:
    """``check_text`` on every string (keys included) of a decoded JSON ``value``, each named by
    its path under ``path`` (``tools[0].function.parameters.properties.x``)."""
    if isinstance(value, str):
        check_text(value, path, path)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(str(key), f"a key of {path}", path)
            check_strings(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_strings(item, f"{path}[{i}]")


def must(message: str, ok: Callable[[Any], bool] = lambda value: True) -> WrapValidator:
    """A field's check: its type (pydantic's), then ``ok``; either failing is one error, ``message``."""
    def check(value: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            value = handler(value)
        except ValidationError:
            raise PydanticCustomError("invalid_value", message) from None
        if not ok(value):
            raise PydanticCustomError("invalid_value", message)
        return value

    return WrapValidator(check)


class StrictBody(BaseModel):
    """What every request body (and object in one) shares: strict types, ``null`` as absent,
    unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


# ----------------------------------------------------------- chat requests
_Name = Annotated[str, must("must be a non-empty string", bool)]
_PARTS = 'a string, or a list of text parts [{"type": "text", "text": "..."}]'


class FunctionCallParam(StrictBody):
    """``tool_calls[j].function`` of an assistant message: the called tool's ``name`` and its
    ``arguments``, JSON text of an object (a JSON object itself is taken too; absent: ``{}``)."""

    name: _Name
    arguments: Annotated[str | dict[str, Any], must("must be JSON text of an object, e.g. '{\"x\": 1}'")] = "{}"


class ToolCallParam(StrictBody):
    """One ``tool_calls`` entry of an assistant message."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallParam


class ChatMessage(StrictBody):
    """One message of ``messages``; its other keys are ignored.

    ``content`` is a string, a list of text parts (joined by newlines) or, in an assistant
    message, null or absent (rendered as ``""``). ``tool_calls`` only in assistant messages;
    ``tool_call_id`` and ``name`` pass to the template; ``reasoning_content`` (or ``reasoning``)
    of an assistant message too, for templates that render thinking.
    """

    role: str
    content: Any = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None

    @field_validator("content")
    @classmethod
    def _text(cls, value: Any) -> str:
        """The content as one string (text parts joined by newlines, as vLLM joins them)."""
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise PydanticCustomError("invalid_value", f"must be {_PARTS} (or null in an assistant message)")
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else None
                why = (f"a part of type {show(kind)}: only text parts are served (this server has no images or "
                       "audio)" if isinstance(kind, str) and kind != "text" else f"part {j} is {show(part)}")
                raise PydanticCustomError("invalid_value", f"must be {_PARTS}; {why}")
            texts.append(part["text"])
        return "\n".join(texts)


class FunctionDefinition(StrictBody):
    """``tools[i].function``: the function's ``name``, ``description`` and JSON Schema ``parameters``."""

    name: _Name
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolParam(StrictBody):
    """One entry of ``tools``: ``{"type": "function", "function": {...}}``."""

    type: Literal["function"]
    function: FunctionDefinition


class StreamOptions(StrictBody):
    """``stream_options``: ``include_usage`` adds a last chunk holding the reply's ``usage``."""

    include_usage: bool = False


def template_messages(messages: Sequence[ChatMessage]) -> list[dict]:
    """``messages`` as the chat template reads them (see the module docstring).

    Raises:
        APIError: 400 for text with lone surrogates, ``tool_calls`` outside an assistant message,
            a missing content, or ``arguments`` that are not JSON text of an object, naming the
            field (``messages[i].tool_calls[j].function.arguments``).
    """
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        check_text(m.role, f"{where}.role", where + ".role")
        if m.content is None and m.role != "assistant":
            raise bad(f"{where}.content is missing: a {m.role!r} message needs content ({_PARTS})",
                      where + ".content")
        message: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        for key in ("name", "tool_call_id", "reasoning_content", "reasoning"):
            if getattr(m, key) is not None:
                message[key] = getattr(m, key)
        if m.tool_calls:
            if m.role != "assistant":
                raise bad(f"{where}.tool_calls: only assistant messages carry tool calls (this one's role is "
                          f"{m.role!r})", where + ".tool_calls")
            message["tool_calls"] = [_template_call(call, f"{where}.tool_calls[{j}]")
                                     for j, call in enumerate(m.tool_calls)]
        if m.reasoning is not None and m.reasoning_content is None:
            message["reasoning_content"] = m.reasoning
        check_strings(message, where)
        out.append(message)
    return out


def _template_call(call: ToolCallParam, where: str) -> dict:
    arguments = call.function.arguments
    if isinstance(arguments, str):
        param = f"{where}.function.arguments"
        check_text(arguments, param, param)
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            raise bad(f"{param} is not JSON ({type(e).__name__}: {e}): send the arguments object as JSON text, e.g. "
                      f"'{{\"x\": 1}}', got {show(call.function.arguments)}", param) from None
        if not isinstance(arguments, dict):
            raise bad(f"{param} must be JSON text of an object (the tool's arguments by name), got "
                      f"{show(call.function.arguments)}", param)
    entry: dict[str, Any] = {"type": "function", "function": {"name": call.function.name, "arguments": arguments}}
    if call.id is not None:
        entry["id"] = call.id
    return entry


def template_tools(tools: Sequence[ToolParam] | None) -> list[dict] | None:
    """``tools`` as the chat template reads them (``{"type": "function", "function": {name,
    description, parameters}}``, absent fields left out), or None for none.

    Raises:
        APIError: 400 for text with lone surrogates, naming its path.
    """
    if not tools:
        return None
    out = [{"type": "function", "function": tool.function.model_dump(exclude_none=True)} for tool in tools]
    for i, tool in enumerate(out):
        check_strings(tool, f"tools[{i}]")
    return out


# ------------------------------------------------------------- tool calls
CALL_MARKERS: dict[str, tuple[str, ...]] = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "qwen3_coder": ("<tool_call>", "</tool_call>"),
    "glm4": ("<tool_call>", "</tool_call>"),
    "gemma4": ("<|tool_call>", "<tool_call|>"),
    "pythonic": ("<|tool_call_start|>", "<|tool_call_end|>"),
    "deepseek_v3": ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
    "xml": ("<tool>", "</tool>", "<args>", "</args>"),
    "json_fenced": ("```",),
}
"""Parser -> the markers its calls start (or end) with: a streamed reply's text is sent up to
the first of them, and the rest once the reply is complete. A parser not listed here (its
calls have no fixed marker) has the whole text of a reply with tools sent at its end."""


def tool_parser_for(tokenizer, name: str = "auto") -> str | None:
    """The tool-call parser of replies: ``name`` when it is not ``"auto"``, else the parser of
    the chat format ``turnrl.chat.formats.detect`` finds in the tokenizer's chat template (as
    the trainer's ``agent.tool_parser=auto``); None when it finds none.

    Raises:
        ValueError: ``name`` is neither ``"auto"`` nor a registered parser (listing them).
    """
    if name != "auto":
        if name not in PARSERS.names():
            raise ValueError(f"unknown tool parser {name!r}; the parsers are: auto, {', '.join(PARSERS.names())}")
        return name
    try:
        return detect(getattr(tokenizer, "chat_template", None)).tool_parser
    except ValueError:  # no template, or one no chat format knows
        return None


def reply_message(text: str, parser: str | None, parallel: bool = True) -> tuple[str | None, list[dict]]:
    """``(content, tool_calls)`` of a reply whose text is ``text``.

    With ``parser`` (a request with tools), calls that ``parser`` reads well-formed become
    ``tool_calls`` (``{"id": "call_...", "type": "function", "function": {"name", "arguments":
    JSON text}}``; only the first unless ``parallel``) and ``content`` is the parser's text
    outside them (None when empty). Otherwise (no parser, no calls, or malformed markup)
    ``content`` is ``text`` as it is and there are no calls.
    """
    if parser is None:
        return text, []
    parse = get_parser(parser)(text)
    if parse.status != "ok" or not parse.calls:
        return text, []
    calls = [{"id": f"call_{secrets.token_hex(12)}", "type": "function",
              "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
             for call in (parse.calls if parallel else parse.calls[:1])]
    return parse.content or None, calls


# ------------------------------------------------------------- reply text
def final_text(tokenizer, ids: Sequence[int], skip_special: bool, stop: Sequence[str]) -> tuple[str, str | None]:
    """``(text, stop string)`` of a reply's ids (its end-of-turn id left out): their decoding,
    cut before the first stop string it holds (and that string; None when none)."""
    text = tokenizer.decode(list(ids), skip_special_tokens=skip_special)
    return _cut(text, stop, 0)


def _cut(text: str, stop: Sequence[str], start: int) -> tuple[str, str | None]:
    """``text`` cut before the earliest stop string found at or after character ``start``."""
    best, which = -1, None
    for s in stop:
        at = text.find(s, max(0, start - len(s) + 1))
        if at != -1 and (best == -1 or at < best):
            best, which = at, s
    return (text, None) if which is None else (text[:best], which)


class ChoiceText:
    """One choice's text as its tokens arrive (``add``), and the part of it that is safe to
    stream (``take``): a prefix of what ``final_text`` and ``reply_message`` make of the
    complete reply.

    Decoding is incremental, over a window of the last tokens (vLLM's prefix and read offsets:
    text is added only once it ends in a whole character, and a tokenizer that drops a leading
    space at the start of a decode drops it the same way). Held back from ``take``:

    * with ``stop`` strings, the last ``len(longest) - 1`` characters (the start of one maybe);
    * with ``markers`` (a reply that may hold tool calls: ``CALL_MARKERS`` of its parser), all
      from the first marker on, a tail that may begin one, and trailing whitespace (the
      parser's content is stripped); a text that starts with whitespace, or ``markers=()`` (a
      parser without fixed markers), is held whole until the reply ends.

    Args:
        tokenizer: the served tokenizer.
        skip_special: decode without special tokens.
        end_ids: end-of-turn ids, never part of the text.
        stop: stop strings (the turn ends at the first, which the text leaves out).
        markers: see above; None for a reply without tool calls.
    """

    def __init__(self, tokenizer, *, skip_special: bool, end_ids: Collection[int], stop: Sequence[str] = (),
                 markers: tuple[str, ...] | None = None) -> None:
        self.tokenizer, self.skip_special, self.end_ids = tokenizer, skip_special, frozenset(end_ids)
        self.stop, self.markers = tuple(stop), markers
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0  # characters of text handed out by take
        self.stopped = False
        self._prefix = self._read = 0
        self._stop_hold = max((len(s) for s in self.stop), default=1) - 1
        self._marker_at: int | None = None
        self._hold_all = markers == ()

    def add(self, token_id: int) -> bool:
        """Take the next sampled token; True when the text now holds a stop string (the turn
        ends there: ``text`` is cut before it)."""
        if self.stopped or token_id in self.end_ids:
            return self.stopped
        self.ids.append(token_id)
        new = self._decode()
        if not new:
            return False
        before = len(self.text)
        self.text += new
        if self.stop:
            self.text, hit = _cut(self.text, self.stop, before)
            self.stopped = hit is not None
        if self.markers and self._marker_at is None:
            longest = max(len(m) for m in self.markers)
            found = [at for m in self.markers if (at := self.text.find(m, max(0, before - longest + 1))) != -1]
            self._marker_at = min(found) if found else None
        return self.stopped

    def _decode(self) -> str:
        ids, skip = self.ids, self.skip_special
        done = self.tokenizer.decode(ids[self._prefix:self._read], skip_special_tokens=skip)
        full = self.tokenizer.decode(ids[self._prefix:], skip_special_tokens=skip)
        if len(full) > len(done) and not full.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(ids)
            return full[len(done):]
        return ""

    def take(self) -> str:
        """The text not handed out yet that is safe to stream now (see the class docstring)."""
        if self._hold_all:
            return ""
        text = self.text
        end = len(text)
        if self._stop_hold and not self.stopped:
            end -= self._stop_hold
        if self.markers is not None:
            if self._marker_at is not None:
                end = min(end, self._marker_at)
            else:
                for m in self.markers:  # a tail that may be the start of a marker
                    for k in range(min(len(m) - 1, len(text)), 0, -1):
                        if text.endswith(m[:k]):
                            end = min(end, len(text) - k)
                            break
            if self.sent == 0:
                start = len(text) - len(text.lstrip())
                if start == len(text):
                    return ""  # whitespace only so far
                if start > 0:  # the parser's content would strip it, the whole text keep it: wait for the end
                    self._hold_all = True
                    return ""
            end = len(text[:end].rstrip())
        if end <= self.sent:
            return ""
        out = text[self.sent:end]
        self.sent = end
        return out

    def rest(self, final: str | None) -> str:
        """What follows the text handed out so far in ``final`` (a reply's content once it is
        complete), marking all of it handed out."""
        final = final or ""
        sent = self.text[:self.sent]
        self.sent = len(self.text)
        self._hold_all = True
        if final.startswith(sent):
            return final[len(sent):]
        common = next((i for i, (a, b) in enumerate(zip(sent, final)) if a != b), min(len(sent), len(final)))
        return final[common:]  # the decoding of the whole differs from the streamed pieces': the rest of it


class TokenStrings:
    """Token texts for logprobs: ``text(id)`` is ``decode([id])`` with special tokens (cached);
    ``bytes(text)`` its UTF-8 bytes (as vLLM, a token that is part of a character reads as
    U+FFFD)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        """The text of one token (special tokens as they are written)."""
        found = self._cache.get(token_id)
        if found is None:
            found = self._cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return found

    def entry(self, token_id: int, logprob: float) -> dict:
        """``{"token", "logprob", "bytes"}`` of one token."""
        text = self.text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", errors="replace"))}

    def chat_logprobs(self, token_ids: Sequence[int], logprobs: Sequence[float],
                      tops: Sequence[Sequence[tuple[int, float]]] | None, k: int) -> dict:
        """A chat choice's ``logprobs``: ``{"content": [{"token", "logprob", "bytes",
        "top_logprobs": [up to k of them, most likely first]}, ...]}``, one entry per sampled
        token (the end-of-turn token included, as vLLM)."""
        content = []
        for t, (token_id, logprob) in enumerate(zip(token_ids, logprobs)):
            entry = self.entry(token_id, logprob)
            entry["top_logprobs"] = [self.entry(i, v) for i, v in tops[t][:k]] if tops is not None and k else []
            content.append(entry)
        return {"content": content}


# -------------------------------------------------------------- streaming
SSE_DONE = b"data: [DONE]\n\n"
"""The event that ends a stream."""


def sse(payload: dict) -> bytes:
    """One server-sent event holding ``payload`` as JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class EventChannel:
    """A streamed request's events, from the sampling thread (``post``, thread-safe) to the
    event loop that writes its reply (``get``). ``closed`` is set when the reader stops (the
    client went away): the sampling side then ends the request's rows."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.closed = False

    def post(self, event: tuple) -> None:
        """Queue ``event`` for the reader (dropped once the loop is closed: the server stopped)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:
            pass

    async def get(self) -> tuple:
        """The next event."""
        return await self.queue.get()


def usage(prompt_tokens: int, generations: Sequence[Generation | None]) -> dict:
    """``usage`` as vLLM counts it: the prompt's tokens once per prompt, every sampled token
    (end-of-turn ids included)."""
    completion = sum(len(g.token_ids) for g in generations if g is not None)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


class _Stream:
    """What both streams share: the id, creation time and model of every chunk, and usage."""

    kind = ""

    def __init__(self, prefix: str, model: str, n: int, prompt_tokens: int, include_usage: bool) -> None:
        self.id, self.created, self.model = f"{prefix}-{secrets.token_hex(12)}", int(time.time()), model
        self.n, self.prompt_tokens, self.include_usage = n, prompt_tokens, include_usage
        self.generations: list[Generation | None] = [None] * n

    def chunk(self, choices: list[dict], **fields: Any) -> bytes:
        """One chunk of ``choices`` (and any top-level ``fields``)."""
        body = {"id": self.id, "object": self.kind, "created": self.created, "model": self.model, "choices": choices,
                **fields}
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    def start(self) -> Iterator[bytes]:
        """The chunks before any token's (none here)."""
        return iter(())

    def end(self) -> Iterator[bytes]:
        """The usage chunk (with ``include_usage``) and ``[DONE]``."""
        if self.include_usage:
            yield sse({"id": self.id, "object": self.kind, "created": self.created, "model": self.model,
                       "choices": [], "usage": usage(self.prompt_tokens, self.generations)})
        yield SSE_DONE


class ChatStream(_Stream):
    """The ``chat.completion.chunk`` events of one streamed chat reply of ``n`` choices.

    Per choice: a first chunk with ``delta: {"role": "assistant", "content": ""}`` (and, with
    ``prompt_ids``, the prompt's ids as ``prompt_token_ids``); a chunk per sampled token with
    the text it makes safe to send (``ChoiceText.take``) and, with ``logprobs``, that token's
    entry (with ``prompt_ids``, its id in the choice's ``token_ids``; chunks with nothing to say
    are left out); once the choice is complete, the rest of its content, one chunk per tool call
    (``delta.tool_calls`` with ``index``, ``id``, ``type`` and the whole ``function``: calls are
    sent once the reply is complete, not piece by piece), then ``finish_reason``
    (``"tool_calls"`` when it holds calls). After every choice: the usage chunk
    (``include_usage``) and ``[DONE]``.
    """

    kind = "chat.completion.chunk"

    def __init__(self, *, model: str, n: int, prompt_tokens: int, include_usage: bool, tokens: TokenStrings,
                 texts: list[ChoiceText], parser: str | None, parallel: bool, logprobs: bool, top_logprobs: int,
                 skip_special: bool, prompt_ids: list[int] | None = None) -> None:
        super().__init__("chatcmpl", model, n, prompt_tokens, include_usage)
        self.tokens, self.texts, self.parser, self.parallel = tokens, texts, parser, parallel
        self.logprobs, self.top_logprobs, self.skip_special = logprobs, top_logprobs, skip_special
        self.prompt_ids = prompt_ids

    def start(self) -> Iterator[bytes]:
        """Each choice's first chunk."""
        for i in range(self.n):
            yield self.chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                               "finish_reason": None}],
                             **({} if self.prompt_ids is None else {"prompt_token_ids": self.prompt_ids}))

    def token(self, i: int, token_id: int, logprob: float, top: list | None, delta: str) -> Iterator[bytes]:
        """The chunk of choice ``i``'s next token (``delta``: its safe text), if it has anything."""
        if not delta and not self.logprobs and self.prompt_ids is None:
            return
        choice: dict[str, Any] = {"index": i, "delta": {"content": delta}, "logprobs": None, "finish_reason": None}
        if self.logprobs:
            choice["logprobs"] = self.tokens.chat_logprobs([token_id], [logprob], None if top is None else [top],
                                                           self.top_logprobs)
        if self.prompt_ids is not None:
            choice["token_ids"] = [token_id]
        yield self.chunk([choice])

    def done(self, i: int, gen: Generation, body: Sequence[int]) -> Iterator[bytes]:
        """Choice ``i``'s last chunks, once its generation ``gen`` (``body``: its ids without the
        end-of-turn id) is complete."""
        self.generations[i] = gen
        text = self.texts[i]
        full, stop_reason = final_text(self.tokens.tokenizer, body, self.skip_special, text.stop)
        content, calls = reply_message(full, self.parser, self.parallel)
        rest = text.rest(content)
        if rest:
            yield self.chunk([{"index": i, "delta": {"content": rest}, "logprobs": None, "finish_reason": None}])
        for k, call in enumerate(calls):
            yield self.chunk([{"index": i, "delta": {"tool_calls": [{"index": k, **call}]}, "logprobs": None,
                               "finish_reason": None}])
        yield self.chunk([{"index": i, "delta": {}, "logprobs": None,
                           "finish_reason": "tool_calls" if calls else gen.finish_reason,
                           "stop_reason": stop_reason}])


class CompletionStream(_Stream):
    """The ``text_completion`` chunks of one streamed ``/v1/completions`` reply: per sampled
    token, a chunk with the text it makes safe to send and, as asked, its ``logprobs``
    (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset`` of that token) and
    ``token_ids`` (with ``prompt_token_ids`` in a choice's first chunk); once a choice is
    complete, the rest of its text and its ``finish_reason``; then usage and ``[DONE]``."""

    kind = "text_completion"

    def __init__(self, *, model: str, n: int, prompt_tokens: int, include_usage: bool, tokens: TokenStrings,
                 texts: list[ChoiceText], logprobs: bool, as_ids: bool, prompts: list[list[int]] | None,
                 skip_special: bool, stop_reason_ids: bool) -> None:
        super().__init__("cmpl", model, n, prompt_tokens, include_usage)
        self.tokens, self.texts, self.logprobs, self.as_ids = tokens, texts, logprobs, as_ids
        self.prompts, self.skip_special, self.stop_reason_ids = prompts, skip_special, stop_reason_ids
        self.offsets = [0] * n
        self.first = [True] * n

    def _choice(self, i: int, text: str, **fields: Any) -> dict:
        choice = {"index": i, "text": text, "logprobs": None, "finish_reason": None, "stop_reason": None, **fields}
        if self.prompts is not None:
            choice.setdefault("token_ids", [])
            if self.first[i]:
                choice["prompt_token_ids"] = self.prompts[i]
        self.first[i] = False
        return choice

    def token(self, i: int, token_id: int, logprob: float, top: list | None, delta: str) -> Iterator[bytes]:
        """The chunk of choice ``i``'s next token, if it has anything to say."""
        if not delta and not self.logprobs and self.prompts is None:
            return
        fields: dict[str, Any] = {}
        if self.logprobs:
            token = f"token_id:{token_id}" if self.as_ids else self.tokens.text(token_id)
            fields["logprobs"] = {"tokens": [token], "token_logprobs": [logprob], "top_logprobs": [{token: logprob}],
                                  "text_offset": [self.offsets[i]]}
            self.offsets[i] += len(self.tokens.text(token_id))
        if self.prompts is not None:
            fields["token_ids"] = [token_id]
        yield self.chunk([self._choice(i, delta, **fields)])

    def done(self, i: int, gen: Generation, body: Sequence[int]) -> Iterator[bytes]:
        """Choice ``i``'s last chunk, once its generation ``gen`` is complete."""
        self.generations[i] = gen
        text = self.texts[i]
        full, stop = final_text(self.tokens.tokenizer, body, self.skip_special, text.stop)
        stop_reason = stop if stop is not None else (
            gen.token_ids[-1] if gen.finish_reason == "stop" and self.stop_reason_ids else None)
        yield self.chunk([self._choice(i, text.rest(full), finish_reason=gen.finish_reason, stop_reason=stop_reason)])


# ------------------------------------------------------------------ limits
StopStrings = Annotated[str | Annotated[list[str], Field(max_length=MAX_STOP)], must(
    f"must be a string or a list of at most {MAX_STOP} non-empty strings (the reply ends before the first one "
    "it holds)", lambda s: isinstance(s, str) or all(s))]
"""The ``stop`` field: a string or up to ``MAX_STOP`` non-empty strings (``""`` or ``[]``: none)."""

r"""The chat renderer: turns a growing conversation into token ids without ever re-tokenizing
what the model sampled, with any model family's chat template.

Contract, per *segment*: the segment's ids are the sampled ids verbatim plus the tokenization of
the template text between sampled turns (role headers, end markers, observations: the string
delta of the full render), and the decoded segment is a prefix of (at the end of the segment,
equal to) the template's render of the conversation. Sampled ids are never re-tokenized. Where
the tokenizer normalizes text (Qwen's applies Unicode NFC), ``decode(segment ids)`` is the
normalized text: an observation in another normal form (e.g. NFD accents) decodes to its NFC
form, while the ids stay exactly those the sampler saw.

Templates that rewrite history (Qwen3 drops the think blocks of turns before the last user
message, Gemma trims content, gpt-oss renders a sampled ``<|return|>`` as ``<|end|>``, an env
compacts its context) make the new render stop extending the tokenized text. The conversation
then continues in a new segment whose prompt is the template's full render, tokenized: every
sampled token stays under exactly the context the sampler saw, and the learner scores each
segment as its own sequence (``turnrl.algorithms.segments``). A template that preserves its
prefix keeps one segment, so the cost stays linear in the episode's length. Qwen3, Qwen3.5 and
Qwen3.6 keep one segment only while contents carry no trailing whitespace: their templates trim
it, so an answer ending in ``"\n\n"`` or a thought ending in ``"\n"`` starts a new segment
(correct, one more sequence for the learner to score).

Tools reach the template natively (``apply_chat_template(..., tools=schemas)``) when the
family's template renders them (``ChatFormat.native_tools``); otherwise the renderer writes
``turnrl.tools.tools_prompt`` into the system message. Tool results are given in the role the
family expects (``ChatFormat.tool_role``), and the history is written as the template needs it
(``ChatFormat.history`` / ``merge_roles``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from turnrl.chat.formats import ChatFormat, resolve
from turnrl.tools.parsers import get_parser
from turnrl.tools.prompt import tools_prompt


class TemplateMismatchError(RuntimeError):
    """The chat template rewrote text that was already rendered, and segments are off."""


@dataclass
class Conversation:
    """One episode's conversation as messages, text and exact token ids.

    Attributes:
        messages: chat messages so far (``{"role", "content"}``; a sampled turn is an
            ``assistant`` message holding its decoded text, which the renderer reads with the
            family's parsers; an assistant message with a ``tool_calls`` key, maybe ``[]``, is
            one an agent program wrote, given to the template as written); after a compaction,
            the messages the current segment was rendered from.
        token_ids: ``[T]`` ids of every segment, concatenated; sampled assistant ids appear
            exactly as sampled.
        loss_mask: ``[T]`` 1 on sampled ids, 0 on template/observation ids.
        logprobs: ``[T]`` the sampler's logprob of each sampled id, 0.0 elsewhere.
        text: ``decode`` of the current segment's ids, kept incrementally.
        turn_spans: ``(start, end)`` token index span of each assistant turn's sampled ids.
        segment_starts: index in ``token_ids`` where each segment begins (``[0]`` at first).
        tools: the tools' JSON schemas given to the template (``[]`` for none).
    """

    messages: list[dict] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    segment_starts: list[int] = field(default_factory=lambda: [0])
    tools: list[dict] = field(default_factory=list)

    @property
    def prompt_ids(self) -> list[int]:
        """The current segment's ids: what the sampler is given for the next turn."""
        return self.token_ids[self.segment_starts[-1]:]


class ChatRenderer:
    """Renders observations with the tokenizer's chat template and appends sampled ids.

    Args:
        tokenizer: a HF tokenizer with a ``chat_template``.
        chat_format: a ``ChatFormat``, a registered format name, or ``"auto"`` (detected from
            the template's text).
        template_kwargs: extra variables for the template (e.g. ``{"enable_thinking": False}``,
            ``{"preserve_thinking": True}``).
        on_rewrite: ``"segment"`` (start a new segment when the template rewrites history) or
            ``"error"`` (raise ``TemplateMismatchError``; for checking that a setup keeps one).
    """

    def __init__(self, tokenizer, chat_format: ChatFormat | str = "auto",
                 template_kwargs: Mapping | None = None, on_rewrite: Literal["segment", "error"] = "segment"):
        if tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat_template; set one before rendering")
        if on_rewrite not in ("segment", "error"):
            raise ValueError(f"on_rewrite must be 'segment' or 'error', got {on_rewrite!r}")
        self.tokenizer = tokenizer
        self.format = chat_format if isinstance(chat_format, ChatFormat) else resolve(chat_format, tokenizer.chat_template)
        self.template_kwargs = dict(template_kwargs or {})
        self.on_rewrite = on_rewrite
        # a fast tokenizer's Rust backend, encoded directly where that is what its __call__ does
        backend = getattr(tokenizer, "_tokenizer", None)
        self._backend = backend if type(backend).__module__.startswith("tokenizers") else None
        vocab = tokenizer.get_vocab()
        self.end_ids = frozenset({vocab[t] for t in self.format.end_of_turn if t in vocab}
                                 | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()))

    # ------------------------------------------------------------- rendering
    def render(self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        """The template's text for ``messages`` (as the conversation holds them) and ``tools``."""
        kwargs = dict(self.template_kwargs)
        shaped = self.template_messages(messages, tools or [])
        if tools and self.format.native_tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(shaped, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  **kwargs)

    def template_messages(self, messages: list[dict], tools: list[dict]) -> list[dict]:
        """``messages`` in the shape the family's template accepts (see ``ChatFormat``)."""
        fmt = self.format
        out: list[dict] = []
        for message in messages:
            role, content = message["role"], message.get("content", "")
            if role == "assistant":
                out.append(_as_written(message) if "tool_calls" in message else self._history_message(content))
                continue
            if role == "tool" and fmt.tool_role != "tool":
                out.append({"role": fmt.tool_role, "content": f"<tool_response>\n{content}\n</tool_response>"})
                continue
            out.append({"role": role, "content": content})
        if tools and not fmt.native_tools:
            out = _with_tools_prompt(out, tools, fmt.tool_parser)
        if fmt.merge_roles:
            out = _merge_roles(out)
        return out

    def _history_message(self, text: str) -> dict:
        """A sampled turn as a history message (``ChatFormat.history``)."""
        if self.format.history == "raw":
            return {"role": "assistant", "content": text}
        parse = get_parser(self.format.tool_parser)(text)
        message: dict = {"role": "assistant", "content": parse.content}
        if self.format.thinking is not None:  # the thought is read off the raw text (a parser may drop it)
            open_tag, close_tag = self.format.thinking
            if open_tag in text:
                thought = text.split(open_tag, 1)[1].split(close_tag, 1)[0]
                message["thinking"] = message["reasoning_content"] = thought.strip()
                message["content"] = _without_thought(parse.content, open_tag, close_tag)
        if parse.calls:
            message["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in parse.calls]
        return message

    def _opener(self, prompt_text: str) -> str:
        """The thought opener the generation prompt wrote inside the assistant turn (e.g. a
        prompt ending ``<think>\n``): the sampled text continues it, so its history message
        starts with it. Empty when the prompt opened none."""
        if self.format.thinking is None:
            return ""
        open_tag, close_tag = self.format.thinking
        at = prompt_text.rfind(open_tag, max(0, len(prompt_text) - 64))
        if at < 0:
            return ""
        rest = prompt_text[at + len(open_tag):]
        return prompt_text[at:] if not rest.strip() or rest.strip() == close_tag else ""

    def scripted_turn(self, conv: Conversation, answer: str) -> str:
        """The text a scripted player writes for the next turn of ``conv`` to answer ``answer``:
        ``answer`` itself, or, where the generation prompt opened a thought (a Qwen3.5 prompt ends
        ``<think>\n``), the thought closed empty first (``"\n</think>\n\n" + answer``, the
        template's own render of an empty thought), so the env, which reads what follows the
        close tag, gets the answer and a model warm-started on it learns to close its thought."""
        opener = self._opener(conv.text)
        if not opener:
            return answer
        close_tag = self.format.thinking[1]
        return f"\n{close_tag}\n\n{answer}"

    def encode(self, text: str) -> list[int]:
        """Token ids of template text (no BOS/EOS added; special tokens in the text are kept).

        A fast tokenizer's ``__call__`` ends in its Rust backend's ``encode_batch`` after
        turning truncation and padding off and setting ``encode_special_tokens`` to its
        ``split_special_tokens``; with the backend already in that state the ids are the
        backend's ``encode``, without the ~40 µs of Python around it (68 against 27 µs for an
        observation; one a turn per episode)."""
        backend = self._backend
        if (backend is not None and backend.truncation is None and backend.padding is None
                and backend.encode_special_tokens == bool(getattr(self.tokenizer, "split_special_tokens", False))):
            return backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    # ---------------------------------------------------------- conversation
    def start(self, messages: list[dict], tools: list[dict] | None = None) -> Conversation:
        """A conversation holding the first observation, ready for the assistant's turn.

        Args:
            messages: the opening messages.
            tools: the env's tools as JSON schemas (``info["tools"]`` of its reset).
        """
        conv = Conversation(tools=[dict(t) for t in tools or []])
        self.add_observation(conv, messages, add_generation_prompt=True)
        return conv

    def add_sampled(self, conv: Conversation, ids: list[int], logprobs: list[float]) -> str:
        """Append one assistant turn's sampled ids verbatim; return the env's action.

        The turn's history message holds the decoded text without a trailing end-of-turn token
        (after the thought opener its prompt wrote, if any). The action is that text without
        its thought for a family whose turns begin with one (``ChatFormat.thinking`` with raw
        history: what follows the thought's close tag; nothing of an unclosed thought);
        structured families' parsers read thoughts themselves and get the whole text.
        """
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled ids but {len(logprobs)} logprobs")
        opener = self._opener(conv.text)
        start = len(conv.token_ids)
        conv.token_ids.extend(ids)
        conv.loss_mask.extend([1] * len(ids))
        conv.logprobs.extend(float(lp) for lp in logprobs)
        conv.turn_spans.append((start, start + len(ids)))
        conv.text += self.tokenizer.decode(ids, skip_special_tokens=False)
        body = ids[:-1] if ids and ids[-1] in self.end_ids else ids
        content = opener + self.tokenizer.decode(body, skip_special_tokens=False)
        conv.messages.append({"role": "assistant", "content": content})
        if self.format.thinking is None or self.format.history != "raw":
            return content
        return _answer(content, *self.format.thinking)

    def add_observation(self, conv: Conversation, messages: list[dict], add_generation_prompt: bool) -> None:
        """Append observation messages (and the next generation prompt) as template ids.

        When the template's render no longer extends the current segment, a new segment starts
        (``on_rewrite="segment"``) holding the whole render. Call with ``messages=[]`` and
        ``add_generation_prompt=False`` to close the last assistant turn at the end of an
        episode: a template that rewrites the closed turn then adds nothing (no turn follows).
        """
        conv.messages.extend(dict(m) for m in messages)
        full = self.render(conv.messages, add_generation_prompt=add_generation_prompt, tools=conv.tools)
        if full.startswith(conv.text):
            self._append_template(conv, self.encode(full[len(conv.text):]))
            conv.text = full
            return
        if not add_generation_prompt and not messages:
            return
        if self.on_rewrite == "error":
            raise TemplateMismatchError(
                "the chat template's render of the conversation does not extend the text "
                "already tokenized (it rewrites history); with on_rewrite='segment' the episode "
                f"would go on in a new segment. Already rendered ends with {conv.text[-80:]!r}, template "
                f"gives {full[max(0, len(conv.text) - 80):len(conv.text)]!r}.")
        self.new_segment(conv, full)

    def new_segment(self, conv: Conversation, text: str) -> None:
        """Start a segment whose prompt is ``text`` (a full render), tokenized."""
        if conv.token_ids:
            conv.segment_starts.append(len(conv.token_ids))
        self._append_template(conv, self.encode(text))
        conv.text = text

    def restart(self, conv: Conversation, messages: list[dict], drop_from: tuple[int, int] | None = None) -> None:
        """Continue ``conv`` in a new segment rendered from ``messages`` alone (a compaction).

        ``drop_from=(tokens, segments)`` first drops the ids (and segments) rendered after that
        point: template ids no sampled turn followed."""
        if drop_from is not None:
            length, segments = drop_from
            for ids in (conv.token_ids, conv.loss_mask, conv.logprobs):
                del ids[length:]
            del conv.segment_starts[max(segments, 1):]
        conv.messages[:] = [dict(m) for m in messages]
        self.new_segment(conv, self.render(conv.messages, add_generation_prompt=True, tools=conv.tools))

    @staticmethod
    def _append_template(conv: Conversation, ids: list[int]) -> None:
        conv.token_ids.extend(ids)
        conv.loss_mask.extend([0] * len(ids))
        conv.logprobs.extend([0.0] * len(ids))


def _as_written(message: dict) -> dict:
    """An assistant message written by the agent's own program (it has ``tool_calls``, maybe
    ``[]``), as the template reads it: content, calls (when any) and thinking (when given)."""
    out: dict = {"role": "assistant", "content": message.get("content") or ""}
    if message["tool_calls"]:
        out["tool_calls"] = [dict(call) for call in message["tool_calls"]]
    for key in ("reasoning_content", "thinking"):
        if message.get(key):
            out[key] = message[key]
    return out


def _with_tools_prompt(messages: list[dict], tools: list[dict], parser: str) -> list[dict]:
    """``messages`` with the tools described in the system message (templates without tools)."""
    text = tools_prompt(tools, parser)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _without_thought(text: str, open_tag: str, close_tag: str) -> str:
    """``text`` without its ``open_tag ... close_tag`` block, stripped."""
    if open_tag not in text:
        return text
    before, after = text.split(open_tag, 1)
    return (before + (after.split(close_tag, 1)[1] if close_tag in after else "")).strip()


def _answer(text: str, open_tag: str, close_tag: str) -> str:
    """What follows a turn's thought: the text after its last ``close_tag``; of a thought that
    never closed (the turn was cut), nothing; a turn without a thought, whole."""
    if close_tag in text:
        return text.rsplit(close_tag, 1)[1].lstrip()
    if open_tag in text:
        return text.split(open_tag, 1)[0]
    return text


def _merge_roles(messages: list[dict]) -> list[dict]:
    """Consecutive messages of one role joined by a blank line (templates that need alternation)."""
    out: list[dict] = []
    for message in messages:
        if out and out[-1]["role"] == message["role"] and message["role"] != "assistant":
            out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{message['content']}"}
        else:
            out.append(dict(message))
    return out

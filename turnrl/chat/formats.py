"""Chat formats: what the renderer and the env must know about a model family's chat template.

A ``ChatFormat`` names the family's tool-call parser (a ``turnrl.tools`` parser the env reads
the model's calls with), the tokens that end an assistant turn, whether the template renders
``tools=`` itself, and how tool results and history must be written for the template to accept
them. ``detect(template)`` picks the format from the template text (its markers); a config can
name one instead (``agent.chat_format``).

Formats are data in a registry (``FORMATS``); add one with ``register_format(ChatFormat(...))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from turnrl.registry import Registry


@dataclass(frozen=True)
class ChatFormat:
    """One family's chat conventions.

    Attributes:
        name: the format's registry name (e.g. ``"qwen3"``).
        markers: substrings that all occur in the family's chat template text (detection);
            the format with the most markers that all match wins.
        tool_parser: the ``turnrl.tools`` parser (and formatter) of the calls the family writes.
        end_of_turn: special tokens that end a sampled assistant turn (the sampler stops at any
            of them, ``turn_end_ids``); a sampled turn's trailing one is not content.
        native_tools: the template renders ``apply_chat_template(..., tools=...)``; when False
            the renderer writes ``turnrl.tools.tools_prompt`` into the system message instead.
        tool_role: the role tool results are given to the template as (``"tool"``, or
            ``"user"`` for templates without a tool role; their content is then wrapped in
            ``<tool_response>`` tags).
        merge_roles: the template needs alternating user/assistant turns: consecutive
            messages of one role are joined (``"\\n\\n"``) and a system message is merged
            into the first user message.
        history: how a sampled turn is written back as a history message: ``"raw"`` (its
            text as ``content``; the template splits thinking off itself) or ``"structured"``
            (``content``, ``reasoning_content``/``thinking`` and ``tool_calls`` fields, for
            templates that render calls from ``tool_calls`` and check that a tool result
            follows one).
        thinking: the (open, close) tags of a reasoning block the family writes, or None.
        notes: why the family runs in the mode it does (shown in the docs' table).
    """

    name: str
    markers: tuple[str, ...]
    tool_parser: str
    end_of_turn: tuple[str, ...]
    native_tools: bool = True
    tool_role: Literal["tool", "user"] = "tool"
    merge_roles: bool = False
    history: Literal["raw", "structured"] = "raw"
    thinking: tuple[str, str] | None = None
    notes: str = ""


FORMATS: Registry = Registry("chat format")
"""Registry: format name -> a zero-argument function returning its ``ChatFormat``."""


def register_format(fmt: ChatFormat) -> ChatFormat:
    """Register ``fmt`` under ``fmt.name`` (a taken name raises ValueError); returns it."""
    FORMATS.register(fmt.name)(lambda: fmt)
    return fmt


def get_format(name: str) -> ChatFormat:
    """The registered format ``name`` (KeyError lists the valid names)."""
    return FORMATS.get(name)()


def detect(template: str | None) -> ChatFormat:
    """The format whose markers all occur in ``template`` (the most specific one: most markers).

    Raises:
        ValueError: when no registered format matches; the message lists them and says to set
            ``agent.chat_format``.
    """
    if not template:
        raise ValueError("the tokenizer has no chat_template; set one (or build the tiny model's) before rendering")
    matches = [get_format(n) for n in FORMATS.names() if all(m in template for m in get_format(n).markers)]
    if not matches:
        raise ValueError(f"no chat format matches this chat template (known: {FORMATS.names()}); set "
                         "agent.chat_format to the closest one, or register a ChatFormat for it "
                         "(turnrl.chat.formats.register_format)")
    return max(matches, key=lambda f: (len(f.markers), sum(map(len, f.markers))))


def resolve(name: str, template: str | None) -> ChatFormat:
    """``detect(template)`` for ``name == "auto"``, else the registered format ``name``."""
    return detect(template) if name == "auto" else get_format(name)


def turn_end_ids(tokenizer) -> tuple[int, ...]:
    """The ids that end a sampled turn: the tokenizer's ``eos_token_id`` first, then the other
    end-of-turn tokens of the format detected from its chat template (e.g. gpt-oss ends a call
    with ``<|call|>`` and an answer with ``<|return|>``; Llama 3.1 ``<|eom_id|>``)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    try:
        fmt = detect(tokenizer.chat_template)
    except ValueError:  # no template, or one no format knows: the eos alone ends a turn
        return tuple(ids)
    vocab = tokenizer.get_vocab()
    return tuple(dict.fromkeys([*ids, *(vocab[t] for t in fmt.end_of_turn if t in vocab)]))


# ---------------------------------------------------------------- the families
register_format(ChatFormat(
    name="chatml", markers=("<|im_start|>", "<|im_end|>"), tool_parser="hermes", end_of_turn=("<|im_end|>",),
    native_tools=False, notes="ChatML without a tools block (the tiny model's template when it has no tools)"))

# The model families of turnrl.chat.families (their TRL templates); the facts below were read
# off renders of each template (tests/chat/test_families.py and test_template_conformance.py
# check them). A format's markers extend those of the family it refines, so detection (most
# markers wins) picks the most specific one.
_THINK = ("<think>", "</think>")
_QWEN = ("<|im_start|>", "<|im_end|>", "<tool_call>", "<tools>")
_QWEN3 = (*_QWEN, "</think>", "reasoning_content")
_QWEN3_XML = (*_QWEN3, "<function=", "<parameter=")
_LLAMA3 = ("<|start_header_id|>", "<|eot_id|>")
_DEEPSEEK = ("<｜User｜>", "<｜Assistant｜>")
_TRIMS = "ONE segment; the template trims message content, so a sampled turn with leading or trailing whitespace starts a new segment"
for _fmt in (
    ChatFormat("qwen2_5", _QWEN, "hermes", ("<|im_end|>",),
               notes="ONE segment: history turns are written verbatim, so each render extends the last"),
    ChatFormat("qwen3", _QWEN3, "hermes", ("<|im_end|>",), thinking=_THINK,
               notes="SEGMENTS: a new user message drops the <think> blocks of the turns before it; tool results stay in one segment"),
    ChatFormat("qwen3_5", _QWEN3_XML, "qwen3_coder", ("<|im_end|>",), thinking=_THINK,
               notes="SEGMENTS: the prompt opens <think>; a new user message drops the <think> blocks of the turns before it; tool results stay in one segment"),
    ChatFormat("qwen3_6", (*_QWEN3_XML, "preserve_thinking"), "qwen3_coder", ("<|im_end|>",), thinking=_THINK,
               notes="SEGMENTS: a new user message drops the <think> blocks of the turns before it (unless preserve_thinking=True); tool results stay in one segment"),
    ChatFormat("nemotron_3_nano", (*_QWEN3_XML, "truncate_history_thinking"), "qwen3_coder", ("<|im_end|>",),
               thinking=_THINK,
               notes="SEGMENTS: the prompt opens <think>; a new user message empties the <think> blocks of the turns before it (truncate_history_thinking); tool results stay in one segment"),
    ChatFormat("llama3", _LLAMA3, "hermes", ("<|eot_id|>",), native_tools=False, notes=_TRIMS),
    ChatFormat("llama3_2", (*_LLAMA3, "tools_in_user_message"), "llama3_json", ("<|eot_id|>",),
               notes=_TRIMS + "; tool results are written as ipython turns"),
    ChatFormat("llama3_1", (*_LLAMA3, "tools_in_user_message", "<|python_tag|>"), "llama3_json",
               ("<|eot_id|>", "<|eom_id|>"), notes=_TRIMS + "; tool results are written as ipython turns"),
    ChatFormat("gptoss", ("<|channel|>", "<|message|>", "<|call|>"), "harmony", ("<|return|>", "<|call|>"),
               history="structured", thinking=("<|channel|>analysis<|message|>", "<|end|>"),
               notes="SEGMENTS: a new user message drops the analysis of the turns before it and writes a final <|return|> as <|end|>; tool results stay in one segment when a call's header is written as the template writes it (to= before <|channel|>)"),
    ChatFormat("deepseekv3", (*_DEEPSEEK, "is_first_sp"), "deepseek_v3", ("<｜end▁of▁sentence｜>",), native_tools=False,
               thinking=_THINK,
               notes="SEGMENTS: a user turn's prompt opens <think> and history turns keep only the text after </think>, so the next observation rewrites that turn"),
    ChatFormat("deepseek_r1_distill", _DEEPSEEK, "hermes", ("<｜end▁of▁sentence｜>",), native_tools=False,
               thinking=_THINK,
               notes="SEGMENTS: a user turn's prompt opens <think> and history turns keep only the text after </think>, so the next observation rewrites that turn; no tool calls of its own"),
    ChatFormat("gemma3", ("<start_of_turn>", "<end_of_turn>"), "hermes", ("<end_of_turn>",), native_tools=False,
               tool_role="user", merge_roles=True,
               notes=_TRIMS + "; no tool role, and roles must alternate"),
    ChatFormat("gemma4", ("<|turn>", "<turn|>", "<|tool_call>"), "gemma4", ("<turn|>", "<|tool_response>"),
               history="structured", thinking=("<|channel>thought", "<channel|>"),
               notes="ONE segment when a call turn has no text before its call and no thoughts; the template trims message content, so a sampled turn with leading or trailing whitespace starts a new segment; tool results continue the model turn after <|tool_response>; a call turn's text is moved after its results and thoughts before the last user message dropped (then SEGMENTS)"),
    ChatFormat("phi3_5", ("<|user|>", "<|assistant|>", "<|end|>"), "hermes", ("<|end|>",), native_tools=False,
               tool_role="user",
               notes="ONE segment: history turns are written verbatim; the template silently drops tool messages, so results go as user turns"),
    ChatFormat("glm4moe", ("[gMASK]", "<|observation|>", "<arg_key>"), "glm4", ("<|user|>", "<|observation|>", "<|endoftext|>"),
               thinking=_THINK,
               notes="SEGMENTS: a new user message empties the <think> blocks of the turns before it; the template trims message content, so a sampled turn with leading or trailing whitespace starts a new segment; tool results stay in one segment (the sampled stop token <|observation|> is their header)"),
    ChatFormat("lfm2_2_5", ("<|im_start|>", "<|tool_call_start|>", "List of tools"), "pythonic", ("<|im_end|>",),
               thinking=_THINK,
               notes="SEGMENTS: a new user message drops the <think> blocks of the turns before it; tool results stay in one segment"),
):
    register_format(_fmt)

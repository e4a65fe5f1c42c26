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
        end_of_turn: special tokens that end an assistant turn (the first is the one the
            template writes after a history turn); a sampled turn's trailing one is not content.
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
    tool_role: Literal["tool", "user", "ipython"] = "tool"
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
                         "(turnrl.agents.chat_format.register_format)")
    return max(matches, key=lambda f: (len(f.markers), sum(map(len, f.markers))))


def resolve(name: str, template: str | None) -> ChatFormat:
    """``detect(template)`` for ``name == "auto"``, else the registered format ``name``."""
    return detect(template) if name == "auto" else get_format(name)


# ---------------------------------------------------------------- the families
register_format(ChatFormat(
    name="chatml", markers=("<|im_start|>", "<|im_end|>"), tool_parser="hermes", end_of_turn=("<|im_end|>",),
    native_tools=False, notes="ChatML without a tools block (the tiny model's template when it has no tools)"))

"""Chat messages as gymnasium observations: the text space, the spaces, and conversion.

Message content and actions are any Unicode text (code, accents, CJK, emoji, ``\\r``, tabs):
``TextSpace`` accepts every ``str`` that UTF-8 can carry (no lone surrogate) and that holds no
NUL, up to ``MAX_TEXT_CHARS`` characters. Nothing is rewritten or cut on the way: how much of
a conversation a model reads is bounded in tokens by the agent's config, not here.
``MAX_TEXT_CHARS`` only guards against a runaway env (megabytes in one message), which is an
env bug and raises.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from gymnasium import spaces

Message = dict
"""A chat message ``{"role": Role, "content": str}``."""

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")

MAX_TEXT_CHARS = 1_000_000
"""The most characters one message's content (or one action) may have: a guard against a runaway
env, far above anything a model reads (``to_observation`` raises over it; nothing is ever cut)."""
SAMPLE_MAX_CHARS = 64
"""The longest text ``TextSpace.sample`` draws (unless a length is given)."""
SAMPLE_CHARSET: str = (
    "".join(chr(c) for c in range(0x20, 0x7F)) + "\n\t\r"  # printable ASCII and whitespace
    + "éèàçñüößøåÆÉÑ¿¡€£°±×÷"  # Latin-1 and Latin Extended letters, signs
    + "αβγδλπΣΩжзяЖЯ"  # Greek, Cyrillic
    + "∑∫≤≥≠→←∞√"  # math
    + "中文字日本語한국어あいアイ"  # CJK
    + "😀🎉🚀👍🔥"  # emoji (astral plane)
    + "\u00a0\u200b\u3000"  # no-break, zero-width and ideographic spaces
)
"""The characters ``TextSpace.sample`` draws from: a broad sample of Unicode (the space itself
accepts any character but NUL and lone surrogates)."""
_INVALID = re.compile("[\x00\ud800-\udfff]")


def invalid_characters(text: str) -> list[str]:
    """The characters of ``text`` no message can hold: NUL and lone surrogates (which UTF-8
    cannot encode), in order of appearance, each once."""
    return list(dict.fromkeys(_INVALID.findall(text)))


def escape_invalid(text: str) -> str:
    """``text`` with NUL and lone surrogates written as visible escapes (``\\x00``, ``\\ud800``);
    any other text is returned unchanged."""
    if text.isascii() and "\x00" not in text:
        return text
    return _INVALID.sub(lambda m: f"\\x{ord(m.group()):02x}" if m.group() == "\x00" else f"\\u{ord(m.group()):04x}",
                        text)


class TextSpace(spaces.Text):
    """Any Unicode text of ``min_length`` to ``max_length`` characters but NUL and lone surrogates.

    ``contains`` accepts every such ``str`` (the character set is not a whitelist); ``sample``
    draws from ``SAMPLE_CHARSET``, at most ``SAMPLE_MAX_CHARS`` characters unless a length is
    given in ``mask``/``probability``.
    """

    def __init__(self, max_length: int = MAX_TEXT_CHARS, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length=max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a ``str`` of the allowed length without NUL or lone surrogates."""
        return (isinstance(x, str) and self.min_length <= len(x) <= self.max_length
                and (x.isascii() and "\x00" not in x or not _INVALID.search(x)))

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random text from ``SAMPLE_CHARSET`` (see the class docstring)."""
        given = mask if mask is not None else probability
        if given is None or given[0] is None:
            length = int(self.np_random.integers(self.min_length, min(self.max_length, max(self.min_length,
                                                                                          SAMPLE_MAX_CHARS)) + 1))
            given = (length, None if given is None else given[1])
            if mask is not None:
                mask = given
            elif probability is not None:
                probability = given
            else:
                mask = given
        return super().sample(mask=mask, probability=probability)

    def __repr__(self) -> str:
        return f"TextSpace({self.min_length}, {self.max_length}, any text but NUL and lone surrogates)"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TextSpace) and self.min_length == other.min_length
                and self.max_length == other.max_length)

    def __hash__(self) -> int:
        return hash((type(self), self.min_length, self.max_length))


def message_space() -> spaces.Dict:
    """Space of one message: ``role`` (a lowercase word) and ``content`` text (may be empty)."""
    return spaces.Dict(
        {
            "role": spaces.Text(max_length=9, min_length=1, charset="abcdefghijklmnopqrstuvwxyz"),
            "content": TextSpace(),
        }
    )


def observation_space() -> spaces.Sequence:
    """Space of an observation: a tuple of the messages new since the last step."""
    return spaces.Sequence(message_space())


def action_space() -> TextSpace:
    """Space of an action: the assistant turn's text (any text; see ``TextSpace``)."""
    return TextSpace()


def to_observation(messages: list[Message]) -> tuple[Message, ...]:
    """Copy messages into a fresh observation tuple that lies in ``observation_space()``.

    Content is kept exactly as given (any Unicode text); nothing is rewritten or cut.

    Raises:
        ValueError: If a message is not ``{"role": <one of ROLES>, "content": str}``, or its
            content holds NUL or a lone surrogate, or is over ``MAX_TEXT_CHARS`` characters
            (an environment bug, not a model error; ``escape_invalid`` shows such characters).
    """
    observation = []
    for message in messages:
        if not isinstance(message, dict) or set(message) != {"role", "content"} or message["role"] not in ROLES:
            raise ValueError(f"message must be {{'role': one of {ROLES}, 'content': str}}, got {message!r}")
        content = message["content"]
        if not isinstance(content, str):
            raise ValueError(f"message content must be str, got {type(content).__name__}")
        if len(content) > MAX_TEXT_CHARS:
            raise ValueError(f"a {message['role']} message has {len(content)} characters, over MAX_TEXT_CHARS="
                             f"{MAX_TEXT_CHARS} (it starts {content[:60]!r}); an env must bound what it sends")
        if not (content.isascii() and "\x00" not in content) and (bad := invalid_characters(content)):
            raise ValueError(f"a {message['role']} message holds {[hex(ord(c)) for c in bad]} (NUL or lone "
                             f"surrogates), which no text can carry; write them escaped (escape_invalid)")
        observation.append({"role": message["role"], "content": content})
    return tuple(observation)

"""Chat messages as gymnasium observations: the charset, spaces, and conversion."""

from __future__ import annotations

from typing import Literal

from gymnasium import spaces

Message = dict
"""A chat message ``{"role": Role, "content": str}``."""

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")

CHARSET: str = "".join(chr(c) for c in range(0x20, 0x7F)) + "\n\t"
"""Printable ASCII (space to ``~``) plus newline and tab."""

MAX_CONTENT_CHARS = 4096
MAX_ACTION_CHARS = 2048
_TRUNCATION_MARK = "...[truncated]"
_CHARSET_SET = frozenset(CHARSET)


def message_space() -> spaces.Dict:
    """Space of one message: ``role`` (a lowercase word) and ``content`` text (may be empty)."""
    return spaces.Dict(
        {
            "role": spaces.Text(max_length=9, min_length=1, charset="abcdefghijklmnopqrstuvwxyz"),
            "content": spaces.Text(max_length=MAX_CONTENT_CHARS, min_length=0, charset=CHARSET),
        }
    )


def observation_space() -> spaces.Sequence:
    """Space of an observation: a tuple of the messages new since the last step."""
    return spaces.Sequence(message_space())


def action_space() -> spaces.Text:
    """Space of an action: the assistant turn's text."""
    return spaces.Text(max_length=MAX_ACTION_CHARS, min_length=0, charset=CHARSET)


def to_observation(messages: list[Message]) -> tuple[Message, ...]:
    """Copy messages into a fresh observation tuple that lies in ``observation_space()``.

    Content is made to fit the space: ``\\r`` is dropped, other characters outside
    ``CHARSET`` become ``?``, and text over ``MAX_CONTENT_CHARS`` is cut with a
    ``...[truncated]`` mark.

    Raises:
        ValueError: If a message is not ``{"role": <one of ROLES>, "content": str}``
            (an environment bug, not a model error).
    """
    observation = []
    for message in messages:
        if set(message) != {"role", "content"} or message["role"] not in ROLES:
            raise ValueError(f"message must be {{'role': one of {ROLES}, 'content': str}}, got {message!r}")
        if not isinstance(message["content"], str):
            raise ValueError(f"message content must be str, got {type(message['content']).__name__}")
        observation.append({"role": message["role"], "content": fit_text(message["content"])})
    return tuple(observation)


def fit_text(text: str, limit: int = MAX_CONTENT_CHARS) -> str:
    """Map ``text`` into ``CHARSET`` and at most ``limit`` characters (see ``to_observation``)."""
    if not all(c in _CHARSET_SET for c in text):
        text = "".join(c if c in _CHARSET_SET else "?" for c in text.replace("\r", ""))
    if len(text) > limit:
        text = text[: limit - len(_TRUNCATION_MARK)] + _TRUNCATION_MARK
    return text

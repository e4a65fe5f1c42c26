"""Context compaction: what an episode does when its next turn would not fit the context.

``agent.on_context_limit`` picks it: ``"end"`` ends the episode (``termination="context_length"``);
``"compact"`` shortens the conversation with the env's ``compact(messages) -> messages`` (an env
may summarise; the default drops the oldest turn) and the episode goes on in a new segment
rendered from the shorter conversation (``ChatRenderer.restart``).
"""

from __future__ import annotations

ON_CONTEXT_LIMIT: tuple[str, ...] = ("end", "compact")


def drop_oldest_turn(messages: list[dict]) -> list[dict]:
    """``messages`` without their oldest turn: the first assistant message and the observation
    messages that follow it (up to the next assistant message). The opening messages (before the
    first assistant message) and the last turn are kept, so a conversation with one turn or none
    comes back unchanged.
    """
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if len(assistants) < 2:
        return list(messages)
    first, second = assistants[0], assistants[1]
    return list(messages[:first]) + list(messages[second:])

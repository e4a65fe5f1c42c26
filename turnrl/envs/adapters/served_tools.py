"""Tools a server describes: what the protocol adapters (OpenEnv, ORS, MCP) share.

A protocol env server lists its tools as JSON (a name, a description, a JSON schema of the
arguments) and runs them itself. ``served_tool`` checks one such listing and turns it into a
turnrl ``Tool`` whose function sends the call to the server; ``ProtocolError`` is what every
adapter raises when a server's reply breaks its protocol (so the rollout collector ends that one
episode with ``termination="env_error"``); the ``checked_*`` helpers are the checks every value
from a server passes before use. Everything that crosses the process boundary is hostile until
checked: a name that is not a tool name, a schema that is not an object schema, a reward that is
not a finite number, a text over ``MAX_TEXT_CHARS`` are refused with a ``ProtocolError`` naming
the server, the request and what was wrong.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from turnrl.envs.messages import MAX_TEXT_CHARS, invalid_characters
from turnrl.tools import Tool

__all__ = ["MAX_TOOLS", "ProtocolError", "checked_bool", "checked_reward", "checked_text", "served_tool",
           "tool_schema", "to_text"]

MAX_TOOLS = 256
"""The most tools one server may list (a guard against a runaway listing)."""
MAX_SCHEMA_CHARS = 100_000
"""The longest JSON schema of one tool's arguments, in characters."""
TOOL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_-]{0,127}$")
"""The tool names a server may list (those every chat template and call format can carry)."""


class ProtocolError(RuntimeError):
    """A protocol env server answered what its protocol does not allow, answered an error, or did not
    answer: the episode ends (``termination="env_error"``), the run goes on.

    Attributes:
        url: The server's URL.
        what: The request that failed (``"reset"``, ``"step"``, ``"tool 'add'"``...).
    """

    def __init__(self, message: str, *, url: str, what: str) -> None:
        super().__init__(f"{what} at {url}: {message}")
        self.url, self.what = url, what


def checked_text(value: Any, where: str, *, url: str, what: str) -> str:
    """``value`` when it is a str a message can hold (at most ``MAX_TEXT_CHARS``, no NUL or lone
    surrogate), else ``ProtocolError`` saying which field of the reply was wrong."""
    if not isinstance(value, str):
        raise ProtocolError(f"{where} must be a string, got {type(value).__name__}", url=url, what=what)
    if len(value) > MAX_TEXT_CHARS:
        raise ProtocolError(f"{where} has {len(value)} characters, over MAX_TEXT_CHARS={MAX_TEXT_CHARS}",
                            url=url, what=what)
    bad = invalid_characters(value)
    if bad:
        raise ProtocolError(f"{where} holds characters no message can carry: {bad!r}", url=url, what=what)
    return value


def checked_reward(value: Any, where: str, *, url: str, what: str) -> float:
    """``value`` as a float when it is a finite number (None and a bool count as 0.0 and 0/1, as the
    protocols allow them), else ``ProtocolError``."""
    if value is None:
        return 0.0
    if not isinstance(value, (int, float)):
        raise ProtocolError(f"{where} must be a number or null, got {type(value).__name__} {value!r:.60}",
                            url=url, what=what)
    reward = float(value)
    if not math.isfinite(reward):
        raise ProtocolError(f"{where} must be a finite number, got {reward}", url=url, what=what)
    return reward


def checked_bool(value: Any, where: str, *, url: str, what: str) -> bool:
    """``value`` when it is a bool, else ``ProtocolError``."""
    if not isinstance(value, bool):
        raise ProtocolError(f"{where} must be true or false, got {type(value).__name__} {value!r:.60}",
                            url=url, what=what)
    return value


def to_text(value: Any) -> str:
    """A JSON value as message text: a str as it is, anything else as compact, key-sorted JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)


def tool_schema(schema: Any, where: str, *, url: str, what: str) -> dict:
    """A server's JSON schema of a tool's arguments as a turnrl tool's ``parameters``.

    ``None`` (a tool without arguments) is the empty object schema. Each property keeps its JSON
    schema; one without a ``description`` gets its ``title`` or its name (turnrl's checker asks
    every property for one), and an optional value written ``anyOf: [{type: X}, {type: null}]``
    (pydantic's ``X | None``) becomes ``type: X``. Anything else that is not an object schema with
    a properties mapping and a list of required names raises ``ProtocolError``.
    """
    if schema is None:
        return {"type": "object", "properties": {}, "required": []}
    if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
        raise ProtocolError(f"{where} must be an object schema {{'type': 'object', ...}}, got {schema!r:.120}",
                            url=url, what=what)
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"{where} is not JSON ({e})", url=url, what=what) from e
    if size > MAX_SCHEMA_CHARS:
        raise ProtocolError(f"{where} has {size} characters, over {MAX_SCHEMA_CHARS}", url=url, what=what)
    properties, required = schema.get("properties", {}), schema.get("required", [])
    if not isinstance(properties, Mapping) or not all(isinstance(v, Mapping) for v in properties.values()):
        raise ProtocolError(f"{where}: properties must map names to schemas, got {properties!r:.120}",
                            url=url, what=what)
    if not isinstance(required, list) or not all(isinstance(r, str) and r in properties for r in required):
        raise ProtocolError(f"{where}: required must list property names, got {required!r:.120}", url=url,
                            what=what)
    described = {}
    for key, spec in properties.items():
        spec = dict(spec)
        options = spec.get("anyOf")
        if "type" not in spec and isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
            spec.update(next(o for o in options if o != {"type": "null"}))
            del spec["anyOf"]
        if not str(spec.get("description", "")).strip():
            spec["description"] = str(spec.get("title") or key)
        described[str(key)] = spec
    return {"type": "object", "properties": described, "required": list(required)}


def served_tool(name: Any, description: Any, schema: Any, call: Callable[..., Any], *, url: str) -> Tool:
    """A tool a server listed, as a turnrl ``Tool`` whose function is ``call(name, arguments)``.

    Args:
        name: The listed name (checked against ``TOOL_NAME``).
        description: The listed description (a str; an empty one becomes ``"Tool <name>."``).
        schema: The listed JSON schema of the arguments (``tool_schema`` checks it).
        call: ``call(name, arguments) -> text``: sends the call to the server. It raises
            ``ToolUnavailableError`` when the server cannot be reached (the episode ends as the
            infrastructure's failure) and another exception when the server refused the call (the
            model is told, as for any tool).
        url: The server's URL, for error messages.

    Raises:
        ProtocolError: When the listing is not a tool a model can call.
    """
    what = "listing tools"
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise ProtocolError(f"tool name {name!r:.80} must match {TOOL_NAME.pattern}", url=url, what=what)
    if description is None:
        description = ""
    description = checked_text(description, f"tool {name!r}'s description", url=url, what=what).strip()
    parameters = tool_schema(schema, f"tool {name!r}'s input schema", url=url, what=what)

    def send(**arguments: Any) -> str:
        return call(name, arguments)

    send.__name__ = name
    return Tool(name=name, description=description or f"Tool {name}.", parameters=parameters, fn=send)

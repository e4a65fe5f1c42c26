"""The one error format of turnrl's servers, and the checks every request body passes.

Every refusal of the env, tool and policy servers is a JSON reply (OpenAI's shape, which
OpenAI clients already read)::

    {"error": {"message": "<what was wrong and how to fix it>", "type": "<a kind>",
               "code": <the HTTP status>, "param": "<the field at fault>" | null, ...}}

``type`` is a machine-readable kind: for refusals of the request itself an OpenAI type
(``invalid_request_error``, ``authentication_error``, ``permission_error``, ``not_found_error``,
``server_error``...), or a kind the server documents (the env server's env exception class,
the tool server's ``unknown_tool`` / ``unavailable``). A server may add fields beside these
(the tool server's ``tools``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["APIError", "MAX_JSON_DEPTH", "ERROR_TYPES", "error_body", "input_refused", "parse_json"]

MAX_JSON_DEPTH = 64
"""How deeply a request body's arrays and objects may nest (``parse_json``)."""
_TOO_MANY_DIGITS = "integer string conversion"
"""In the ValueError of Python's ``int`` for a number of more than ``sys.get_int_max_str_digits()`` digits."""

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 408: "timeout_error", 409: "conflict_error", 411: "invalid_request_error",
    413: "invalid_request_error", 429: "rate_limit_error", 431: "invalid_request_error", 503: "overloaded_error"}
"""The ``type`` of a refusal that names no kind of its own, by status (5xx: ``server_error``)."""


class APIError(Exception):
    """A request the server refuses: the status, a message saying what to fix, and the reply's
    other fields (``type``: the kind, default by status; ``param``: the field at fault; any
    more keyword fields go into the ``error`` object as they are).

    Example:
        ``raise APIError(409, "step needs an episode: reset first", type="ResetNeeded")``
    """

    def __init__(self, status: int, message: str, /, *, type: str | None = None,  # noqa: A002 (the wire name)
                 param: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message = int(status), message
        self.type = type or ERROR_TYPES.get(int(status), "server_error" if status >= 500 else "invalid_request_error")
        self.param, self.extra = param, extra

    def body(self) -> dict:
        """The reply: ``{"error": {"message", "type", "code", "param", **extra}}``."""
        return error_body(self.status, self.message, type=self.type, param=self.param, **self.extra)


def error_body(status: int, message: str, *, type: str | None = None, param: str | None = None,  # noqa: A002
               **extra: Any) -> dict:
    """The error reply for ``status`` (``type`` defaults by status, see ``ERROR_TYPES``)."""
    kind = type or ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "code": int(status), "param": param, **extra}}


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value ``raw`` holds, checked to be safe to walk.

    Raises:
        ValueError: If ``raw`` is not UTF-8 JSON, nests arrays and objects deeper than
            ``max_depth`` levels, or holds an integer of more digits than Python converts
            (4300 by default); the message says which.
    """
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(f"the JSON nests deeper than {max_depth} levels of arrays and objects") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, or an integer too long to convert
        if _TOO_MANY_DIGITS in str(e):
            raise ValueError(f"the JSON holds an integer of more than {sys.get_int_max_str_digits()} digits; send "
                             "numbers of an ordinary size") from None
        raise ValueError(f"the body is not valid UTF-8 JSON ({e})") from None
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:  # only arrays and objects are pushed
        item, depth = stack.pop()
        if depth > max_depth:
            raise ValueError(f"the JSON nests deeper than {max_depth} levels of arrays and objects")
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return value


def input_refused(e: BaseException) -> str | None:
    """What was wrong with the request when ``e`` is Python refusing its input: data nested
    deeper than the recursion limit, or an integer longer than ``int`` converts; else None."""
    if isinstance(e, RecursionError):
        return "the request nests data too deeply; send flatter JSON"
    if isinstance(e, ValueError) and _TOO_MANY_DIGITS in str(e):
        return (f"the request holds an integer of more than {sys.get_int_max_str_digits()} digits; send numbers "
                "of an ordinary size")
    return None



"""The HTTP stack of turnrl's servers (env, tool and policy): FastAPI routes under uvicorn.

* ``tokens``: bearer tokens, for servers and their clients.
* ``errors``: the one error format (``APIError``) and the checks every JSON body passes.
* ``app``: ``service_app``, the FastAPI app every server starts from (``/health``, the token,
  framing, size and JSON checks, 4xx for every bad request).
* ``server``: ``HTTPService``, the lifecycle (start, stop, read deadlines) under uvicorn.

Clients import ``tokens`` and ``errors`` only; FastAPI and uvicorn load with the first name
taken from ``app`` or ``server``.
"""

from typing import Any

from turnrl.serving.errors import APIError, MAX_JSON_DEPTH, error_body, parse_json
from turnrl.serving.tokens import (DEFAULT_TOKEN_ENV, TokenRefusedError, auth_headers, check_token, is_loopback,
                                   refused_message, require_token, server_token, token_from_env)

__all__ = ["APIError", "DEFAULT_READ_TIMEOUT_S", "DEFAULT_TOKEN_ENV", "HTTPService", "JSONReply", "MAX_JSON_DEPTH",
           "TokenRefusedError", "auth_headers", "check_token", "error_body", "is_loopback", "parse_json",
           "refused_message", "require_token", "server_token", "service_app", "token_from_env"]

_LAZY = {"JSONReply": "app", "service_app": "app", "DEFAULT_READ_TIMEOUT_S": "server", "HTTPService": "server"}


def __getattr__(name: str) -> Any:
    """Load the server side (FastAPI, uvicorn) when one of its names is first used."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"turnrl.serving.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'turnrl.serving' has no attribute {name!r}")

"""Bearer tokens for turnrl's servers and their clients.

A server started with a token answers every request but ``GET /health`` with 401 unless it
carries ``Authorization: Bearer <token>`` (``turnrl.serving.app``). Bound to an address other
than loopback (127.0.0.0/8, ::1, ``localhost``) a server refuses to start without one: anyone
who can connect could otherwise run episodes and code on it. The token never comes from the
command line or a config file: the command lines read it from the environment variable
``--token-env`` names (default ``TURNRL_SERVER_TOKEN``), and the clients (``RemoteEnv``, the
``remote`` tool executor) from the variable their ``token_env`` names.
"""

from __future__ import annotations

import ipaddress
import os

__all__ = ["DEFAULT_TOKEN_ENV", "TokenRefusedError", "auth_headers", "check_token", "is_loopback", "refused_message",
           "require_token", "server_token", "token_from_env"]

DEFAULT_TOKEN_ENV = "TURNRL_SERVER_TOKEN"
"""The environment variable servers and clients read the bearer token from unless told another."""
_NEW_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


class TokenRefusedError(RuntimeError):
    """A server answered 401 to this client's bearer token (or to its lack of one).

    Every further request would be refused alike, so callers that otherwise tolerate a
    failing episode (the rollout collector) re-raise it: the run stops with this message.
    """


def is_loopback(host: str) -> bool:
    """True when binding ``host`` serves this machine only: ``localhost``, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # another host name: it may resolve to anything
        return False


def check_token(token: str, source: str = "the token") -> str:
    """``token``, checked to be usable in an ``Authorization: Bearer`` header.

    Args:
        token: The secret.
        source: Where it came from, for the message (e.g. ``"the variable TURNRL_SERVER_TOKEN"``);
            the message never shows the token itself.

    Raises:
        ValueError: If it is empty, or holds whitespace or characters other than printable ASCII.
    """
    if not isinstance(token, str) or not token:
        raise ValueError(f"{source} is empty; make a token with `{_NEW_TOKEN}`")
    if not all("!" <= c <= "~" for c in token):
        raise ValueError(f"{source} holds whitespace or characters other than printable ASCII, which an HTTP "
                         f"header cannot carry (a trailing newline?); make a token with `{_NEW_TOKEN}`")
    return token


def token_from_env(var: str | None) -> str | None:
    """The token held in the environment variable ``var`` (None when ``var`` is None, unset or empty).

    Raises:
        ValueError: If the variable holds something ``check_token`` refuses.
    """
    value = os.environ.get(var, "") if var else ""
    return check_token(value, f"the environment variable {var}") if value else None


def auth_headers(var: str | None) -> dict[str, str]:
    """``{"Authorization": "Bearer <token>"}`` with the token held in ``var``; ``{}`` when it holds none."""
    token = token_from_env(var)
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def refused_message(url: str, var: str | None, sent: bool) -> str:
    """What a client says when the server at ``url`` answered 401.

    Args:
        url: The server.
        var: The variable the client's token came from (None: the client reads none).
        sent: Whether a token was sent.
    """
    if not var:
        return (f"the server at {url} wants a token and none was sent: name the environment variable that holds "
                f"it (token_env, e.g. {DEFAULT_TOKEN_ENV})")
    unset = "" if sent else f" ({var} was unset or empty, so no token was sent)"
    return f"the server at {url} refused the token: set {var} to its token{unset}"


def require_token(host: str, token: str | None, token_env: str = DEFAULT_TOKEN_ENV) -> None:
    """Refuse to serve on a non-loopback ``host`` without a token.

    Raises:
        ValueError: If ``host`` is not loopback and ``token`` is None, saying how to set one.
    """
    if token is None and not is_loopback(host):
        raise ValueError(
            f"refusing to serve on {host!r} without a token: other machines can reach that address, and anyone "
            f"who connects could run episodes and code here. Put a secret in the environment variable {token_env} "
            f"(e.g. `export {token_env}=$({_NEW_TOKEN})`; --token-env VAR names another variable; in Python pass "
            "token=..., or api_key=... to PolicyServer) and give the clients the same variable, or bind 127.0.0.1 "
            "to serve this machine only")


def server_token(token_env: str | None, host: str) -> str | None:
    """The token of a server started from the command line on ``host`` (``--token-env``).

    Args:
        token_env: The variable named on the command line; None: ``DEFAULT_TOKEN_ENV``, whose
            token is used when it holds one.
        host: The interface to bind.

    Raises:
        ValueError: If ``token_env`` names an unset or empty variable, the variable holds a
            malformed token, or ``host`` is not loopback and there is no token.
    """
    var = token_env or DEFAULT_TOKEN_ENV
    token = token_from_env(var)
    if token is None and token_env is not None:
        raise ValueError(f"the environment variable {var} (named by --token-env) is unset or empty; "
                         f"set it to the token clients will send, e.g. `export {var}=$({_NEW_TOKEN})`")
    require_token(host, token, var)
    return token

"""``EnvServer``: serve a registered env over HTTP, one env instance per session.

Run it as ``python -m turnrl serve-env turnrl/GuessNumber-v0 --port 8000`` (see
``turnrl.cli``) and use it with ``turnrl.envs.remote.RemoteEnv`` (or ``env.url`` in a
training config). Built on the standard library's ``ThreadingHTTPServer``: each
connection gets a thread, each session its own env and lock, so many sessions step
concurrently while requests to one session are served in order.

Endpoints (JSON in, JSON out; ``REQUEST_SCHEMAS`` holds the body schemas):

* ``GET /info`` -> ``{"env_id", "kwargs", "tools", "max_turns", "session_ttl_s",
  "max_sessions", "sessions", "request_schemas"}``; ``tools`` are the tool schemas
  ``[t.schema() for t in env.unwrapped.tools]`` of an env made with the server's kwargs.
* ``POST /sessions`` ``{"kwargs": {...}}`` (optional) -> ``{"session_id", "env_id",
  "kwargs", "tools", "max_turns"}``. The session's env is ``gymnasium.make(env_id,
  **{**server_kwargs, **kwargs})``: the request's kwargs override the server's (a client
  passes e.g. its agent's ``tool_parser``). 503 when ``max_sessions`` sessions are open.
* ``POST /sessions/{id}/reset`` ``{"seed": int|null, "options": {...}}`` ->
  ``{"observation": [messages], "info": {...}}``; the info's ``tools`` are the episode's tool
  schemas (``MultiTurnEnv.reset``).
* ``POST /sessions/{id}/step`` ``{"action": str}`` -> ``{"observation", "reward",
  "terminated", "truncated", "info"}``.
* ``POST /sessions/{id}/player`` ``{"player": "expert"|"weak"|"random", "rng_seed": int,
  "rng_state": {...}}`` -> ``{"action": str, "rng_state": {...}|null}``: the env's scripted
  players (``expert_action()``, ``weak_expert_action(rng)``, ``random_action(rng)``).
  The weak and random players need exactly one source of randomness:

  - ``rng_state``: a numpy bit-generator state (``rng.bit_generator.state``). The player
    runs on a generator in that state and the reply carries the state after the call.
    A client that stores the returned state back into its generator gets exactly the
    draws a local player would have made with that generator (this is what
    ``RemoteEnv`` does; such a call is idempotent, so it may be retried).
  - ``rng_seed``: the session keeps one generator, ``np.random.default_rng(rng_seed)``,
    made the first time the session sees that seed (and made anew whenever a call brings
    a different seed). Consecutive calls with the same seed continue that generator, so a
    sequence of calls matches a local player driven by one ``default_rng(rng_seed)``
    through the same calls, across episodes (reset does not touch it). Such calls are not
    idempotent (do not retry them).

  ``rng_state`` is returned for both (null for the expert).
* ``DELETE /sessions/{id}`` -> ``{"deleted": id}``.

With a ``token`` (``serve-env`` reads it from the variable ``--token-env`` names, default
``TURNRL_SERVER_TOKEN``; required when bound to an address other than loopback), every
request must send ``Authorization: Bearer <token>``, else 401 (``turnrl.http_json``).

Errors are ``{"error": "<what was wrong and how to fix it>"}`` with a status: 401 a missing
or wrong token; 400 a body
that is not a JSON object or fails its schema (checked with
``turnrl.tools.validation.validate_arguments``; an optional field may be null, meaning
absent), or kwargs the env's constructor rejects; 404 an unknown path or session (a
session idle longer than ``session_ttl_s`` is reaped and then unknown); 405 a wrong
method; 413 a body over ``MAX_BODY_BYTES``; 503 too many sessions; 500 an exception
inside the env (the reply adds ``"type"`` and ``"message"``, the exception's class name
and text; the server keeps running).

JSON values: observations and info are sent as JSON. Tuples become lists, numpy scalars
and arrays become numbers and lists; a dict key that is not a string, or a value JSON
cannot carry, is a 500 naming the info key. ``RemoteEnv`` turns every list back into a
tuple, recursively, so a tuple ``state_key`` comes back equal to the local one (and
hashable); an info value that was a list locally arrives as a tuple.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import gymnasium
import numpy as np

import turnrl.envs.registration as registration
from turnrl.http_json import HTTPError, JSONHandler, JSONServer
from turnrl.tools.validation import validate_arguments

__all__ = ["EnvServer", "PLAYERS", "REQUEST_SCHEMAS", "MAX_BODY_BYTES", "to_json"]

log = logging.getLogger(__name__)

PLAYERS: tuple[str, ...] = ("expert", "weak", "random")
MAX_BODY_BYTES = 1 << 20
"""Largest request body accepted (1 MiB); larger ones get 413."""
BIT_GENERATORS: tuple[str, ...] = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
"""numpy bit generators an ``rng_state`` may name."""

REQUEST_SCHEMAS: dict[str, dict] = {
    "POST /sessions": {
        "type": "object",
        "properties": {
            "kwargs": {"type": "object", "description": "env constructor kwargs overriding the server's"},
        },
        "required": [],
    },
    "POST /sessions/{id}/reset": {
        "type": "object",
        "properties": {
            "seed": {"type": "integer", "description": "reset seed (>= 0); null or absent: no reseeding"},
            "options": {"type": "object", "description": 'reset options, e.g. {"split": "test"}'},
        },
        "required": [],
    },
    "POST /sessions/{id}/step": {
        "type": "object",
        "properties": {"action": {"type": "string", "description": "the assistant turn's text"}},
        "required": ["action"],
    },
    "POST /sessions/{id}/player": {
        "type": "object",
        "properties": {
            "player": {"type": "string", "enum": list(PLAYERS), "description": "which scripted player"},
            "rng_seed": {"type": "integer", "description": "seed of the session's player generator"},
            "rng_state": {"type": "object", "description": "a numpy rng.bit_generator.state"},
        },
        "required": ["player"],
    },
}
"""JSON schema of every request body, keyed by ``"METHOD /path"`` (also served at ``/info``)."""

_SESSION_PATH = re.compile(r"^/sessions/([A-Za-z0-9_-]+)(?:/(reset|step|player))?$")
_ENDPOINTS = "GET /info, POST /sessions, POST /sessions/{id}/reset|step|player, DELETE /sessions/{id}"


@dataclass
class _Session:
    env: gymnasium.Env
    kwargs: dict
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    rng: np.random.Generator | None = None
    rng_seed: int | None = None


class EnvServer(JSONServer):
    """Serve ``env_id`` over HTTP (the endpoints are in the module docstring).

    Use as a context manager, or ``start()`` then ``stop()``. The env is made once at
    construction to fail early (with the env's own message) on a bad id or kwargs.

    Args:
        env_id: A registered gymnasium id (``turnrl/...`` ids are registered on import).
        env_kwargs: Constructor kwargs of every session's env (a session may override them).
        host: Interface to bind (``127.0.0.1``: this machine only; ``0.0.0.0``: all).
        port: TCP port; 0 picks a free one (read it from ``url`` after ``start()``).
        session_ttl_s: A session idle for longer than this many seconds is closed.
        max_sessions: Most sessions open at once; creating one more gets HTTP 503.
        token: The bearer token every request must send (else 401); required unless ``host``
            is loopback. None: no token (loopback only).

    Raises:
        ValueError: On an unregistered id, kwargs the env rejects, bad limits, or a
            non-loopback ``host`` without a token.
    """

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any] | None = None, host: str = "127.0.0.1",
                 port: int = 0, session_ttl_s: float = 600, max_sessions: int = 1024, *,
                 token: str | None = None) -> None:
        registration.register_envs()
        if env_id not in gymnasium.registry:
            raise ValueError(f"unknown env id {env_id!r}; registered turnrl ids: "
                             f"{', '.join(registration.registered_env_ids())}")
        if not isinstance(session_ttl_s, (int, float)) or session_ttl_s <= 0:
            raise ValueError(f"session_ttl_s must be a positive number of seconds, got {session_ttl_s!r}")
        if not isinstance(max_sessions, int) or isinstance(max_sessions, bool) or max_sessions < 1:
            raise ValueError(f"max_sessions must be a positive int, got {max_sessions!r}")
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535] (0 picks a free port), got {port!r}")
        super().__init__(host, port, _Handler, "env-server", token=token)
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.session_ttl_s, self.max_sessions = float(session_ttl_s), max_sessions
        probe = self._make_env(self.env_kwargs)
        try:
            self._description = _describe_env(probe)
        except HTTPError as e:
            raise ValueError(e.error) from e
        finally:
            probe.close()
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    # --------------------------------------------------------------- running
    def stop(self) -> None:
        """Stop serving and close every session's env (idempotent)."""
        super().stop()
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            _close_quietly(s.env)

    def _background(self) -> list[tuple[str, Callable[[], None]]]:
        return [("env-reaper", self._reap_loop)]  # reaps idle sessions while serving

    @property
    def num_sessions(self) -> int:
        """Sessions open now."""
        with self._lock:
            return len(self._sessions)

    def reap(self) -> int:
        """Close sessions idle longer than ``session_ttl_s`` (skipping busy ones); returns how many."""
        now = time.monotonic()
        with self._lock:
            expired = [sid for sid, s in self._sessions.items()
                       if now - s.last_used > self.session_ttl_s and not s.lock.locked()]
            closed = [self._sessions.pop(sid) for sid in expired]
        for s in closed:
            _close_quietly(s.env)
        if closed:
            log.info("reaped %d idle session(s)", len(closed))
        return len(closed)

    def _reap_loop(self) -> None:
        interval = min(max(self.session_ttl_s / 4, 0.05), 30.0)
        while not self._stopping.wait(interval):
            self.reap()

    # -------------------------------------------------------------- handlers
    def _make_env(self, kwargs: Mapping[str, Any]) -> gymnasium.Env:
        try:
            return gymnasium.make(self.env_id, disable_env_checker=True, **kwargs)
        except Exception as e:
            raise ValueError(f"gymnasium.make({self.env_id!r}, **{dict(kwargs)}) raised "
                             f"{type(e).__name__}: {e}") from e

    def info(self) -> dict:
        """The ``GET /info`` reply."""
        return {"env_id": self.env_id, "kwargs": _jsonable(self.env_kwargs, "kwargs"), **self._description,
                "session_ttl_s": self.session_ttl_s, "max_sessions": self.max_sessions,
                "sessions": self.num_sessions, "request_schemas": REQUEST_SCHEMAS}

    def create_session(self, body: dict) -> dict:
        """``POST /sessions``: make the session's env and return its description."""
        self.reap()
        kwargs = {**self.env_kwargs, **body.get("kwargs", {})}
        with self._lock:
            full = len(self._sessions) >= self.max_sessions
        if full:
            raise self._full()
        try:
            env = self._make_env(kwargs)
        except ValueError as e:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"{e}; pass kwargs the env's constructor accepts",
                             type=type(e.__cause__).__name__, message=str(e.__cause__)) from e
        try:
            description = _describe_env(env)
        except Exception as e:
            _close_quietly(env)
            raise _env_error("describing the env", e) from e
        sid = secrets.token_hex(12)
        with self._lock:  # checked again: other sessions may have been made meanwhile
            full = len(self._sessions) >= self.max_sessions
            if not full:
                self._sessions[sid] = _Session(env, kwargs, time.monotonic())
        if full:
            _close_quietly(env)
            raise self._full()
        return {"session_id": sid, "env_id": self.env_id, "kwargs": _jsonable(kwargs, "kwargs"), **description}

    def _full(self) -> HTTPError:
        return HTTPError(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"the server already holds max_sessions={self.max_sessions} sessions; close sessions you no "
            f"longer need (DELETE /sessions/{{id}}, RemoteEnv.close()), wait for idle ones to expire "
            f"(session_ttl_s={self.session_ttl_s:g}), or restart the server with a larger --max-sessions")

    def delete_session(self, sid: str) -> dict:
        """``DELETE /sessions/{id}``."""
        with self._lock:
            session = self._sessions.pop(sid, None)
        if session is None:
            raise _unknown_session(sid, self.session_ttl_s)
        with session.lock:
            _close_quietly(session.env)
        return {"deleted": sid}

    def session_call(self, sid: str, verb: str, body: dict) -> dict:
        """``POST /sessions/{id}/{verb}`` for ``verb`` in reset, step, player."""
        with self._lock:
            session = self._sessions.get(sid)
            if session is not None:
                session.last_used = time.monotonic()
        if session is None:
            raise _unknown_session(sid, self.session_ttl_s)
        with session.lock:
            try:
                return _VERBS[verb](session, body)
            finally:
                session.last_used = time.monotonic()


# -------------------------------------------------------------- the verbs
def _reset(session: _Session, body: dict) -> dict:
    seed = body.get("seed")
    if seed is not None and seed < 0:
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"'seed' must be a non-negative integer or null, got {seed}")
    try:
        obs, info = session.env.reset(seed=seed, options=body.get("options"))
    except Exception as e:
        raise _env_error("reset", e) from e
    return {"observation": _jsonable(obs, "observation"), "info": _jsonable(info, "info")}


def _step(session: _Session, body: dict) -> dict:
    try:
        obs, reward, terminated, truncated, info = session.env.step(body["action"])
    except Exception as e:
        raise _env_error("step", e) from e
    return {"observation": _jsonable(obs, "observation"), "reward": float(reward),
            "terminated": bool(terminated), "truncated": bool(truncated), "info": _jsonable(info, "info")}


def _player(session: _Session, body: dict) -> dict:
    player, base = body["player"], session.env.unwrapped
    has_seed, has_state = "rng_seed" in body, "rng_state" in body
    if player == "expert":
        if has_seed or has_state:
            raise HTTPError(HTTPStatus.BAD_REQUEST, "the expert player takes no randomness; "
                                                     "drop 'rng_seed' and 'rng_state'")
        return {"action": _play(base, "expert_action"), "rng_state": None}
    if has_seed == has_state:
        raise HTTPError(HTTPStatus.BAD_REQUEST,
                         f"the {player} player needs exactly one of 'rng_seed' (an int: the session keeps "
                         "a generator seeded with it) or 'rng_state' (a numpy rng.bit_generator.state)")
    if has_state:
        rng = _generator_from_state(body["rng_state"])
    else:
        if body["rng_seed"] < 0:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"'rng_seed' must be non-negative, got {body['rng_seed']}")
        if session.rng is None or session.rng_seed != body["rng_seed"]:
            session.rng, session.rng_seed = np.random.default_rng(body["rng_seed"]), body["rng_seed"]
        rng = session.rng
    method = "weak_expert_action" if player == "weak" else "random_action"
    action = _play(base, method, rng)
    return {"action": action, "rng_state": to_json(rng.bit_generator.state, "rng_state")}


def _play(base: Any, method: str, *args: Any) -> str:
    fn = getattr(base, method, None)
    if fn is None:
        error = NotImplementedError(f"{type(base).__name__} does not define {method}()")
        raise _env_error(method, error)
    try:
        action = fn(*args)
    except Exception as e:
        raise _env_error(method, e) from e
    if not isinstance(action, str):
        raise _env_error(method, TypeError(f"{method}() returned {type(action).__name__}, not str"))
    return action


def _generator_from_state(state: dict) -> np.random.Generator:
    name = state.get("bit_generator")
    if name not in BIT_GENERATORS:
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"rng_state['bit_generator'] must be one of {list(BIT_GENERATORS)}"
                                                 f", got {name!r}; send rng.bit_generator.state of a numpy Generator")
    bit_generator = getattr(np.random, name)()
    try:
        bit_generator.state = state
    except (TypeError, ValueError, KeyError) as e:
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"rng_state is not a valid {name} state ({type(e).__name__}: "
                                                 f"{e}); send rng.bit_generator.state unchanged") from e
    return np.random.Generator(bit_generator)


_VERBS: dict[str, Callable[[_Session, dict], dict]] = {"reset": _reset, "step": _step, "player": _player}


# ------------------------------------------------------------------ helpers
def to_json(value: Any, path: str) -> Any:
    """``value`` as JSON types: tuples/lists -> lists, numpy scalars/arrays -> numbers/lists.

    Raises:
        TypeError: If a dict key is not a str or a value has no JSON form; the message
            names where (``path``, e.g. ``info['state_key'][1]``).
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return to_json(value.tolist(), path)
    if isinstance(value, (list, tuple)):
        return [to_json(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{path} has the key {k!r} of type {type(k).__name__}; JSON keys must be str")
            out[k] = to_json(v, f"{path}[{k!r}]")
        return out
    raise TypeError(f"{path} is a {type(value).__name__} ({value!r:.60}), which JSON cannot carry; use str, int, "
                    "float, bool, None, lists/tuples and dicts with str keys")


def _jsonable(value: Any, path: str) -> Any:
    """``to_json`` for a reply: a value JSON cannot carry is a 500 naming where it is."""
    try:
        return to_json(value, path)
    except TypeError as e:
        raise HTTPError(HTTPStatus.INTERNAL_SERVER_ERROR, f"the env's {path} cannot be sent as JSON: {e}",
                         type="TypeError", message=str(e)) from e


def _describe_env(env: gymnasium.Env) -> dict:
    base = env.unwrapped
    tools = [t.schema() for t in getattr(base, "tools", ())]
    max_turns = getattr(base, "max_turns", None)
    return {"tools": _jsonable(tools, "tools"), "max_turns": None if max_turns is None else int(max_turns)}


def _env_error(what: str, e: BaseException) -> HTTPError:
    if isinstance(e, HTTPError):
        return e
    return HTTPError(HTTPStatus.INTERNAL_SERVER_ERROR, f"the env raised {type(e).__name__} during {what}: {e}",
                      type=type(e).__name__, message=str(e))


def _unknown_session(sid: str, ttl: float) -> HTTPError:
    return HTTPError(HTTPStatus.NOT_FOUND,
                      f"unknown session {sid!r}: it was deleted, or it expired after {ttl:g} s idle "
                      "(session_ttl_s), or the server restarted; open a new one with POST /sessions")


def _close_quietly(env: gymnasium.Env) -> None:
    try:
        env.close()
    except Exception as e:  # a failing close must not take the server down
        log.warning("env.close() raised %r", e)


class _Handler(JSONHandler):
    """Routes requests to an ``EnvServer`` (GET, POST and DELETE)."""

    max_body_bytes = MAX_BODY_BYTES
    drain_bytes = 16 * MAX_BODY_BYTES
    logger = log
    json_server: EnvServer

    def do_DELETE(self) -> None:  # noqa: N802 (http.server's naming)
        self._dispatch("DELETE")

    def internal_error(self, e: Exception) -> HTTPError:
        return HTTPError(HTTPStatus.INTERNAL_SERVER_ERROR, f"the env server failed: {type(e).__name__}: {e}",
                         type=type(e).__name__, message=str(e))

    def route(self, method: str, path: str) -> dict:
        raw, server = self.read_body(), self.json_server
        if path == "/info":
            _require_method(method, "GET", path)
            return server.info()
        if path == "/sessions":
            _require_method(method, "POST", path)
            return server.create_session(_parse_body(raw, "POST /sessions"))
        match = _SESSION_PATH.match(path)
        if match is None:
            raise HTTPError(HTTPStatus.NOT_FOUND, f"no endpoint {path!r}; the endpoints are: {_ENDPOINTS}")
        sid, verb = match.groups()
        if verb is None:
            _require_method(method, "DELETE", path)
            return server.delete_session(sid)
        _require_method(method, "POST", path)
        return server.session_call(sid, verb, _parse_body(raw, f"POST /sessions/{{id}}/{verb}"))


def _require_method(method: str, allowed: str, path: str) -> None:
    if method != allowed:
        raise HTTPError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not allowed on {path}; use {allowed}")


def _parse_body(raw: bytes, endpoint: str) -> dict:
    """Decode and validate a body against ``REQUEST_SCHEMAS[endpoint]`` (empty means ``{}``)."""
    schema = REQUEST_SCHEMAS[endpoint]
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"the body of {endpoint} is not JSON ({e}); send a JSON object "
                                                 f"matching {json.dumps(schema)}") from e
    if not isinstance(body, dict):
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"the body of {endpoint} must be a JSON object, got "
                                                 f"{type(body).__name__}; send {json.dumps(schema)}")
    required = set(schema.get("required", []))
    body = {k: v for k, v in body.items() if v is not None or k in required}  # null optional = absent
    problem = validate_arguments(body, schema)
    if problem is not None:
        fields = ", ".join(f"{k}: {v.get('type', 'any')}" + (" (required)" if k in required else "")
                           for k, v in schema["properties"].items())
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"bad body for {endpoint}: {problem}; the fields are {{{fields}}}")
    return body

"""``EnvServer``: serve a registered env over HTTP, one env instance per session.

Run it as ``python -m turnrl serve-env turnrl/GuessNumber-v0 --port 8000`` (see
``turnrl.cli``) and use it with ``turnrl.envs.remote.RemoteEnv`` (or ``env.url`` in a
training config). A FastAPI app under uvicorn (``turnrl.serving``): requests run in a
thread pool, each session has its own env and lock, so many sessions step concurrently
while requests to one session are served in order.

What a client may choose. The env id and every setting of how code runs (``executors``,
``executor_options``: sandbox limits, ``run_as``, the bubblewrap binary, warm pools, tool
service URLs and the variables their tokens come from) are the server's: its ``env_kwargs``
(``serve-env --kwarg``). A client may pass only the task kwargs the server allows
(``client_kwargs``, listed by ``GET /info``):

* ``DEFAULT_CLIENT_KWARGS`` (``tool_parser``: the agent's tool-call format, which
  ``RemoteEnv`` sends; ``max_turns``), where the env's constructor takes them;
* the names the env class (the one the id is registered with) lists in a ``client_kwargs``
  class attribute, e.g. ``client_kwargs: ClassVar[tuple[str, ...]] = ("n", "n_min")`` on a
  ``MultiTurnEnv`` subclass;
* the names the operator adds (``serve-env ENV_ID --client-kwarg num_boxes``,
  ``EnvServer(client_kwargs=...)``).

A name that may control execution, reach or credentials can never be allowed
(``execution_setting``: ``executors``, ``executor_options``, ``envs``, and every name holding
``executor``, ``sandbox``, ``bwrap``, ``run_as``, ``token``, ``secret``, ``limit``,
``timeout``, ``memory``, ``url``, or the word ``env``, ``path``, ``dir``, ``file``,
``host``, ``port``, ``key``, ``user``, ``pool``...): an env class or operator naming one
makes the server refuse to start, saying why; such settings go on the server
(``--kwarg``). Each value a client sends must be a JSON scalar (a string of at most
``MAX_KWARG_CHARS`` characters, an integer within 64 bits, a finite number, a boolean,
null) or a list of at most ``MAX_KWARG_ITEMS`` of them. Reset options (``{"split":
"test"}``) obey the same value rules.

Endpoints (JSON in, JSON out; the bodies are the pydantic models ``CreateSession``,
``Reset``, ``Step`` and ``Player``, strict and closed: a field of the wrong JSON type or an
unknown field is a 400; ``REQUEST_SCHEMAS`` holds their JSON schemas):

* ``GET /health`` -> ``{"status": "ok"}`` (open without a token).
* ``GET /info`` -> ``{"env_id", "kwargs", "client_kwargs", "tools", "max_turns",
  "session_ttl_s", "max_sessions", "sessions", "request_schemas"}``; ``kwargs`` are the
  server's task kwargs (execution settings are not shown), ``tools`` the tool schemas
  ``[t.schema() for t in env.unwrapped.tools]`` of an env made with the server's kwargs.
* ``POST /sessions`` ``{"kwargs": {...}}`` (optional) -> ``{"session_id", "env_id",
  "kwargs", "tools", "max_turns"}``. The session's env is ``gymnasium.make(env_id,
  **{**server_kwargs, **kwargs})``: the request's allowed kwargs override the server's.
  503 when ``max_sessions`` sessions are open.
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

Sessions own their resources. A session's env, and with it the executor session of its
episode (a sandbox's files, a warm sandbox it holds, a container), is closed when the session
is deleted, when it expires (idle longer than ``session_ttl_s``) and when the server stops.
Session ids are 96 random bits: a client cannot reach a session it did not open. With
``close_executors=True`` (``serve-env`` sets it: the process serves this server only)
``stop()`` also closes the process's shared executors, so no warm sandbox outlives the
server.

With a ``token`` (``serve-env`` reads it from the variable ``--token-env`` names, default
``TURNRL_SERVER_TOKEN``; required when bound to an address other than loopback), every
request but ``GET /health`` must send ``Authorization: Bearer <token>``, else 401
(``turnrl.serving``).

Errors have the servers' one format (``turnrl.serving.errors``): ``{"error": {"message": "<what
was wrong and how to fix it>", "type", "code", "param"}}``. ``type`` is the env's exception
class where the env raised (with the exception's text in ``detail``), ``ResetNeeded`` for a
call before reset, else a kind by status. A bad request is always a 4xx and the server keeps
serving:

* 400: a body that is not a JSON object or fails its model (``param`` names the field; an
  optional field may be null, meaning absent), nests deeper than 64 levels or holds an
  integer of thousands of digits; a seed outside [0, 2**64); a kwarg or reset option value
  that is not a short plain value; kwargs or reset options the env rejects; a
  ``Content-Length`` that is not a non-negative integer.
* 401: a missing or wrong token.
* 403: a kwarg the server does not let clients choose (the message lists the ones it does and
  how the operator allows more).
* 404: an unknown path or session (a session idle longer than ``session_ttl_s`` is reaped
  and then unknown).
* 405: a method an endpoint does not take (PUT, PATCH, HEAD...).
* A request that does not arrive whole within ``read_timeout_s`` has its connection closed.
* 409: ``step`` or a player before the session's first successful ``reset``, or a call the
  env refused because its episode ended (``type`` and ``detail``: the env's exception).
* 411: a body sent with a ``Transfer-Encoding`` (chunked); 413: a body over ``MAX_BODY_BYTES``.
* 503: ``max_sessions`` sessions are open.
* 500: an exception inside the env on a valid request (``type`` and ``detail``: the
  exception's class name and text).

JSON values: observations and info are sent as JSON. Tuples become lists, numpy scalars
and arrays become numbers and lists; a dict key that is not a string, or a value JSON
cannot carry, is a 500 naming the info key. ``RemoteEnv`` turns every list back into a
tuple, recursively, so a tuple ``state_key`` comes back equal to the local one (and
hashable); an info value that was a list locally arrives as a tuple.
"""

from __future__ import annotations

import inspect
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

import gymnasium
import numpy as np
from gymnasium.envs.registration import load_env_creator

import turnrl.envs.registration as registration
from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict, Field

from turnrl.serving import DEFAULT_READ_TIMEOUT_S, APIError, HTTPService, JSONReply, service_app
from turnrl.tools.executors import close_executors

__all__ = ["DEFAULT_CLIENT_KWARGS", "EnvServer", "MAX_BODY_BYTES", "MAX_KWARG_CHARS", "MAX_KWARG_ITEMS", "PLAYERS",
           "REQUEST_SCHEMAS", "CreateSession", "Player", "Reset", "Step", "execution_setting", "to_json"]

log = logging.getLogger(__name__)

PLAYERS: tuple[str, ...] = ("expert", "weak", "random")
MAX_BODY_BYTES = 1 << 20
"""Largest request body accepted (1 MiB); larger ones get 413."""
BIT_GENERATORS: tuple[str, ...] = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
"""numpy bit generators an ``rng_state`` may name."""
DEFAULT_CLIENT_KWARGS: tuple[str, ...] = ("tool_parser", "max_turns")
"""Kwargs every client may pass (where the env's constructor takes them): the agent's tool-call
format, which ``RemoteEnv`` sends, and the episode's length."""
MAX_KWARG_CHARS = 256
"""Longest string a client may pass as a kwarg or reset option value (or list item)."""
MAX_KWARG_ITEMS = 32
"""Longest list a client may pass as a kwarg or reset option value."""
MAX_SEED = 2**64 - 1
"""Largest ``seed`` / ``rng_seed`` accepted."""

_EXECUTION_PARTS = ("executor", "sandbox", "docker", "bwrap", "run_as", "runas", "token", "secret", "password",
                    "credential", "limit", "timeout", "memory", "concurrency", "command", "url")
_EXECUTION_WORDS = frozenset({"env", "path", "dir", "file", "host", "port", "uri", "key", "auth", "uid", "gid", "user",
                              "cpu", "pool", "cmd", "exec", "shell", "proc", "process", "image", "module", "import",
                              "class", "target", "entry", "worker"})
_MAKE_KEYWORDS = frozenset(inspect.signature(gymnasium.make).parameters) - {"id", "kwargs"}


def execution_setting(name: str) -> bool:
    """True when the env kwarg ``name`` may control how or where code runs, what it can reach or
    which credentials it uses, so that only the server's operator may set it, never a client.

    Such a name holds one of ``_EXECUTION_PARTS`` (``executor``, ``bwrap``, ``token``, ``limit``,
    ``url``...), or one of ``_EXECUTION_WORDS`` (``env``, ``path``, ``dir``, ``key``, ``user``...;
    split at underscores, digits and case changes, plurals included), starts with ``_``, or is a
    keyword of ``gymnasium.make`` itself. The rule errs on the safe side: a task kwarg such as
    ``min_path`` is the server's to set too.
    """
    lowered = name.lower()
    words = re.findall(r"[a-z]+", re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower())
    return (name.startswith("_") or name in _MAKE_KEYWORDS or any(part in lowered for part in _EXECUTION_PARTS)
            or any(w in _EXECUTION_WORDS or w.removesuffix("s") in _EXECUTION_WORDS for w in words))


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CreateSession(_Body):
    """``POST /sessions``."""

    kwargs: dict[str, Any] | None = Field(
        None, description="task kwargs overriding the server's, only those GET /info lists as client_kwargs; each a "
                          "JSON scalar or a short list")


class Reset(_Body):
    """``POST /sessions/{id}/reset``."""

    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="reset seed in [0, 2**64); null: no reseeding")
    options: dict[str, Any] | None = Field(None, description='reset options, e.g. {"split": "test"}')


class Step(_Body):
    """``POST /sessions/{id}/step``."""

    action: str = Field(description="the assistant turn's text")


class Player(_Body):
    """``POST /sessions/{id}/player``: one scripted move; weak and random players need exactly one
    of ``rng_seed`` and ``rng_state``."""

    player: Literal["expert", "weak", "random"] = Field(description="which scripted player")
    rng_seed: int | None = Field(None, ge=0, le=MAX_SEED, description="seed of the session's player generator")
    rng_state: dict[str, Any] | None = Field(None, description="a numpy rng.bit_generator.state")


REQUEST_SCHEMAS: dict[str, dict] = {
    "POST /sessions": CreateSession.model_json_schema(),
    "POST /sessions/{id}/reset": Reset.model_json_schema(),
    "POST /sessions/{id}/step": Step.model_json_schema(),
    "POST /sessions/{id}/player": Player.model_json_schema(),
}
"""JSON schema of every request body, keyed by ``"METHOD /path"`` (also served at ``/info``)."""

_ENDPOINTS = ("GET /health, GET /info, POST /sessions, POST /sessions/{id}/reset|step|player, "
              "DELETE /sessions/{id}")


@dataclass
class _Session:
    env: gymnasium.Env
    kwargs: dict
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    rng: np.random.Generator | None = None
    rng_seed: int | None = None
    episode: Literal["none", "running", "ended"] = "none"
    """``none``: not reset yet (or the last reset failed); ``ended``: the last step ended the episode."""
    closed: bool = False


class EnvServer(HTTPService):
    """Serve ``env_id`` over HTTP (what a client may choose, the endpoints and the errors are in
    the module docstring).

    Use as a context manager, or ``start()`` then ``stop()``. The env is made once at
    construction to fail early (with the env's own message) on a bad id or kwargs.

    Args:
        env_id: A registered gymnasium id (``turnrl/...`` ids are registered on import).
        env_kwargs: Constructor kwargs of every session's env, execution settings
            (``executors``, ``executor_options``) included; a session may override only the
            ``client_kwargs``.
        host: Interface to bind (``127.0.0.1``: this machine only; ``0.0.0.0``: all).
        port: TCP port; 0 picks a free one (read it from ``url`` after ``start()``).
        session_ttl_s: A session idle for longer than this many seconds is closed.
        max_sessions: Most sessions open at once; creating one more gets HTTP 503.
        token: The bearer token every request must send (else 401); required unless ``host``
            is loopback. None: no token (loopback only).
        client_kwargs: Task kwargs clients may pass besides ``DEFAULT_CLIENT_KWARGS`` and the
            env class's own ``client_kwargs``.
        read_timeout_s: Seconds a connection may take to deliver its next whole request
            (idle keep-alive time included); then it is closed.
        close_executors: Whether ``stop()`` also closes every shared executor of this process
            (``turnrl.tools.executors.close_executors``: warm sandboxes, containers). Set it
            where the process serves this server only, as ``serve-env`` does; leave it off
            where other code of the process uses executors.

    Raises:
        ValueError: On an unregistered id, kwargs the env rejects, bad limits, a
            non-loopback ``host`` without a token, or a client kwarg that is an execution
            setting (``execution_setting``) or that the env's constructor does not take.
    """

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any] | None = None, host: str = "127.0.0.1",
                 port: int = 0, session_ttl_s: float = 600, max_sessions: int = 1024, *,
                 token: str | None = None, client_kwargs: Iterable[str] = (),
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, close_executors: bool = False) -> None:
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
        if isinstance(client_kwargs, str):
            raise ValueError(f"client_kwargs must be a list of names, got the string {client_kwargs!r}")
        super().__init__(host, port, "env-server", token=token, read_timeout_s=read_timeout_s)
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.session_ttl_s, self.max_sessions = float(session_ttl_s), max_sessions
        self.close_executors = close_executors
        self.client_kwargs: frozenset[str] = _allowed_client_kwargs(env_id, client_kwargs)
        """The kwargs a client may pass (``GET /info``)."""
        try:
            probe = gymnasium.make(env_id, disable_env_checker=True, **self.env_kwargs)
        except Exception as e:
            raise ValueError(f"gymnasium.make({env_id!r}, **{self.env_kwargs}) raised {type(e).__name__}: {e}") from e
        try:
            self._description = _describe_env(probe)
        except APIError as e:
            raise ValueError(e.message) from e
        finally:
            probe.close()
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    # --------------------------------------------------------------- running
    def stop(self) -> None:
        """Stop serving, close every session's env (ending its executor session) and, with
        ``close_executors``, the process's shared executors (idempotent)."""
        super().stop()
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            _close_session(s, wait_s=5.0)
        if self.close_executors:

            close_executors()

    def build_app(self) -> FastAPI:
        return _routes(self)

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
            _close_session(s)
        if closed:
            log.info("reaped %d idle session(s)", len(closed))
        return len(closed)

    def _reap_loop(self) -> None:
        interval = min(max(self.session_ttl_s / 4, 0.05), 30.0)
        while not self._stopping.wait(interval):
            self.reap()

    # -------------------------------------------------------------- handlers
    def info(self) -> dict:
        """The ``GET /info`` reply."""
        return {"env_id": self.env_id, "kwargs": _jsonable(_task_kwargs(self.env_kwargs), "kwargs"),
                "client_kwargs": sorted(self.client_kwargs), **self._description,
                "session_ttl_s": self.session_ttl_s, "max_sessions": self.max_sessions,
                "sessions": self.num_sessions, "request_schemas": REQUEST_SCHEMAS}

    def create_session(self, body: CreateSession) -> dict:
        """``POST /sessions``: check the client's kwargs, make the session's env and return its description."""
        client = body.kwargs or {}
        self._check_client_kwargs(client)
        self.reap()
        with self._lock:
            full = len(self._sessions) >= self.max_sessions
        if full:
            raise self._full()
        kwargs = {**self.env_kwargs, **client}
        try:
            env = gymnasium.make(self.env_id, disable_env_checker=True, **kwargs)
        except Exception as e:
            if not client:  # the server's own kwargs made the probe env: this is no fault of the request
                raise _env_error("making the env", e) from e
            raise APIError(HTTPStatus.BAD_REQUEST, f"the env refused the kwargs {client}: {type(e).__name__}: {e}; "
                                                    "pass values the env's constructor accepts",
                            type=type(e).__name__, detail=str(e)) from e
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
        return {"session_id": sid, "env_id": self.env_id, "kwargs": _jsonable(_task_kwargs(kwargs), "kwargs"),
                **description}

    def _check_client_kwargs(self, client: Mapping[str, Any]) -> None:
        """Raise 403 for a kwarg clients may not choose, 400 for a value that is not short and plain."""
        refused = sorted(set(client) - self.client_kwargs)
        if refused:
            execution = [name for name in refused if execution_setting(name)]
            why = (f"{execution} control how or where code runs, what it reaches or which credentials it uses: only "
                   f"the server's operator sets them (serve-env --kwarg NAME=VALUE). " if execution else "")
            raise APIError(HTTPStatus.FORBIDDEN,
                            f"this server does not let clients choose the kwargs {refused}. {why}A client may pass "
                            f"only {sorted(self.client_kwargs)} (GET /info: client_kwargs); the server's operator "
                            f"allows more task kwargs with `serve-env {self.env_id} --client-kwarg NAME` "
                            "(EnvServer(client_kwargs=[...]))")
        for name, value in client.items():
            problem = _value_problem(value)
            if problem is not None:
                raise APIError(HTTPStatus.BAD_REQUEST, f"kwargs[{name!r}] is {problem}; {_VALUE_RULE}")

    def _full(self) -> APIError:
        return APIError(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"the server already holds max_sessions={self.max_sessions} sessions; close sessions you no "
            f"longer need (DELETE /sessions/{{id}}, RemoteEnv.close()), wait for idle ones to expire "
            f"(session_ttl_s={self.session_ttl_s:g}), or restart the server with a larger --max-sessions")

    def delete_session(self, sid: str) -> dict:
        """``DELETE /sessions/{id}``: close the session's env (waiting for a call in flight)."""
        with self._lock:
            session = self._sessions.pop(sid, None)
        if session is None:
            raise _unknown_session(sid, self.session_ttl_s)
        _close_session(session)
        return {"deleted": sid}

    def session_call(self, sid: str, verb: str, body: BaseModel) -> dict:
        """``POST /sessions/{id}/{verb}`` for ``verb`` in reset, step, player."""
        with self._lock:
            session = self._sessions.get(sid)
            if session is not None:
                session.last_used = time.monotonic()
        if session is None:
            raise _unknown_session(sid, self.session_ttl_s)
        with session.lock:
            if session.closed:  # deleted or reaped while this call waited for the lock
                raise _unknown_session(sid, self.session_ttl_s)
            try:
                return _VERBS[verb](session, body)
            finally:
                session.last_used = time.monotonic()


def _allowed_client_kwargs(env_id: str, extra: Iterable[str]) -> frozenset[str]:
    """The kwargs clients of ``env_id`` may pass: ``DEFAULT_CLIENT_KWARGS`` that its constructor (the
    id's entry point) takes, the names the entry point lists in ``client_kwargs``, and ``extra``.

    Raises:
        ValueError: For a listed or ``extra`` name that is no identifier, is an execution setting
            (``execution_setting``), or is not a parameter of the constructor.
    """
    creator = gymnasium.spec(env_id).entry_point
    try:
        creator = load_env_creator(creator) if isinstance(creator, str) else creator
        params = inspect.signature(creator).parameters
    except Exception as e:
        raise ValueError(f"cannot read the constructor of {env_id} ({gymnasium.spec(env_id).entry_point}): "
                         f"{type(e).__name__}: {e}") from e
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    named = [(name, f"{getattr(creator, '__name__', env_id)}.client_kwargs")
             for name in getattr(creator, "client_kwargs", ())]
    named += [(name, "client_kwargs (serve-env --client-kwarg)") for name in extra]
    for name, source in named:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{source} names {name!r}, which is no kwarg name")
        if execution_setting(name):
            raise ValueError(f"{source} names {name!r}, which clients may never choose: a kwarg named like that may "
                             "control how or where code runs, what it reaches or which credentials it uses "
                             "(executors, executor_options, paths, URLs, tokens, limits, run_as, bwrap, env...). "
                             f"Set it on the server instead: serve-env {env_id} --kwarg {name}=VALUE")
        if not takes_any and name not in accepted:
            raise ValueError(f"{source} names {name!r}, which the constructor of {env_id} does not take; its "
                             f"kwargs: {sorted(accepted)}")
    defaults = [name for name in DEFAULT_CLIENT_KWARGS if takes_any or name in accepted]
    return frozenset([*defaults, *(name for name, _ in named)])


_VALUE_RULE = (f"send a JSON string (at most {MAX_KWARG_CHARS} characters), an integer within 64 bits, a finite "
               f"number, a boolean, null, or a list of at most {MAX_KWARG_ITEMS} of those")


def _value_problem(value: Any) -> str | None:
    """What makes ``value`` unfit as a client's kwarg or reset option value (None: fit)."""
    if isinstance(value, list):
        if len(value) > MAX_KWARG_ITEMS:
            return f"a list of {len(value)} items"
        problems = [p for p in map(_scalar_problem, value) if p is not None]
        return f"a list holding {problems[0]}" if problems else None
    return _scalar_problem(value)


def _scalar_problem(value: Any) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -2**63 <= value < 2**64 else "an integer beyond 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} (not a finite number)"
    if isinstance(value, str):
        return None if len(value) <= MAX_KWARG_CHARS else f"a string of {len(value)} characters"
    return f"a JSON {'object' if isinstance(value, dict) else type(value).__name__}"


def _task_kwargs(kwargs: Mapping[str, Any]) -> dict:
    """``kwargs`` without execution settings (which replies never show)."""
    return {k: v for k, v in kwargs.items() if not execution_setting(k)}


# -------------------------------------------------------------- the verbs
def _reset(session: _Session, body: Reset) -> dict:
    seed, options = body.seed, body.options
    for key, value in (options or {}).items():
        problem = _value_problem(value)
        if problem is not None:
            raise APIError(HTTPStatus.BAD_REQUEST, f"options[{key!r}] is {problem}; {_VALUE_RULE}")
    session.episode = "none"
    try:
        obs, info = session.env.reset(seed=seed, options=options)
    except (ValueError, TypeError, KeyError) as e:
        if not options:
            raise _env_error("reset", e) from e
        raise APIError(HTTPStatus.BAD_REQUEST, f"the env refused the reset options {options}: {type(e).__name__}: "
                                                f"{e}", type=type(e).__name__, detail=str(e)) from e
    except Exception as e:
        raise _env_error("reset", e) from e
    session.episode = "running"
    return {"observation": _jsonable(obs, "observation"), "info": _jsonable(info, "info")}


def _step(session: _Session, body: Step) -> dict:
    _require_episode(session, "step")
    try:
        obs, reward, terminated, truncated, info = session.env.step(body.action)
    except Exception as e:
        raise _env_error("step", e, session) from e
    if terminated or truncated:
        session.episode = "ended"
    return {"observation": _jsonable(obs, "observation"), "reward": float(reward),
            "terminated": bool(terminated), "truncated": bool(truncated), "info": _jsonable(info, "info")}


def _player(session: _Session, body: Player) -> dict:
    player = body.player
    has_seed, has_state = body.rng_seed is not None, body.rng_state is not None
    if player == "expert":
        if has_seed or has_state:
            raise APIError(HTTPStatus.BAD_REQUEST, "the expert player takes no randomness; "
                                                     "drop 'rng_seed' and 'rng_state'")
        _require_episode(session, "the expert player")
        return {"action": _play(session, "expert_action"), "rng_state": None}
    if has_seed == has_state:
        raise APIError(HTTPStatus.BAD_REQUEST,
                         f"the {player} player needs exactly one of 'rng_seed' (an int: the session keeps "
                         "a generator seeded with it) or 'rng_state' (a numpy rng.bit_generator.state)")
    if has_state:
        rng = _generator_from_state(body.rng_state)
    _require_episode(session, f"the {player} player")
    if not has_state:
        if session.rng is None or session.rng_seed != body.rng_seed:
            session.rng, session.rng_seed = np.random.default_rng(body.rng_seed), body.rng_seed
        rng = session.rng
    method = "weak_expert_action" if player == "weak" else "random_action"
    action = _play(session, method, rng)
    return {"action": action, "rng_state": to_json(rng.bit_generator.state, "rng_state")}


def _require_episode(session: _Session, what: str) -> None:
    """409 unless the session's env was reset (successfully) since it was made."""
    if session.episode == "none":
        raise APIError(HTTPStatus.CONFLICT, f"{what} needs an episode: POST /sessions/{{id}}/reset first (the "
                                              "session was never reset, or its last reset failed)", type="ResetNeeded",
                        detail=f"{what} called before reset()")


def _play(session: _Session, method: str, *args: Any) -> str:
    base = session.env.unwrapped
    fn = getattr(base, method, None)
    if fn is None:
        raise APIError(HTTPStatus.BAD_REQUEST, f"{type(base).__name__} does not define {method}(), so the server has "
                                                 "no such player for it", type="NotImplementedError",
                        detail=f"{type(base).__name__} does not define {method}()")
    try:
        action = fn(*args)
    except NotImplementedError as e:  # the env has no such player (MultiTurnEnv.random_action's default)
        raise APIError(HTTPStatus.BAD_REQUEST, f"the env has no {method}(): {e}", type="NotImplementedError",
                        message=str(e)) from e
    except Exception as e:
        raise _env_error(method, e, session) from e
    if not isinstance(action, str):
        raise _env_error(method, TypeError(f"{method}() returned {type(action).__name__}, not str"))
    return action


def _generator_from_state(state: dict) -> np.random.Generator:
    name = state.get("bit_generator")
    if name not in BIT_GENERATORS:
        raise APIError(HTTPStatus.BAD_REQUEST, f"rng_state['bit_generator'] must be one of {list(BIT_GENERATORS)}"
                                                 f", got {str(name)[:40]!r}; send rng.bit_generator.state of a numpy "
                                                 "Generator")
    bit_generator = getattr(np.random, name)()
    try:
        bit_generator.state = state
    except Exception as e:  # numpy's checks: TypeError, ValueError, KeyError, OverflowError...
        raise APIError(HTTPStatus.BAD_REQUEST, f"rng_state is not a valid {name} state ({type(e).__name__}: "
                                                 f"{str(e)[:200]}); send rng.bit_generator.state unchanged") from e
    return np.random.Generator(bit_generator)


_VERBS: dict[str, Callable[[_Session, Any], dict]] = {"reset": _reset, "step": _step, "player": _player}


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
        raise APIError(HTTPStatus.INTERNAL_SERVER_ERROR, f"the env's {path} cannot be sent as JSON: {e}",
                         type="TypeError", detail=str(e)) from e


def _describe_env(env: gymnasium.Env) -> dict:
    base = env.unwrapped
    tools = [t.schema() for t in getattr(base, "tools", ())]
    max_turns = getattr(base, "max_turns", None)
    return {"tools": _jsonable(tools, "tools"), "max_turns": None if max_turns is None else int(max_turns)}


def _env_error(what: str, e: BaseException, session: _Session | None = None) -> APIError:
    """The reply to an exception the env raised: 409 when the session's episode had ended (the
    env refused a call after its end), else 500 (a failure of the env on a valid request)."""
    if isinstance(e, APIError):
        return e
    if session is not None and session.episode == "ended":
        return APIError(HTTPStatus.CONFLICT, f"the episode ended, and the env raised {type(e).__name__} during "
                                               f"{what}: {e}; POST /sessions/{{id}}/reset to start a new one",
                         type=type(e).__name__, detail=str(e))
    return APIError(HTTPStatus.INTERNAL_SERVER_ERROR, f"the env raised {type(e).__name__} during {what}: {e}",
                     type=type(e).__name__, detail=str(e))


def _unknown_session(sid: str, ttl: float) -> APIError:
    return APIError(HTTPStatus.NOT_FOUND,
                      f"unknown session {sid[:64]!r}: it was deleted, or it expired after {ttl:g} s idle "
                      "(session_ttl_s), or the server restarted; open a new one with POST /sessions")


def _close_quietly(env: gymnasium.Env) -> None:
    try:
        env.close()
    except Exception as e:  # a failing close must not take the server down
        log.warning("env.close() raised %r", e)


def _close_session(session: _Session, wait_s: float | None = None) -> None:
    """Close the session's env (which ends its executor session: sandbox files, a warm sandbox,
    a container) once a call in flight has finished (at most ``wait_s`` seconds; None: no bound)."""
    got = session.lock.acquire(timeout=-1 if wait_s is None else wait_s)
    try:
        session.closed = True
        _close_quietly(session.env)
    finally:
        if got:
            session.lock.release()


def _routes(server: EnvServer) -> FastAPI:
    """The env server's app: ``service_app`` plus the endpoints of the module docstring."""
    app = service_app(title="env server", token=server._token, max_body_bytes=MAX_BODY_BYTES, endpoints=_ENDPOINTS,
                      logger=log)

    # every route runs the env in a worker thread (env calls block); known() runs on the loop
    @app.get("/info")
    async def info() -> JSONReply:
        return JSONReply(await server.blocking(server.info))

    @app.post("/sessions")
    async def create_session(body: CreateSession) -> JSONReply:
        return JSONReply(await server.blocking(server.create_session, body))

    @app.delete("/sessions/{sid}")
    async def delete_session(sid: str) -> JSONReply:
        return JSONReply(await server.blocking(server.delete_session, sid))

    async def known(sid: str) -> str:
        """The session id, or 404 before the body is read: an unknown session is the answer to
        any body sent to it."""
        with server._lock:
            if sid in server._sessions:
                return sid
        raise _unknown_session(sid, server.session_ttl_s)

    @app.post("/sessions/{sid}/reset")
    async def reset(body: Reset, sid: str = Depends(known)) -> JSONReply:
        return JSONReply(await server.blocking(server.session_call, sid, "reset", body))

    @app.post("/sessions/{sid}/step")
    async def step(body: Step, sid: str = Depends(known)) -> JSONReply:
        return JSONReply(await server.blocking(server.session_call, sid, "step", body))

    @app.post("/sessions/{sid}/player")
    async def player(body: Player, sid: str = Depends(known)) -> JSONReply:
        return JSONReply(await server.blocking(server.session_call, sid, "player", body))

    return app

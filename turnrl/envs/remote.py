"""``RemoteEnv``: a gymnasium env whose episodes run on an ``EnvServer`` over HTTP.

Start a server with ``python -m turnrl serve-env turnrl/GuessNumber-v0 --port 8000``, then
``RemoteEnv("http://127.0.0.1:8000")`` behaves like the local env: the same seed and
options give the same transcript (observations, rewards, flags and info), and the scripted
players (``expert_action``, ``weak_expert_action(rng)``, ``random_action(rng)``) work, so
warm starts, tokenizer corpora, ``turnrl.envs.check`` and the baselines run through it.
In a training config, set ``env.url`` (see ``turnrl/conf/env/remote.yaml``).

Contract, and where it differs from a local env:

* A session (the server's env instance) is opened on the first ``reset`` (or the first
  use of ``max_turns`` / ``tools``, which describe the session's env) and deleted by
  ``close()``. A session idle longer than the server's TTL is reaped; the next ``reset``
  then opens a new one transparently, while ``step`` or a player call on a reaped session
  raises ``RemoteEnvError`` (the episode is gone). A dropped env that was never closed
  leaves its session to the TTL.
* Values travel as JSON and every list comes back as a tuple (recursively), so a tuple
  ``state_key`` equals, and hashes like, the local one; an info value that is a list
  locally arrives as a tuple, except the reset ``info["tools"]`` (JSON schemas for the chat
  template), which arrives as sent: a list of dicts, equal to the local one.
* Weak and random players: the generator's state (``rng.bit_generator.state``) is sent
  with the call and the state after the server's draws is stored back into ``rng``, so
  ``rng`` makes exactly the draws, and the player exactly the moves, of a local player
  given the same generator, over any sequence of calls and episodes.
* ``np_random`` of this object is seeded by ``reset(seed=...)`` like a local env's (the
  gymnasium checker inspects it) but the task is drawn by the server's env.
* Failures: a connection error or timeout is retried ``retries`` times with exponential
  backoff (``backoff_s * 2**attempt``) on idempotent requests only: ``/info``, session
  creation (a retried creation may leave an orphan session for the TTL to reap), ``reset``
  with a seed, and the players (idempotent since the rng state is sent). ``step`` is never
  retried: the server may have applied it. ``close`` tries once (a dead server must not
  stall shutdown; the TTL reaps what it leaves). A final failure raises
  ``RemoteEnvError`` naming the URL and the request. An exception inside the remote env
  comes back as ``RemoteEnvError`` whose ``remote_type`` is the exception's class name;
  for ``ValueError``, ``TypeError`` and ``NotImplementedError`` it is also an instance
  of that class (so ``baselines`` sees a missing ``random_action`` as it would locally).
* Tokens: the bearer token is read once, at construction, from the environment variable
  ``token_env`` names (default ``TURNRL_SERVER_TOKEN``; unset or empty: none is sent), so a
  config holds the variable's name, never the secret. A 401 (no token, or the wrong one)
  raises ``RemoteEnvTokenError`` saying which variable to set. It is also a
  ``turnrl.serving.TokenRefusedError``, which the rollout collector re-raises instead of
  ending one episode with ``env_error``: every episode would be refused alike. Since
  ``/info`` needs the token too, a wrong one already fails the constructor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, ClassVar

import gymnasium
import httpx
import numpy as np

from turnrl.envs.messages import action_space, observation_space
from turnrl.envs.server import to_json
from turnrl.serving.tokens import DEFAULT_TOKEN_ENV, TokenRefusedError, auth_headers, refused_message
from turnrl.tools import Tool

__all__ = ["RemoteEnv", "RemoteEnvError", "RemoteEnvTokenError", "from_json"]

log = logging.getLogger(__name__)


class RemoteEnvError(RuntimeError):
    """A request to an env server failed, or the remote env raised.

    Attributes:
        url: The server's URL.
        status: The HTTP status of the reply (None when no reply came).
        remote_type: Class name of the exception the remote env raised (None otherwise).
    """

    def __init__(self, message: str, *, url: str, status: int | None = None,
                 remote_type: str | None = None) -> None:
        super().__init__(message)
        self.url, self.status, self.remote_type = url, status, remote_type


class RemoteEnvTokenError(RemoteEnvError, TokenRefusedError):
    """The env server refused this client's token (HTTP 401): set the variable ``token_env`` names."""


class _SessionGone(RemoteEnvError):
    """The server does not know the session (deleted, reaped after the TTL, or restarted)."""


_TYPED_ERRORS: dict[str, type[RemoteEnvError]] = {
    base.__name__: type(f"Remote{base.__name__}", (RemoteEnvError, base), {
        "__doc__": f"A ``{base.__name__}`` raised by the remote env (also a ``RemoteEnvError``)."})
    for base in (ValueError, TypeError, NotImplementedError)
}


def from_json(value: Any) -> Any:
    """Undo ``turnrl.envs.server.to_json`` on the client side: lists become tuples, recursively."""
    if isinstance(value, list):
        return tuple(from_json(v) for v in value)
    if isinstance(value, dict):
        return {k: from_json(v) for k, v in value.items()}
    return value


class RemoteEnv(gymnasium.Env[tuple, str]):
    """A client of ``turnrl serve-env``: the served env, stepped over HTTP.

    Observation and action spaces are those of ``MultiTurnEnv``. See the module docstring
    for sessions, JSON values, the players and the retry policy.

    Args:
        url: The server's base URL, e.g. ``http://127.0.0.1:8000``.
        env_id: When given, the id the server must serve (checked against ``/info``).
        timeout_s: Timeout of every request, in seconds.
        retries: Extra attempts of an idempotent request after a connection error or timeout.
        backoff_s: Sleep before the first retry; doubled before each next one.
        token_env: The environment variable holding the server's bearer token (read here;
            unset or empty, or None: no token is sent).
        **env_kwargs: Task kwargs of the session's env, overriding the server's: only those the
            server allows its clients (``tool_parser``, ``max_turns``, the env's ``client_kwargs``
            and the operator's ``--client-kwarg``; ``GET /info`` lists them); another is refused
            with HTTP 403 at the first reset.

    Raises:
        ValueError: On bad arguments, a malformed token in ``token_env``, or when the server
            serves another env than ``env_id``.
        RemoteEnvTokenError: When the server refuses the token.
        RemoteEnvError: When ``/info`` cannot be fetched.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, url: str, env_id: str | None = None, *, timeout_s: float = 30, retries: int = 2,
                 backoff_s: float = 0.2, token_env: str | None = DEFAULT_TOKEN_ENV, **env_kwargs: Any) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL such as 'http://127.0.0.1:8000', got {url!r}")
        if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        if not isinstance(backoff_s, (int, float)) or backoff_s < 0:
            raise ValueError(f"backoff_s must be a number >= 0, got {backoff_s!r}")
        self.url = url.rstrip("/")
        self.retries, self.backoff_s = retries, float(backoff_s)
        self.token_env = token_env
        self.env_kwargs = to_json(dict(env_kwargs), "env_kwargs")
        self.observation_space = observation_space()
        self.action_space = action_space()
        headers = auth_headers(token_env)
        self._sends_token = bool(headers)
        self._client = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers)
        self._session: dict | None = None
        self._closed = False
        try:
            self.server_info: dict = self._request("GET", "/info", retry=True, what="fetching the env's info")
        except BaseException:
            self._client.close()
            raise
        served = self.server_info.get("env_id")
        if env_id is not None and served != env_id:
            self._client.close()
            raise ValueError(f"the server at {self.url} serves {served!r}, not env_id={env_id!r}; "
                             f"connect to the right server or pass env_id={served!r}")
        self.env_id: str = served

    # ----------------------------------------------------------- the session
    @property
    def session_id(self) -> str | None:
        """The server's id of this env's session (None before it is opened)."""
        return None if self._session is None else self._session["session_id"]

    @property
    def max_turns(self) -> int | None:
        """``max_turns`` of the session's env (opens the session if needed)."""
        return self._ensure_session()["max_turns"]

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The session env's tools, rebuilt from their schemas: for display and argument
        validation only (calling one raises; the model calls tools through ``step``)."""
        return tuple(_display_tool(schema, self.url) for schema in self._ensure_session()["tools"])

    def _ensure_session(self) -> dict:
        if self._session is None:
            self._session = self._request("POST", "/sessions", {"kwargs": self.env_kwargs}, retry=True,
                                          what="opening a session")
        return self._session

    def _session_path(self, verb: str) -> str:
        return f"/sessions/{self._ensure_session()['session_id']}/{verb}"

    # ------------------------------------------------------------- the loop
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[tuple, dict]:
        """Start an episode on the server; same arguments and result as the local env's ``reset``."""
        super().reset(seed=seed)
        body = {"seed": None if seed is None else int(seed), "options": to_json(options, "options")}
        try:
            reply = self._request("POST", self._session_path("reset"), body, retry=seed is not None, what="reset")
        except _SessionGone:  # reaped after the TTL: a reset starts afresh anyway
            log.info("session %s at %s expired; opening a new one", self.session_id, self.url)
            self._session = None
            reply = self._request("POST", self._session_path("reset"), body, retry=seed is not None, what="reset")
        info = from_json(reply["info"])
        if isinstance(reply["info"].get("tools"), list):  # JSON schemas, for the chat template: as sent
            info["tools"] = reply["info"]["tools"]
        return from_json(reply["observation"]), info

    def step(self, action: str) -> tuple[tuple, float, bool, bool, dict]:
        """Play one turn on the server (never retried); the local env's ``step`` result."""
        if not isinstance(action, str):
            raise TypeError(f"action must be the assistant turn as str, got {type(action).__name__}")
        reply = self._request("POST", self._session_path("step"), {"action": action}, retry=False, what="step")
        return (from_json(reply["observation"]), float(reply["reward"]), bool(reply["terminated"]),
                bool(reply["truncated"]), from_json(reply["info"]))

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[tuple, dict]:
        """``reset`` for a caller on its own event loop (runs in a worker thread)."""
        return await asyncio.to_thread(self.reset, seed=seed, options=options)

    async def astep(self, action: str) -> tuple[tuple, float, bool, bool, dict]:
        """``step`` for a caller on its own event loop: other awaits overlap with the request."""
        return await asyncio.to_thread(self.step, action)

    def close(self) -> None:
        """Delete the session (a failure is logged, not raised) and close the connection."""
        if self._closed:
            return
        self._closed = True
        if self._session is not None:
            try:
                self._request("DELETE", f"/sessions/{self.session_id}", retry=False, what="closing the session")
            except RemoteEnvError as e:
                log.warning("could not delete session %s at %s: %s", self.session_id, self.url, e)
            self._session = None
        self._client.close()

    # ------------------------------------------------------------- players
    def expert_action(self) -> str:
        """The remote env's scripted expert move for the current state."""
        return self._play({"player": "expert"})

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """The remote env's weak player; ``rng`` advances exactly as a local call would advance it."""
        return self._play({"player": "weak"}, rng)

    def random_action(self, rng: np.random.Generator) -> str:
        """The remote env's random player; ``rng`` advances exactly as a local call would advance it."""
        return self._play({"player": "random"}, rng)

    def _play(self, body: dict, rng: np.random.Generator | None = None) -> str:
        if rng is not None:
            if not isinstance(rng, np.random.Generator):
                raise TypeError(f"rng must be a numpy Generator (np.random.default_rng(seed)), got "
                                f"{type(rng).__name__}")
            body = {**body, "rng_state": to_json(rng.bit_generator.state, "rng_state")}
        reply = self._request("POST", self._session_path("player"), body, retry=True, what=f"{body['player']} player")
        if rng is not None:
            rng.bit_generator.state = _state_from_json(reply["rng_state"])
        return reply["action"]

    # -------------------------------------------------------------- requests
    def _request(self, method: str, path: str, body: dict | None = None, *, retry: bool, what: str) -> dict:
        """Send one request; retry transport failures when ``retry``; decode the JSON reply."""
        if self._closed and method != "DELETE":
            raise RemoteEnvError(f"{what}: this RemoteEnv of {self.url} is closed; make a new one", url=self.url)
        attempts = 1 + (self.retries if retry else 0)
        for attempt in range(attempts):
            try:
                response = self._client.request(method, path, json=body)
                break
            except httpx.TransportError as e:
                if attempt + 1 < attempts:
                    time.sleep(self.backoff_s * 2**attempt)
                    continue
                note = "" if retry else f" ({what} is not retried: the server may have applied it)"
                raise RemoteEnvError(
                    f"{method} {self.url}{path} ({what}) failed after {attempts} attempt(s): {type(e).__name__}: "
                    f"{e or 'no detail'}{note}; is the env server (turnrl serve-env) running at {self.url}?",
                    url=self.url) from e
        return self._decode(response, method, path, what)

    def _decode(self, response: httpx.Response, method: str, path: str, what: str) -> dict:
        if response.status_code == 401:
            raise RemoteEnvTokenError(f"{method} {self.url}{path} ({what}): HTTP 401: "
                                      f"{refused_message(self.url, self.token_env, self._sends_token)}", url=self.url,
                                      status=401)
        try:
            reply = response.json()
        except ValueError:
            reply = None
        where = f"{method} {self.url}{path} ({what})"
        if not isinstance(reply, dict):
            raise RemoteEnvError(f"{where}: HTTP {response.status_code} with a non-JSON reply "
                                 f"{response.text[:200]!r}; is {self.url} a turnrl env server?",
                                 url=self.url, status=response.status_code)
        if response.status_code == 200:
            return reply
        error = reply.get("error")
        error = error if isinstance(error, dict) else {"message": str(reply)[:500]}
        message = f"{where}: HTTP {response.status_code}: {error.get('message', error)}"
        remote_type = error.get("type")
        if response.status_code == 404 and path.startswith("/sessions/"):
            raise _SessionGone(message, url=self.url, status=404)
        cls = _TYPED_ERRORS.get(remote_type, RemoteEnvError)
        raise cls(message, url=self.url, status=response.status_code, remote_type=remote_type)

    def __repr__(self) -> str:
        return f"RemoteEnv({self.url!r}, env_id={getattr(self, 'env_id', None)!r}, session={self.session_id!r})"


def _state_from_json(state: dict) -> dict:
    """A bit-generator state as numpy takes it (MT19937 keeps its key as an array)."""
    state = dict(state)
    inner = state.get("state")
    if isinstance(inner, dict) and isinstance(inner.get("key"), list):
        state["state"] = {**inner, "key": np.asarray(inner["key"], dtype=np.uint32)}
    return state


def _display_tool(schema: dict, url: str) -> Tool:
    fn = schema.get("function", {})
    name = fn.get("name", "?")

    def runs_remotely(**arguments: Any) -> Any:
        raise RuntimeError(f"tool {name!r} runs on the env server at {url}; the model calls it through step()")

    runs_remotely.__name__ = name
    parameters = fn.get("parameters", {"type": "object", "properties": {}, "required": []})
    return Tool(name=name, description=fn.get("description", ""), parameters=parameters, fn=runs_remotely)

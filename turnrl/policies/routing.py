"""``RoutedPolicy``: several policy backends (e.g. one ``OpenAIPolicy`` per inference server)
behind the one ``generate(prompts, params)`` interface.

Each ``generate`` batch is split row by row across the backends, every backend's share runs as
one ``generate`` call of its own (all shares concurrently, in threads), and the generations
come back in row order. A backend that fails with a connection-level error (``ConnectionError``,
e.g. ``PolicyUnavailableError``; ``TimeoutError``; or ``PolicyResponseError``) has its
rows sent again to the other backends, and is left out of routing for ``cooldown_s`` seconds;
any other exception (e.g. a 4xx ``PolicyRequestError``: every server would refuse the same
request) is raised at once. When every backend failed, a ``ConnectionError`` names each one's
last error.

``RoutedPolicy`` is a ``RolloutPolicy`` (``turnrl.policies.protocol``) whose members delegate to
the backends: ``load_weights`` / ``sync_from`` go to every backend, ``rng_state`` holds every
backend's state and the routing cursor (so a restored state repeats the same row-to-backend
split and samples, as long as no backend fails), ``close`` closes every backend;
``token_exact`` is True when every backend is, ``needs_weight_push`` when any backend needs
one. A backend without one of these members (e.g. an ``OpenAIPolicy``, which ``ServedPolicy``
routes over and pushes weights to itself) makes that member raise a ``TypeError`` naming it;
its ``rng_state`` is None (it is not seeded here).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import torch

from turnrl.policies.http import PolicyResponseError
from turnrl.policies.sampling import Generation, SamplingParams
from turnrl.policies.sessions import SessionMap

__all__ = ["BackendStats", "RoutedPolicy", "STRATEGIES"]

Strategy = Literal["sticky", "round_robin", "least_loaded"]
STRATEGIES: tuple[str, ...] = ("sticky", "round_robin", "least_loaded")
BACKEND_FAILURES: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, PolicyResponseError)
"""Exceptions that mean "this backend is down": its rows are retried on another backend."""


@dataclass
class BackendStats:
    """What one backend did so far."""

    rows: int = 0  # rows it generated
    failures: int = 0  # calls that failed with a backend failure
    in_flight: int = 0  # rows it is generating now
    routed: int = 0  # rows sent to it (a retried row counts again)
    sticky: int = 0  # of them, rows sent because it sampled their prefix (strategy "sticky")
    last_error: str | None = None  # the last failure, as text
    down_until: float = 0.0  # time.monotonic() before which routing skips it


class RoutedPolicy:
    """Spread each batch over several policies (see the module docstring).

    Args:
        policies: the backends, each with ``generate(prompts, params) -> list[Generation]``.
        strategy: ``"round_robin"``: row after row to the next backend (the rotation goes on
            across calls); ``"least_loaded"``: each row to the backend with the fewest rows in
            flight (counting every caller of this policy and the rows already assigned);
            ``"sticky"``: session-affine least-loaded: a row whose prompt extends a sequence a
            backend sampled (the same episode's earlier turn: ``turnrl.policies.sessions``) goes
            to that backend, where its prefix is cached; a new one (or one whose backend is
            failing) goes to the least loaded. ``stats[i].sticky`` counts the rows that stayed.
        cooldown_s: seconds a failed backend is left out of routing (when every backend is
            cooling down, all are tried again).

    Raises:
        ValueError: On no policies, an unknown strategy or a negative cooldown.
    """

    def __init__(self, policies: Sequence, strategy: Strategy = "round_robin", *, cooldown_s: float = 10.0) -> None:
        policies = list(policies)
        if not policies:
            raise ValueError("RoutedPolicy needs at least one policy backend")
        missing = [i for i, p in enumerate(policies) if not callable(getattr(p, "generate", None))]
        if missing:
            raise ValueError(f"policies {missing} have no generate(prompts, params) method")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if isinstance(cooldown_s, bool) or not isinstance(cooldown_s, (int, float)) or cooldown_s < 0:
            raise ValueError(f"cooldown_s must be a number of seconds >= 0, got {cooldown_s!r}")
        self.policies, self.strategy, self.cooldown_s = policies, strategy, float(cooldown_s)
        self.stats = [BackendStats() for _ in policies]
        self._cursor = 0
        self._lock = threading.Lock()
        self.sessions = SessionMap() if strategy == "sticky" else None
        self._pool = ThreadPoolExecutor(max_workers=4 * len(policies), thread_name_prefix="turnrl-route")

    def __repr__(self) -> str:
        return f"RoutedPolicy({self.policies!r}, strategy={self.strategy!r})"

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one turn per prompt on the backends; returns them in prompt order.

        Raises:
            ConnectionError: If every backend failed (the message names each one's error).
            Exception: The first non-backend failure of any backend, unchanged.
        """
        results: list[Generation | None] = [None] * len(prompts)
        pending, failed = list(range(len(prompts))), set()
        while pending:
            assignment = self._assign(pending, failed, prompts)
            if not assignment:
                errors = "; ".join(f"backend {i} ({self.policies[i]!r}): {self.stats[i].last_error}" for i in failed)
                raise ConnectionError(f"every policy backend failed; {errors}")
            futures = {b: self._pool.submit(self._call, b, [prompts[r] for r in rows], params)
                       for b, rows in assignment.items()}
            pending, fatal = [], None
            for backend, future in futures.items():
                rows = assignment[backend]
                try:
                    generations = future.result()
                except BACKEND_FAILURES:
                    failed.add(backend)
                    pending.extend(rows)
                    continue
                except Exception as e:  # not the backend being down: the same rows would fail elsewhere
                    fatal = fatal or e
                    continue
                if len(generations) != len(rows):
                    raise RuntimeError(f"backend {backend} returned {len(generations)} generations for {len(rows)} "
                                       "prompts")
                for r, gen in zip(rows, generations):
                    results[r] = gen
                    if self.sessions is not None:
                        self.sessions.record(list(prompts[r]) + list(gen.token_ids), backend)
            if fatal is not None:
                raise fatal
            pending.sort()
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Close the backends that have ``close()`` and the routing threads; idempotent (as far
        as the backends' own ``close`` is)."""
        for policy in self.policies:
            if callable(getattr(policy, "close", None)):
                policy.close()
        self._pool.shutdown(wait=False)

    # -------------------------------------------------------------- the RolloutPolicy members
    @property
    def token_exact(self) -> bool:
        """True when every backend is token-exact (its ``token_exact``; absent counts as False)."""
        return all(bool(getattr(p, "token_exact", False)) for p in self.policies)

    @property
    def needs_weight_push(self) -> bool:
        """True when any backend samples from weights of its own (its ``needs_weight_push``;
        absent counts as True: a backend of unknown kind cannot be assumed to follow the learner)."""
        return any(bool(getattr(p, "needs_weight_push", True)) for p in self.policies)

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """``load_weights`` on every backend, in order (``RolloutPolicy.load_weights``'s contract).

        Raises:
            TypeError: If a backend has no ``load_weights`` (checked before any is called).
        """
        state = dict(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        for policy in self._backends_with("load_weights"):
            policy.load_weights(state)

    def sync_from(self, model: torch.nn.Module) -> None:
        """``sync_from(model)`` on every backend, in order.

        Raises:
            TypeError: If a backend has no ``sync_from`` (checked before any is called).
        """
        for policy in self._backends_with("sync_from"):
            policy.sync_from(model)

    def rng_state(self) -> dict:
        """``{"cursor": int, "backends": [state or None, ...]}``: the routing rotation and every
        backend's ``rng_state()`` (None for a backend without one)."""
        with self._lock:
            cursor = self._cursor
        return {"cursor": cursor,
                "backends": [p.rng_state() if callable(getattr(p, "rng_state", None)) else None
                             for p in self.policies]}

    def set_rng_state(self, state: dict) -> None:
        """Restore what ``rng_state`` returned (the same backends, in the same order).

        Raises:
            TypeError: If ``state`` is not such a dict, or holds a state for a backend without
                ``set_rng_state``. ValueError: On another number of backends.
        """
        if not isinstance(state, Mapping) or set(state) != {"cursor", "backends"}:
            raise TypeError(f"state must be what RoutedPolicy.rng_state() returned ({{'cursor', 'backends'}}), got "
                            f"{str(state)[:80]}")
        states = list(state["backends"])
        if len(states) != len(self.policies):
            raise ValueError(f"the state holds {len(states)} backends' states, this RoutedPolicy has "
                             f"{len(self.policies)} backends")
        for i, (policy, sub) in enumerate(zip(self.policies, states)):
            if sub is not None and not callable(getattr(policy, "set_rng_state", None)):
                raise TypeError(f"backend {i} ({policy!r}) has no set_rng_state, but the state holds one for it")
        for policy, sub in zip(self.policies, states):
            if sub is not None:
                policy.set_rng_state(sub)
        with self._lock:
            self._cursor = int(state["cursor"])

    def _backends_with(self, method: str) -> list:
        lacking = [i for i, p in enumerate(self.policies) if not callable(getattr(p, method, None))]
        if lacking:
            raise TypeError(f"backends {lacking} ({', '.join(repr(self.policies[i]) for i in lacking)}) have no "
                            f"{method}(); a RoutedPolicy can {method} only when every backend can (for rollout "
                            "servers use ServedPolicy, which pushes weights to them)")
        return list(self.policies)

    # -------------------------------------------------------------- routing
    def _assign(self, rows: list[int], failed: set[int], prompts: list[list[int]]) -> dict[int, list[int]]:
        """Rows per backend (in row order), among backends not failed in this call; counts them in flight."""
        owners = {r: self.sessions.owner(prompts[r]) for r in rows} if self.sessions is not None else {}
        now = time.monotonic()
        with self._lock:
            usable = [i for i in range(len(self.policies)) if i not in failed]
            healthy = [i for i in usable if self.stats[i].down_until <= now]
            candidates = healthy or usable  # when all are cooling down, try them anyway
            if not candidates:
                return {}
            assignment: dict[int, list[int]] = {}
            for row in rows:
                owner = owners.get(row)
                if owner is not None and owner in healthy:
                    backend = owner
                    self.stats[backend].sticky += 1
                elif self.strategy == "round_robin":
                    backend = candidates[self._cursor % len(candidates)]
                    self._cursor += 1
                else:
                    start = self._cursor % len(candidates)  # rotate ties, so idle backends share evenly
                    order = candidates[start:] + candidates[:start]
                    backend = min(order, key=lambda i: self.stats[i].in_flight)
                    self._cursor += 1
                self.stats[backend].in_flight += 1
                self.stats[backend].routed += 1
                assignment.setdefault(backend, []).append(row)
            return assignment

    def _call(self, backend: int, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        try:
            generations = self.policies[backend].generate(prompts, params)
        except BACKEND_FAILURES as e:
            with self._lock:
                stats = self.stats[backend]
                stats.failures += 1
                stats.last_error = f"{type(e).__name__}: {e}"
                stats.down_until = time.monotonic() + self.cooldown_s
            raise
        else:
            with self._lock:
                self.stats[backend].rows += len(prompts)
            return generations
        finally:
            with self._lock:
                self.stats[backend].in_flight -= len(prompts)

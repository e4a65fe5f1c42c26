"""``SessionMap``: which backend last extended each recent token sequence, so that the next turn
of an episode (or of any caller that appends to its history) goes to the server that holds its
prefix in cache.

A multi-turn prompt is the previous turn's prompt, the reply sampled for it, then the new
observation: the previous sequence is a prefix of it. ``record(sequence, backend)`` remembers
each sampled sequence (prompt + reply); ``owner(prompt)`` returns the backend of the longest
remembered sequence that is a prefix of ``prompt`` (None for a new episode). No episode ids are
needed, so it works for any client that extends its history, and a caller that rewrote its
history (compaction, a sub-agent) simply starts anew.

Sequences are remembered by prefix fingerprints: a polynomial hash of the ids modulo 2^64,
computed for every prefix at once with numpy (``fingerprints``). Equal prefixes always match;
two different prefixes collide with probability about 2^-64 per pair, and a collision only sends
a turn to a server without its cache (never a wrong sample). At most ``capacity`` sequences are
kept, the least recently used dropped first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

__all__ = ["SessionMap", "fingerprints"]

_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd: its powers never vanish modulo 2^64


def fingerprints(ids: Sequence[int]) -> np.ndarray:
    """``[len(ids)]`` uint64: element ``i`` fingerprints ``ids[:i + 1]`` (the sum of ``(id_j + 1)
    * BASE^j`` modulo 2^64; the ``+ 1`` keeps a trailing id 0 from being a no-op)."""
    n = len(ids)
    if not n:
        return np.zeros(0, dtype=np.uint64)
    powers = np.full(n, _BASE, dtype=np.uint64)
    powers[0] = 1
    with np.errstate(over="ignore"):
        powers = np.cumprod(powers, dtype=np.uint64)
        return np.cumsum((np.asarray(ids, dtype=np.uint64) + np.uint64(1)) * powers, dtype=np.uint64)


class SessionMap:
    """Recent sequences and the backend that sampled each (see the module docstring); thread-safe.

    Args:
        capacity: sequences remembered at most.
    """

    def __init__(self, capacity: int = 65536) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self._owners: OrderedDict[int, int] = OrderedDict()  # fingerprint of a whole sequence -> backend
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._owners)

    def owner(self, prompt: Sequence[int]) -> int | None:
        """The backend of the longest remembered sequence that ``prompt`` starts with (or equals),
        or None."""
        prints = fingerprints(prompt).tolist()
        with self._lock:
            for fingerprint in reversed(prints):
                backend = self._owners.get(fingerprint)
                if backend is not None:
                    self._owners.move_to_end(fingerprint)
                    return backend
        return None

    def record(self, sequence: Sequence[int], backend: int) -> None:
        """Remember that ``backend`` holds ``sequence`` (a prompt and the reply sampled for it)."""
        if not len(sequence):
            return
        fingerprint = int(fingerprints(sequence)[-1])
        with self._lock:
            self._owners[fingerprint] = backend
            self._owners.move_to_end(fingerprint)
            while len(self._owners) > self.capacity:
                self._owners.popitem(last=False)

    def forget(self, backend: int) -> None:
        """Drop every sequence of ``backend`` (e.g. its cache was reset)."""
        with self._lock:
            for fingerprint in [f for f, b in self._owners.items() if b == backend]:
                del self._owners[fingerprint]

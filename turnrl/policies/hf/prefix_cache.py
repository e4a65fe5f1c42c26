"""Keys and values of the sequences a transformers policy ran last, so that an episode's next turn
continues from them instead of prefilling its whole history again.

In a multi-turn episode the prompt of turn ``k+1`` is the prompt of turn ``k``, the reply sampled
for it and the env's observation. Without a cache every turn runs the model over the whole
conversation again: a 50-turn episode pays for its history 50 times (quadratic in turns). With
it, a turn runs only over the tokens added since the last one (the previous reply's last token,
the observation and the generation prompt).

Contract:
    * An entry is the token ids a policy fed the model (a prompt and the reply tokens fed back
      while sampling) and, per attention layer, their keys and values ``[heads, L, head_dim]``.
    * ``lookup(prompt)`` returns the longest entry whose ids are a strict prefix of ``prompt``
      (at least one token is left to run, whose logits the next token is drawn from), or None.
      A prompt that rewrote its history (a template that drops old reasoning) shares no stored
      prefix past the rewrite and is prefilled whole.
    * Entries are dropped at the next ``store`` after a use (the caller stores the longer
      sequence), when ``max_age`` calls passed without a use (a finished episode), and all at once by
      ``clear()`` (the weights changed: keys and values of the old weights are not the
      policy's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class CachedPrefix:
    """The keys and values of ``ids``: ``layers[l] = (keys, values)``, each ``[heads, len(ids), head_dim]``."""

    ids: tuple[int, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    # calls since it was stored, and whether a lookup found it since the last store
    age: int = 0
    used: bool = False


@dataclass
class PrefixCache:
    """Entries by length, then ids (see the module docstring); ``hits``/``misses`` count lookups
    and ``reused_tokens`` the prompt tokens that were not run again."""

    max_age: int = 2
    entries: dict[int, dict[tuple[int, ...], CachedPrefix]] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0

    def lookup(self, prompt: Sequence[int]) -> CachedPrefix | None:
        """The longest entry whose ids are a strict prefix of ``prompt`` (None: none). A found
        entry stays until the next ``store``, which drops it (its sequence goes on in the
        caller's, which the caller stores), so several prompts of one call may share it."""
        for length in sorted((n for n in self.entries if n < len(prompt)), reverse=True):
            found = self.entries[length].get(tuple(prompt[:length]))
            if found is not None:
                found.used = True
                self.hits += 1
                self.reused_tokens += length
                return found
        self.misses += 1
        return None

    def store(self, new: Sequence[CachedPrefix]) -> None:
        """Drop the entries used since the last ``store`` and those older than ``max_age`` calls,
        age the rest by one call, then add ``new``."""
        for length in list(self.entries):
            kept = {ids: e for ids, e in self.entries[length].items() if not e.used and e.age < self.max_age}
            for e in kept.values():
                e.age += 1
            if kept:
                self.entries[length] = kept
            else:
                del self.entries[length]
        for entry in new:
            if entry.ids:
                self.entries.setdefault(len(entry.ids), {})[entry.ids] = entry

    def clear(self) -> None:
        """Drop every entry (after a weight change)."""
        self.entries.clear()

    def __len__(self) -> int:
        return sum(len(v) for v in self.entries.values())

    @property
    def tokens(self) -> int:
        """Tokens whose keys and values are held."""
        return sum(n * len(v) for n, v in self.entries.items())

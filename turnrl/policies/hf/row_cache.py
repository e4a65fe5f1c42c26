"""A batch's episodes kept in one key/value buffer across their turns, a row each: a turn writes
its new tokens after the row's history, in place; nothing already cached is copied.

``TransformersPolicy`` keeps an episode's keys and values between calls (``prefix_cache``). Kept
as one tensor per episode (``turnrl.policies.hf.prefix_cache``), every call copied each row's history
into the call's buffer and back out: two reads and two writes of the whole history a turn,
quadratic in turns like attention itself (``scripts/bench_turns.py``). ``RowCache`` keeps the
buffer instead. Row ``r`` holds the ids the model was fed for one sequence (``ids[r]``) in slots
``0 .. len(ids[r]) - 1`` of every layer's ``[rows, kv_heads, capacity, head_dim]`` buffer, slot =
position. A call whose prompts each extend a different row, one prompt per row (an episode's
next turn), runs in place: each row's new tokens are written at its own offset (``slots``), so
rows of different lengths leave no padding in their history. Any other call (a new episode, an
episode that ended, two prompts extending one row) rebuilds the buffer once for the call's
prompts, copying the rows they extend; rows no prompt extends move to a ``PrefixCache`` of
single sequences (``evicted``), where a later call can still find them.

Contract (the ``PrefixCache``'s): a prompt continues the longest stored sequence whose ids are a
strict prefix of it (one token at least is left to run); a prompt that rewrote its history
shares nothing past the rewrite. The keys and values are the same as a whole prefill's to float
rounding (the same sums over the same tokens).

The layers are ``RowLayer`` s: the model's forward writes its keys and values through
``update`` at the slots ``prepare`` set for the call, and attention reads ``[:, :, :width]``
under a 4D mask the caller builds (each row's own history, causal over its new tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from turnrl.policies.hf.prefix_cache import CachedPrefix, PrefixCache


class RowLayer(DynamicLayer):
    """One layer's buffers ``[rows, kv_heads, capacity, head_dim]``, zero where never written (a
    masked slot's value is still multiplied, by 0: never by an uninitialised NaN). ``update``
    writes at the slots ``RowCache.prepare`` set; buffers not made yet (the first call of a cache,
    whose rows are all new) are made there, for ``rows`` x ``capacity`` slots, like its keys."""

    def __init__(self) -> None:
        super().__init__()
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self.rows = self.capacity = self.width = 0
        self.slots: torch.Tensor | None = None  # [rows, q]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write ``[rows, kv_heads, q, head_dim]`` at the ``[rows, q]`` slots; returns the views
        ``[rows, kv_heads, width, head_dim]`` attention reads."""
        if self.buffers is None:
            shape = (self.rows, key_states.shape[1], self.capacity, key_states.shape[3])
            self.buffers = (key_states.new_zeros(shape), value_states.new_zeros(shape[:3] + value_states.shape[3:]))
        keys, values = self.buffers
        index = self.slots[:, None, :, None]
        keys.scatter_(2, index.expand(key_states.shape), key_states)
        values.scatter_(2, index.expand(value_states.shape), value_states)
        self.keys, self.values = keys[:, :, :self.width], values[:, :, :self.width]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.width


class RowCache(DynamicCache):
    """The rows (module docstring), a ``DynamicCache`` of ``RowLayer`` s that a transformers
    forward and ``DecodeStep`` write through.

    Attributes:
        ids: the fed ids of each row (``len(ids[r])`` of its slots hold keys and values).
        evicted: sequences of rows no call's prompt extended (``PrefixCache``: dropped after
            ``max_age`` calls unused).
        hits, misses, reused_tokens: lookups that found a sequence, those that did not, and the
            prompt tokens not run again.
    """

    def __init__(self, num_layers: int, max_age: int = 2) -> None:
        super().__init__()
        self.layers = [RowLayer() for _ in range(num_layers)]
        self.ids: list[list[int]] = []
        self.evicted = PrefixCache(max_age=max_age)
        self._evicted: list[CachedPrefix] = []  # moved out by this call's rebuild, stored by end_call
        self.hits = self.misses = self.reused_tokens = 0

    # -- finding and arranging the rows of a call ------------------------------------------------

    def match(self, prompt: Sequence[int]) -> int | None:
        """The row holding the longest strict prefix of ``prompt`` (None: none)."""
        best, best_len = None, 0
        for row, ids in enumerate(self.ids):
            n = len(ids)
            if best_len < n < len(prompt) and ids[-1] == prompt[n - 1] and prompt[:n] == ids:
                best, best_len = row, n
        return best

    def arrange(self, prompts: Sequence[list[int]]) -> list[int | CachedPrefix | None] | None:
        """Each prompt's cached prefix. None when the call runs in place: prompt ``i`` extends row
        ``i``, for every row (an episode's next turn; rows in another order are rebuilt, so that
        each row draws its random numbers where a whole prefill's would). Otherwise prompt
        ``i``'s prefix, for ``rebuild``: a row index, a ``CachedPrefix`` (an evicted sequence) or
        None."""
        rows = [self.match(p) for p in prompts]
        if len(prompts) == len(self.ids) and rows == list(range(len(rows))):
            for ids in self.ids:
                self._count(len(ids))
            return None
        found = []
        for prompt, row in zip(prompts, rows):
            entry = self.evicted.lookup(prompt)
            row_len = -1 if row is None else len(self.ids[row])
            if entry is not None and len(entry.ids) > row_len:
                found.append(entry)
                self._count(len(entry.ids))
            elif row is not None:
                found.append(row)
                self._count(row_len)
            else:
                found.append(None)
                self.misses += 1
        return found

    def _count(self, reused: int) -> None:
        self.hits += 1
        self.reused_tokens += reused

    def rebuild(self, found: Sequence[int | CachedPrefix | None], capacity: int) -> None:
        """New buffers of ``capacity`` slots (at least the longest prefix's) for one row per
        ``found`` entry, holding its prefix: a row's ids and keys and values are copied, a
        ``CachedPrefix``'s written, None left empty. Rows no entry names move to ``evicted``."""
        kept = {f for f in found if isinstance(f, int)}
        for row, ids in enumerate(self.ids):
            if row not in kept and ids:
                n = len(ids)
                layers = [(keys[row, :, :n].clone(), values[row, :, :n].clone())
                          for keys, values in (layer.buffers for layer in self.layers)]
                self._evicted.append(CachedPrefix(tuple(ids), layers))
        new_ids = [[] if f is None else list(f.ids) if isinstance(f, CachedPrefix) else list(self.ids[f])
                   for f in found]
        capacity = max(capacity, *(len(ids) for ids in new_ids))
        rows = [(i, f) for i, f in enumerate(found) if isinstance(f, int)]
        template = next((f for f in found if isinstance(f, CachedPrefix)), None)
        for index, layer in enumerate(self.layers):
            old, layer.buffers = layer.buffers, None
            layer.rows, layer.capacity = len(found), capacity
            likes = old or (template.layers[index] if template is not None else None)
            if likes is None:  # all rows new: made at the first update
                continue
            layer.buffers = tuple(like.new_zeros((len(found), like.shape[-3], capacity, like.shape[-1]))
                                  for like in likes)
            if rows:  # the kept rows' slots up to the longest of them, one gather a buffer
                width = max(len(self.ids[f]) for _, f in rows)
                source = torch.tensor([f for _, f in rows], device=old[0].device)
                target = torch.tensor([i for i, _ in rows], device=old[0].device)
                for new, previous in zip(layer.buffers, old):
                    new[target, :, :width] = previous[source, :, :width]
            for i, f in enumerate(found):
                if isinstance(f, CachedPrefix):
                    for new, cached in zip(layer.buffers, f.layers[index]):
                        new[i, :, :len(f.ids)] = cached
        self.ids = new_ids

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` slots a row (at least twice the old room when it grows: one
        copy, amortised over the calls)."""
        for layer in self.layers:
            if layer.capacity >= capacity:
                continue
            layer.capacity = max(capacity, 2 * layer.capacity)
            if layer.buffers is not None:
                old = layer.buffers
                layer.buffers = tuple(b.new_zeros(b.shape[:2] + (layer.capacity,) + b.shape[3:]) for b in old)
                for new, previous in zip(layer.buffers, old):
                    new[:, :, :previous.shape[2]] = previous

    def prepare(self, slots: torch.Tensor, width: int) -> None:
        """Before a forward: its ``[rows, q]`` tokens' keys and values go to ``slots`` (each below
        the capacity), and attention reads the first ``width`` slots of every row."""
        for layer in self.layers:
            layer.slots, layer.width = slots, width

    def clear(self) -> None:
        """Drop every row and evicted sequence (after a weight change); the counts stay."""
        for layer in self.layers:
            layer.buffers, layer.slots, layer.rows, layer.capacity, layer.width = None, None, 0, 0, 0
        self.ids, self._evicted = [], []
        self.evicted.clear()

    def take(self, rows: Sequence[int]) -> RowCache:
        """A cache of copies of ``rows`` (their ids, keys and values), in that order."""
        sub = RowCache(len(self.layers))
        sub.ids = [list(self.ids[r]) for r in rows]
        for layer, part in zip(self.layers, sub.layers):
            part.rows, part.capacity = len(rows), layer.capacity
            if layer.buffers is not None:  # (else all rows are new: made at the first update, as here)
                index = torch.tensor(rows, device=layer.buffers[0].device)
                part.buffers = tuple(b[index] for b in layer.buffers)
        return sub

    def put(self, sub: RowCache, rows: Sequence[int], starts: Sequence[int]) -> None:
        """Copy what ``sub`` (``take(rows)``, extended since) holds past ``starts`` back into
        ``rows``, with its ids; the room for them must be reserved."""
        for layer, part in zip(self.layers, sub.layers):
            if layer.buffers is None:
                layer.buffers = tuple(b.new_zeros((layer.rows, b.shape[1], layer.capacity, b.shape[3]))
                                      for b in part.buffers)
            for i, (row, start) in enumerate(zip(rows, starts)):
                end = len(sub.ids[i])
                for mine, theirs in zip(layer.buffers, part.buffers):
                    mine[row, :, start:end] = theirs[i, :, start:end]
        for i, row in enumerate(rows):
            self.ids[row] = list(sub.ids[i])

    def end_call(self) -> None:
        """Store the rows this call's rebuild moved out, and age the evicted sequences by one
        call (dropping those used or too old)."""
        self.evicted.store(self._evicted)
        self._evicted = []

    def __len__(self) -> int:
        return len(self.ids) + len(self.evicted)

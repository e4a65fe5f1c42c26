"""A key/value cache layer written in place: one buffer per call, no copy per decoded token.

transformers' ``DynamicLayer`` concatenates each new token's keys and values onto the whole
history (``torch.cat``): decoding ``n`` tokens after a prompt of ``L`` copies ``O(n * L)`` floats
per layer, the largest cost after attention itself in a long episode's turn
(``scripts/bench_turns.py``). ``BufferLayer`` holds keys and values in a buffer
``[batch, kv_heads, capacity, head_dim]`` sized for the whole call (prompt plus the most new
tokens) and writes each new token into its slot; what attention reads is the view of the
filled part (``keys``/``values``, ``[batch, kv_heads, length, head_dim]``), so a decoded token
costs ``O(1)`` writes. A call that outgrows its buffer gets one twice as large (one copy).

Used by ``TransformersPolicy`` on models whose every layer is plain attention (``DynamicLayer``
under ``DynamicCache(config=...)``); the figures equal ``DynamicLayer``'s (the same keys and
values, the same attention).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class BufferLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys``/``values`` are views of a preallocated buffer.

    Args:
        capacity: slots to allocate at the first ``update`` (at least the tokens written then).
    """

    def __init__(self, capacity: int = 0) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._allocate(key_states, value_states, max(self.capacity, key_states.shape[-2]))

    def _allocate(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> None:
        batch, heads, _, dim = key_states.shape
        keys = key_states.new_empty((batch, heads, capacity, dim))
        values = value_states.new_empty((batch, heads, capacity, value_states.shape[-1]))
        if self.length:
            keys[:, :, :self.length] = self.keys
            values[:, :, :self.length] = self.values
        self._keys, self._values, self.capacity = keys, values, capacity

    def reserve(self, batch: int, keys_like: torch.Tensor, values_like: torch.Tensor, filled: int) -> None:
        """Allocate the buffer for ``batch`` rows of ``keys_like``/``values_like``'s heads, head
        dim, dtype and device (``[kv_heads, any, head_dim]``) with its first ``filled`` slots
        zero and counted as written: the caller writes each row's cached keys and values into
        ``keys``/``values`` (``[batch, kv_heads, filled, head_dim]``); zero slots it leaves are
        padding, masked out by the attention mask (zero, never uninitialised: a masked score
        still multiplies its value)."""
        heads, _, dim = keys_like.shape
        super().lazy_initialization(keys_like, values_like)
        self.length = 0
        self._allocate(keys_like.new_empty((batch, heads, 0, dim)), values_like.new_empty((batch, heads, 0, dim)),
                       max(self.capacity, filled))
        self._keys[:, :, :filled].zero_()
        self._values[:, :, :filled].zero_()
        self.length = filled
        self.keys, self.values = self._keys[:, :, :filled], self._values[:, :, :filled]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write ``[batch, kv_heads, new, head_dim]`` after the filled part; returns the views of
        everything written so far."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            self._allocate(key_states, value_states, max(end, 2 * self.capacity))
        self._keys[:, :, self.length:end] = key_states
        self._values[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


def buffer_cache(num_layers: int, capacity: int) -> DynamicCache:
    """An empty ``DynamicCache`` of ``num_layers`` ``BufferLayer`` s of ``capacity`` slots each."""
    cache = DynamicCache()
    cache.layers = [BufferLayer(capacity) for _ in range(num_layers)]
    return cache


def plain_attention(config) -> bool:
    """Whether every layer of a model with this config caches plain attention keys and values
    (``DynamicLayer``: no sliding window, linear attention or conv state), so ``BufferLayer``
    can stand in for each."""
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config transformers cannot build a cache from: keep its own
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)

"""One decoded token per row through a Llama-family decoder in plain torch calls.

A transformers forward over one new token per row is mostly Python on a small model: on the
tiny Qwen2 (2 layers, hidden 64) a decode call took ~1.4 ms on one CPU thread, of which the
matrix products and attention were ~0.3 ms; the rest builds the causal mask, output
dataclasses, module hooks and config look-ups each call (``scripts/bench_trl.py``'s profile:
model forward calls were 48% of a single-turn GRPO step). ``DecodeStep`` runs the same weights
through the same operations in the same order (RMSNorm in float32, rotary embeddings from the
model's own ``rotary_emb``, SDPA with grouped heads under the padding mask, the MLP) and writes
keys and values into the call's ``BufferLayer`` cache, so its logits equal the model's to float
rounding (tested against the model's own forward on padded batches, for each architecture it
takes). Per token and layer it runs about half the operations of a plain transcription: the
query/key/value and gate/up products concatenated on small models (``FUSE_MAX_PARAMETERS``),
queries and keys rotated together, ``F.rms_norm`` (bit-equal to transformers' RMSNorm) and
cos/sin read from a table by position. On the tiny Qwen2 that cut a decoded token by ~25%
(``scripts/bench_trl.py``).

It takes only what it reproduces exactly: Qwen2, Qwen3 (query/key norms) and Llama decoders
on ``sdpa`` attention, with ``torch.nn.Linear`` projections
(LoRA or quantized layers are not), SiLU MLPs, no sliding-window layer and no attention
soft-capping. ``DecodeStep.for_model`` returns None for anything else, and the policy then
calls the model's forward as before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from turnrl.policies.hf.gqa_attention import SDPA_GQA

# the decoder-layer classes whose forward DecodeStep reproduces, by their transformers module
_DECODERS = {
    "transformers.models.qwen2.modeling_qwen2": "Qwen2DecoderLayer",
    "transformers.models.qwen3.modeling_qwen3": "Qwen3DecoderLayer",
    "transformers.models.llama.modeling_llama": "LlamaDecoderLayer",
}
_NORMS = ("Qwen2RMSNorm", "Qwen3RMSNorm", "LlamaRMSNorm")


FUSE_MAX_PARAMETERS = 20_000_000
"""On a model of at most this many parameters, ``DecodeStep`` concatenates each layer's query,
key and value weights (and its gate and up weights) into one matrix when it is built (once per
``generate`` call), so a decoded token runs 4 matrix products a layer instead of 7. On a small
model each product is mostly per-call overhead; on a large one the copy (about two thirds of
the weights) would cost memory and time, and the products are compute-bound anyway."""

BMM_MIN_KEYS = 512
"""From this many cached keys on, on CPU with one torch thread, ``DecodeStep`` attends with two
batched matrix products (``_attend``) instead of SDPA. SDPA's kernel over one query per row ran
1.1-2x slower than them over 700-2,600 keys on one thread (16 rows; 4 or 14 query heads, 2
key/value heads) and slightly faster under ~200; 32-turn rollouts (``scripts/bench_turns.py``'s
episodes) took 0.92x the time with them on one thread, but 1.07-1.08x on two, where SDPA splits
its work across the threads better."""

STATIC_ROPE = ("default", "linear", "llama3")
"""Rotary types whose cos/sin at a position do not depend on the other positions of the call:
``DecodeStep`` reads them from a table by position. Others (dynamic, longrope, yarn...) call the
model's ``rotary_emb`` each step, as its forward does."""


def _rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """transformers' Llama-family RMSNorm: the mean square in float32, scaled by the weight
    (``F.rms_norm`` is bit-equal to its ``h * rsqrt(mean(h^2) + eps)``, measured in float32 and
    bfloat16, in one call instead of eight)."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), None, norm.variance_epsilon).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[B, heads, 1, d]`` (``cos``/``sin`` ``[B, 1, 1, d]``)."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


def _cat_linear(layers: tuple[torch.nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """One weight (and bias) computing every layer of ``layers`` side by side, or None when some
    have a bias and some not."""
    biases = [layer.bias for layer in layers]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return None
    weight = torch.cat([layer.weight for layer in layers])
    return weight, None if biases[0] is None else torch.cat(biases)


def _key_bias(attention: torch.Tensor, attn: torch.nn.Module) -> torch.Tensor:
    """The additive mask ``[B * kv_heads, 1, K]`` (0: attend, -inf: padding) of ``_attend`` for
    the mask ``attention`` ``[B, K]``; made once per step, shared by the layers."""
    batch, width = attention.shape
    kv_heads = attn.k_proj.out_features // attn.head_dim
    bias = torch.zeros((batch, 1, width), dtype=attn.k_proj.weight.dtype, device=attention.device)
    bias.masked_fill_(attention[:, None, :] == 0, float("-inf"))
    return bias.expand(batch, kv_heads, width).reshape(batch * kv_heads, 1, width)


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
            scale: float) -> torch.Tensor:
    """SDPA of one query per row under ``bias`` as two batched matrix products: ``q``
    ``[B, heads, 1, d]``, ``keys``/``values`` ``[B, kv_heads, K, d]`` (views of the cache buffer,
    not copied: each query head group reads its key/value head as it is), ``bias``
    ``[B * kv_heads, 1, K]``. Returns ``[B, heads, 1, d]``; equal to SDPA to float rounding."""
    batch, heads, _, dim = q.shape
    kv_heads, width = keys.shape[1], keys.shape[2]
    grouped = q.reshape(batch * kv_heads, heads // kv_heads, dim)  # the query heads of each key/value head
    scores = torch.baddbmm(bias, grouped, keys.reshape(batch * kv_heads, width, dim).transpose(1, 2), alpha=scale)
    out = torch.bmm(torch.softmax(scores, dim=-1), values.reshape(batch * kv_heads, width, dim))
    return out.view(batch, heads, 1, dim)


class _Layer:
    """One decoder layer's modules and, when fused, its concatenated weights."""

    def __init__(self, layer: torch.nn.Module, fuse: bool):
        attn, mlp = layer.self_attn, layer.mlp
        self.attn, self.mlp, self.layer = attn, mlp, layer
        self.q_norm = getattr(attn, "q_norm", None)
        self.q_size = attn.q_proj.out_features
        self.kv_size = attn.k_proj.out_features
        self.qkv = _cat_linear((attn.q_proj, attn.k_proj, attn.v_proj)) if fuse else None
        self.gate_up = _cat_linear((mlp.gate_proj, mlp.up_proj)) if fuse else None


class DecodeStep:
    """The logits of one new token per row, given the call's cache (see the module docstring).

    Built by ``for_model``; call it as ``step(tokens, positions, attention, cache)``. It copies
    what it fuses (``FUSE_MAX_PARAMETERS``) when built, so build one per ``generate`` call: a
    step built before the weights changed would decode with the old ones.
    """

    def __init__(self, model: torch.nn.Module):
        self.model, self.base = model, model.model  # weights are read here: build one per generate call
        fuse = sum(p.numel() for p in model.parameters()) <= FUSE_MAX_PARAMETERS
        self.layers = [_Layer(layer, fuse) for layer in self.base.layers]
        rotary = self.base.rotary_emb
        self._static_rope = getattr(rotary, "rope_type", None) in STATIC_ROPE
        self._cos = self._sin = None  # [P, d] by position (static rotary types)

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> DecodeStep | None:
        """A ``DecodeStep`` for ``model`` (a transformers causal LM, unwrapped), or None when it is
        not a decoder this module reproduces exactly (module docstring)."""
        config = getattr(model, "config", None)
        base = getattr(model, "model", None)
        if config is None or base is None or getattr(config, "_attn_implementation", None) not in ("sdpa", SDPA_GQA):
            return None
        if getattr(config, "hidden_act", None) != "silu" or getattr(config, "pretraining_tp", 1) != 1:
            return None
        if getattr(config, "attn_logit_softcapping", None) or getattr(config, "final_logit_softcapping", None):
            return None
        if getattr(config, "use_sliding_window", False):
            return None
        if any(kind != "full_attention" for kind in (getattr(config, "layer_types", None) or ())):
            return None
        if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
            return None  # a hook would not run
        if type(getattr(model, "lm_head", None)) is not torch.nn.Linear:
            return None
        if type(getattr(base, "embed_tokens", None)) is not torch.nn.Embedding or getattr(base, "rotary_emb", None) is None:
            return None
        if type(getattr(base, "norm", None)).__name__ not in _NORMS:
            return None
        for layer in getattr(base, "layers", ()):
            kind = type(layer)
            if _DECODERS.get(kind.__module__) != kind.__name__:
                return None
            attn, mlp = layer.self_attn, layer.mlp
            linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
            if any(type(m) is not torch.nn.Linear for m in linears) or getattr(attn, "sliding_window", None):
                return None
            if any(type(n).__name__ not in _NORMS for n in (layer.input_layernorm, layer.post_attention_layernorm)):
                return None
        return cls(model)

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, attention: torch.Tensor, cache) -> torch.Tensor:
        """Logits ``[B, V]`` (float32) of the next token after ``tokens``.

        Args:
            tokens: ``[B]`` the ids fed this step (padding ids on finished rows).
            positions: ``[B]`` their position ids.
            attention: ``[B, K]`` the mask over the cache's ``K - 1`` slots and this token (1:
                attend, 0: padding), as the model's forward takes it.
            cache: the call's ``DynamicCache`` of ``BufferLayer`` s (this token's keys and
                values are written into it, one layer each).
        """
        base, batch = self.base, tokens.shape[0]
        x = F.embedding(tokens[:, None], base.embed_tokens.weight)  # [B, 1, hidden]
        cos, sin = self._rotary(x, positions)  # [B, 1, 1, d]
        mask = attention.bool()[:, None, None, :]  # [B, 1, 1, K]
        # (measured on CPU, one thread; on a GPU SDPA's kernels are the fast path)
        bmm = attention.shape[1] >= BMM_MIN_KEYS and attention.device.type == "cpu" and torch.get_num_threads() == 1
        bias = _key_bias(attention, self.layers[0].attn) if bmm else None
        for index, layer in enumerate(self.layers):
            attn, mlp, d = layer.attn, layer.mlp, layer.attn.head_dim
            h = _rms_norm(x, layer.layer.input_layernorm)
            # one token per row: [B, 1, heads * d] views as [B, heads, 1, d] with no transpose
            if layer.qkv is not None:
                qkv = F.linear(h, *layer.qkv).view(batch, -1, 1, d)
                q, k, v = qkv.split((layer.q_size // d, layer.kv_size // d, layer.kv_size // d), dim=1)
            else:
                q, k, v = (F.linear(h, m.weight, m.bias).view(batch, -1, 1, d)
                           for m in (attn.q_proj, attn.k_proj, attn.v_proj))
            if layer.q_norm is not None:
                q, k = _rotate(_rms_norm(q, attn.q_norm), cos, sin), _rotate(_rms_norm(k, attn.k_norm), cos, sin)
            else:  # queries and keys rotated in one pass
                q, k = _rotate(torch.cat((q, k), dim=1), cos, sin).split((q.shape[1], k.shape[1]), dim=1)
            keys, values = cache.layers[index].update(k, v)
            if bias is None:
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling,
                                                     enable_gqa=q.shape[1] != keys.shape[1])
            else:
                out = _attend(q, keys, values, bias, attn.scaling)
            x = x + F.linear(out.reshape(batch, 1, -1), attn.o_proj.weight, attn.o_proj.bias)
            h = _rms_norm(x, layer.layer.post_attention_layernorm)
            if layer.gate_up is not None:
                gate, up = F.linear(h, *layer.gate_up).chunk(2, dim=-1)
            else:
                gate, up = (F.linear(h, m.weight, m.bias) for m in (mlp.gate_proj, mlp.up_proj))
            x = x + F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        x = _rms_norm(x, base.norm)
        head = self.model.lm_head
        return F.linear(x[:, -1], head.weight, head.bias).float()

    def _rotary(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin`` ``[B, 1, 1, d]`` at ``positions`` ``[B]``: the model's ``rotary_emb``
        values, read from a table made by it over ``0..P-1`` (grown to twice the largest position
        seen) for a static rotary type, else computed by it for this step."""
        if not self._static_rope:
            cos, sin = self.base.rotary_emb(x, positions[:, None])  # [B, 1, d]
            return cos[:, None], sin[:, None]
        top = int(positions.max())
        if self._cos is None or top >= self._cos.shape[0]:
            grid = torch.arange(2 * top + 2, device=positions.device)[None]
            cos, sin = self.base.rotary_emb(x, grid)  # [1, P, d]
            self._cos, self._sin = cos[0], sin[0]
        return self._cos[positions][:, None, None], self._sin[positions][:, None, None]

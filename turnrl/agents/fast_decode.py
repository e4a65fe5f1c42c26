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
takes).

It takes only what it reproduces exactly: Qwen2, Qwen3 (query/key norms) and Llama decoders
on ``sdpa`` attention, with ``torch.nn.Linear`` projections
(LoRA or quantized layers are not), SiLU MLPs, no sliding-window layer and no attention
soft-capping. ``DecodeStep.for_model`` returns None for anything else, and the policy then
calls the model's forward as before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from turnrl.agents.gqa_attention import SDPA_GQA

# the decoder-layer classes whose forward DecodeStep reproduces, by their transformers module
_DECODERS = {
    "transformers.models.qwen2.modeling_qwen2": "Qwen2DecoderLayer",
    "transformers.models.qwen3.modeling_qwen3": "Qwen3DecoderLayer",
    "transformers.models.llama.modeling_llama": "LlamaDecoderLayer",
}
_NORMS = ("Qwen2RMSNorm", "Qwen3RMSNorm", "LlamaRMSNorm")


def _rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """transformers' Llama-family RMSNorm: the mean square in float32, scaled by the weight."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


def _linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[B, heads, 1, d]`` (``cos``/``sin`` ``[B, 1, 1, d]``)."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


class DecodeStep:
    """The logits of one new token per row, given the call's cache (see the module docstring).

    Built by ``for_model``; call it as ``step(tokens, positions, attention, cache)``.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model  # modules are read at each call: weights loaded in place or replaced show up
        self.base = model.model

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
        cos, sin = base.rotary_emb(x, positions[:, None])  # [B, 1, d]
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, 1, d]
        mask = attention.bool()[:, None, None, :]  # [B, 1, 1, K]
        for index, layer in enumerate(base.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = _rms_norm(x, layer.input_layernorm)
            q = _linear(h, attn.q_proj).view(batch, 1, -1, attn.head_dim)
            k = _linear(h, attn.k_proj).view(batch, 1, -1, attn.head_dim)
            v = _linear(h, attn.v_proj).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
            if hasattr(attn, "q_norm"):
                q, k = _rms_norm(q, attn.q_norm), _rms_norm(k, attn.k_norm)
            q, k = _rotate(q.transpose(1, 2), cos, sin), _rotate(k.transpose(1, 2), cos, sin)
            keys, values = cache.layers[index].update(k, v)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling,
                                                 enable_gqa=q.shape[1] != keys.shape[1])
            x = x + _linear(out.transpose(1, 2).reshape(batch, 1, -1), attn.o_proj)
            h = _rms_norm(x, layer.post_attention_layernorm)
            x = x + _linear(F.silu(_linear(h, mlp.gate_proj)) * _linear(h, mlp.up_proj), mlp.down_proj)
        x = _rms_norm(x, base.norm)
        return _linear(x[:, -1], self.model.lm_head).float()

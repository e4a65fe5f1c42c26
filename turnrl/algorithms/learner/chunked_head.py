"""The LM head's logprobs of chosen tokens, a chunk of positions at a time: the ``[M, V]``
logits are never held whole.

Scoring ``M`` sampled tokens through a ``V``-entry head the plain way keeps the logits, their
log-softmax and, in the backward, gradients of the same shape: at ``M = 16k`` and Qwen's
``V = 151,936`` each is 10 GB in float32. ``chunked_logprobs`` computes the logits ``chunk``
rows at a time and keeps only each row's log-normaliser (``[M]``); the backward computes each
chunk's logits again and forms their gradient, ``(onehot(target) - softmax) * g / temperature``,
multiplied straight into the hidden states' and the weight's gradients. Memory: one
``[chunk, V]`` block at a time; arithmetic: the head's forward product once more (a third of
the head's work in an update). Logprobs and gradients equal the plain path's to float rounding
(tested), under autocast too: the products run in autocast's dtype, as the head's own forward
and autograd would run them, the softmax in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_ELEMENTS = 1 << 26
"""Logits held at a time (``chunk x V``): 256 MB in float32, 441 rows at a 151,936 vocabulary.
``turnrl.algorithms.learner.scoring`` takes this path from ``CHUNKED_HEAD_MIN_ELEMENTS`` (by device)."""


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype a ``F.linear(hidden, weight)`` runs in here: autocast's when it is on."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """``[c, V]`` logits of ``h`` over the head, upcast to float32 at least, over ``temperature``."""
    with torch.autocast(h.device.type, enabled=False):  # the operands are cast already
        logits = F.linear(h, w, b)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return logits if temperature == 1 else logits.div_(temperature)


class _ChunkedLogprobs(torch.autograd.Function):
    """``(logprobs [M], entropy [M] or None)``; the entropy has no gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk, with_entropy):
        compute = _compute_dtype(hidden, weight)
        h, w = hidden.to(compute), weight.to(compute)
        b = bias.to(compute) if bias is not None else None
        picked, norms, entropies = [], [], []
        for start in range(0, max(h.shape[0], 1), chunk):  # (one empty chunk when M = 0)
            logits = _chunk_logits(h[start:start + chunk], w, b, temperature)
            norm = torch.logsumexp(logits, dim=-1)
            picked.append(logits.gather(-1, targets[start:start + chunk, None]).squeeze(-1) - norm)
            norms.append(norm)
            if with_entropy:  # H = log Z - sum(p * z)
                p = logits.sub(norm[:, None]).exp_()
                entropies.append(norm - p.mul_(logits).sum(-1))
        logprobs, lse = torch.cat(picked), torch.cat(norms)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk, ctx.compute = temperature, chunk, compute
        if not with_entropy:
            return logprobs, None
        entropy = torch.cat(entropies)
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, _grad_entropy):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        temperature, chunk, compute = ctx.temperature, ctx.chunk, ctx.compute
        h, w = hidden.to(compute), weight.to(compute)
        b = bias.to(compute) if bias is not None else None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        accumulate = torch.promote_types(weight.dtype, torch.float32)
        grad_hidden = torch.empty_like(hidden) if need_h else None
        grad_weight = torch.zeros(weight.shape, dtype=accumulate, device=weight.device) if need_w else None
        grad_bias = torch.zeros(bias.shape, dtype=accumulate, device=bias.device) if need_b else None
        for start in range(0, h.shape[0], chunk):
            stop = start + chunk
            g = grad_logprobs[start:stop, None].to(lse.dtype)
            # d logp[target] / d z = onehot(target) - softmax(z), z the scaled logits
            grad_z = _chunk_logits(h[start:stop], w, b, temperature).sub_(lse[start:stop, None]).exp_().mul_(-g)
            grad_z.scatter_add_(-1, targets[start:stop, None], g)
            if temperature != 1:
                grad_z.div_(temperature)
            grad_z = grad_z.to(compute)
            with torch.autocast(h.device.type, enabled=False):
                if need_h:
                    grad_hidden[start:stop] = grad_z @ w
                if need_w and compute == accumulate:  # in place: no [V, H] made per chunk
                    grad_weight.addmm_(grad_z.t(), h[start:stop])
                elif need_w:
                    grad_weight += (grad_z.t() @ h[start:stop]).to(accumulate)
                if need_b:
                    grad_bias += grad_z.sum(0).to(accumulate)
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None, None)


def chunked_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, temperature: float = 1.0,
                     with_entropy: bool = False, chunk: int | None = None):
    """``log_softmax(head(hidden) / temperature)`` at ``targets``, ``[M]`` (float32, or float64
    for a float64 head), with the gradient the plain path has; and each row's entropy ``[M]``
    (no gradient) or None.

    Args:
        hidden: ``[M, H]`` the decoder's hidden states before each scored token.
        head: the LM head, a plain ``torch.nn.Linear`` (its weight read directly).
        targets: ``[M]`` int64 the scored tokens.
        chunk: rows of logits at a time (default ``CHUNK_ELEMENTS // V``).
    """
    chunk = chunk or max(1, CHUNK_ELEMENTS // head.weight.shape[0])
    return _ChunkedLogprobs.apply(hidden, head.weight, head.bias, targets, temperature, chunk, with_entropy)

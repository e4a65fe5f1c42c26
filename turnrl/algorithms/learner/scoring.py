"""The learner's view of a batch: per-token logprobs and entropies under the policy."""

from __future__ import annotations

from typing import NamedTuple

import torch

from turnrl.algorithms.learner.chunked_head import chunked_logprobs
from turnrl.algorithms.segments import forward_segments
from turnrl.algorithms.learner.shared_prompt import decoder_hidden


def _hidden_and_head(model):
    """The decoder stack and LM head of a standard HF causal LM, or None when the model
    post-processes logits (e.g. soft-capping) and must be scored through its full forward."""
    if getattr(model.config, "final_logit_softcapping", None):
        return None
    get_decoder, head = getattr(model, "get_decoder", None), model.get_output_embeddings()
    decoder = get_decoder() if get_decoder is not None else None
    if decoder is None or head is None or decoder is model:
        return None
    return decoder, head


CHUNKED_HEAD_MIN_ELEMENTS = {"cpu": 1 << 31, "cuda": 1 << 28}
"""By device type (others: the cuda entry), the scored positions x vocabulary entries from which
the LM head and softmax run a chunk of positions at a time (``turnrl.algorithms.learner.chunked_head``)
instead of on all at once. The plain path keeps several ``[M, V]`` tensors through the backward;
the chunked one computes the logits again in the backward. On a GPU memory is what bounds the
micro-batch, so it chunks from a gigabyte of float32 logits (1,767 positions at Qwen's 151,936).
On a CPU the matrix products bound the time (an update of 1,953 positions at 151,936 took 1.23x
as long chunked, 2 cores), so it chunks only from 8 GB, where the plain path's ~25 GB would not
fit most machines."""


def _chunked_head(head, positions: int) -> bool:
    """Whether ``head`` over ``positions`` rows runs chunked: large enough, and a plain
    ``nn.Linear`` whose weight a direct read gets (no hooks, not a sharded ``DTensor``)."""
    if type(head) is not torch.nn.Linear or head._forward_hooks or head._forward_pre_hooks:
        return False
    if type(head.weight).__name__ == "DTensor":
        return False
    device = head.weight.device.type
    threshold = CHUNKED_HEAD_MIN_ELEMENTS.get(device, CHUNKED_HEAD_MIN_ELEMENTS["cuda"])
    return positions * head.weight.shape[0] >= threshold


def _at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    """Logits upcast to float32 for the softmax (bf16/fp16 models); a float64 model keeps float64."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature``; at temperature 1 the logits themselves (bit-equal), without a
    pass over ``[M, V]`` and another in the backward (0.5 s of a 7 s update at a 152k vocabulary
    on CPU)."""
    return logits if temperature == 1 else logits / temperature


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    """``-sum(p * logp)`` over the last dim of a log-softmax ``[..., V]``. Without autograd the
    product is taken in place in ``exp(logp)``: one ``[..., V]`` tensor made instead of two, the
    same values bit for bit (2.5x faster on CPU at ``[2048, 151936]``: a fresh tensor of that size
    is a gigabyte of new pages)."""
    if torch.is_grad_enabled():
        return -(logp.exp() * logp).sum(-1)
    return -logp.exp().mul_(logp).sum(-1)


class Scored(NamedTuple):
    """What ``token_logprobs`` returns, always these three (unpack ``lp, entropy, _ = ...``)."""

    logprobs: torch.Tensor
    """``[N, T]`` log p of each token given the ones before it (column 0 and unscored ones 0)."""
    entropy: torch.Tensor | None = None
    """``[N, T]`` entropy of each scored position's next-token distribution (``with_entropy``)."""
    hidden: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """``(hidden [M, H], rows [M], cols [M])`` with ``return_hidden``."""


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    score_mask: torch.Tensor | None = None,
    return_hidden: bool = False,
    segments: torch.Tensor | None = None,
    share_prompts: bool = True,
    entropy_grad: bool = True,
) -> Scored:
    """Logprob of every token given the tokens before it.

    Args:
        model: a causal LM.
        input_ids: ``[N, T]`` right-padded ids.
        attention_mask: ``[N, T]``.
        temperature: logits are divided by it, as the sampler did.
        with_entropy: also return the entropy of each scored position's next-token
            distribution (differentiable unless ``entropy_grad`` is False).
        entropy_grad: False: the entropy is computed without gradient, a figure to report.
            Its autograd graph would keep ``[M, V]`` tensors (``exp`` of the log-softmax) alive
            through the backward: 10 GB in float32 for 16k scored tokens of a 152k vocabulary.
        score_mask: ``[N, T]``; when given, only tokens where it is nonzero are scored (the
            LM head and softmax run on those positions alone: in multi-turn episodes most
            tokens are observations), and every other entry of the outputs is 0.
        segments: ``[N, T]`` segment of each token (``TrainBatch.segment_index``): each segment
            is scored as its own sequence (``turnrl.algorithms.segments``); None: one per row.
        share_prompts: run a prompt that several rows share once
            (``turnrl.algorithms.learner.shared_prompt``; unsegmented rows, with ``score_mask``).
        return_hidden: also return ``(hidden [M, H], rows [M], cols [M])``: the decoder's
            hidden state that predicts each scored token (position ``col - 1``), with
            gradient, for a value head sharing the policy's forward. Needs ``score_mask``
            and a model with a separate decoder and LM head.

    Returns:
        ``Scored(logprobs, entropy, hidden)``: ``logprobs [N, T]`` where ``logprobs[:, t] =
        log p(ids[t] | ids[:t])`` and column 0 is 0; ``entropy [N, T]`` (aligned the same way)
        or None; ``hidden`` as described above with ``return_hidden``, else None. Float32 (logits of bf16/fp16 models are upcast
        before the softmax), or float64 for a float64 model.
    """
    n, t = input_ids.shape
    if segments is not None and score_mask is not None:  # a segment's first token has no context in it
        starts = torch.zeros_like(segments, dtype=torch.bool)
        starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
        score_mask = score_mask * ~starts
    parts = _hidden_and_head(model) if score_mask is not None else None
    if return_hidden and parts is None:
        raise ValueError("return_hidden needs score_mask and a model with a separate decoder and LM head "
                         "(a shared value head reads the decoder's hidden states)")
    if parts is None:
        logits = forward_segments(lambda ids, mask: model(input_ids=ids, attention_mask=mask, use_cache=False).logits,
                                  input_ids, attention_mask, segments)
        logits = _at_least_float32(logits[:, :-1])
        logp_all = torch.log_softmax(_scaled(logits, temperature), dim=-1)
        logp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        zero = torch.zeros_like(logp[:, :1])
        out = torch.cat([zero, logp], dim=1)
        entropy = None
        if with_entropy:
            with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
                entropy = torch.cat([zero, _entropy(logp_all)], dim=1)
        if score_mask is not None:
            keep = score_mask.to(out.dtype)
            out, entropy = out * keep, (entropy * keep if entropy is not None else None)
        return Scored(out, entropy)

    decoder, head = parts
    hidden = decoder_hidden(decoder, input_ids, attention_mask, score_mask, segments, share_prompts)
    target = score_mask.clone().bool()
    target[:, 0] = False  # the first token has no context
    rows, cols = target.nonzero(as_tuple=True)
    picked_hidden = hidden[rows, cols - 1]  # [M, H]
    targets = input_ids[rows, cols]
    weighed = with_entropy and entropy_grad and torch.is_grad_enabled()  # (the chunked entropy has no gradient)
    if not weighed and _chunked_head(head, len(rows)):
        picked, ent = chunked_logprobs(picked_hidden, head, targets, temperature, with_entropy)
    else:
        logits = _scaled(_at_least_float32(head(picked_hidden)), temperature)  # [M, V]
        logp_all = torch.log_softmax(logits, dim=-1)
        picked = logp_all.gather(-1, targets[:, None]).squeeze(-1)
        ent = None
        if with_entropy:
            with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
                ent = _entropy(logp_all)
    out = torch.zeros((n, t), dtype=picked.dtype, device=picked.device).index_put((rows, cols), picked)
    entropy = None if ent is None else torch.zeros_like(out).index_put((rows, cols), ent)
    if return_hidden:
        return Scored(out, entropy, (picked_hidden, rows, cols))
    return Scored(out, entropy)

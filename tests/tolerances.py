"""Float tolerances from the arithmetic, for comparing two computations of the same quantity.

Two float paths to one result (fused vs unfused weights, a KV cache vs the whole forward, a
padded batch vs one row, chunked vs plain, another CPU's SIMD width, blocking, thread count or
oneDNN/MKL kernel) differ by rounding alone, and that rounding has a size the arithmetic gives:

* one rounding is off by at most half an ulp, ``u = eps / 2`` relative, with ``eps =
  torch.finfo(dtype).eps`` (``2**-23`` in float32, ``2**-7`` in bfloat16, ``2**-52`` in float64);
* a sum of ``K`` terms (a dot product, a matrix product, a softmax's normaliser), in whatever
  order the kernel adds them, accumulates one rounding per addition, each relative to a partial
  sum. Modelled as independent and mean-zero (Higham & Mary, "A new approach to probabilistic
  rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019) their total is at most
  ``lambda * sqrt(K) * u`` times the largest partial sum, except with probability
  ``~2 exp(-lambda**2 / 2)`` per sum (below 1e-7 at ``lambda = 6``). Two paths are each that far
  from the exact sum, so they differ by at most twice that: ``lambda * sqrt(K) * eps`` times the
  magnitude. This holds for any order of addition, hence on any CPU; it needs no measurement.
  (The worst case, ``K * u`` rather than ``sqrt(K) * u``, is reached only by adversarial data and
  would put tolerances for long reductions within reach of real bugs.)
* a network repeats that per layer: each block's output carries its own relative error, and a
  normalised residual block passes the earlier errors on about unamplified, so ``layers`` blocks
  add up to ``layers`` times one block's error.

``float_tol`` is that bound with ``ulps`` standing for ``lambda`` plus the few ulps of the
elementwise work around the sums (exp, rsqrt, the softmax's division, the rounding of each
product and the cast of the inputs: each within 1-4 ulps in torch's vectorised kernels). A real
bug (a wrong mask, an off-by-one position, a missing normalisation, a stale weight) changes such
results by a fraction of their own size, orders of magnitude above these bounds, so tests stay
able to fail.
"""

from __future__ import annotations

import math

import torch

ULPS = 8.0
"""``lambda`` (6: a 1e-7 chance per sum that rounding alone exceeds the bound) plus ~2 ulps for
the elementwise operations around each sum."""


def eps(dtype: torch.dtype) -> float:
    """Machine epsilon of ``dtype``: the spacing of floats just above 1."""
    return torch.finfo(dtype).eps


def max_abs(*tensors: torch.Tensor) -> float:
    """The largest magnitude among ``tensors`` (the scale of the partial sums their rounding is
    relative to); 1.0 where all are zero or empty, so a tolerance never collapses to 0."""
    values = [float(t.detach().abs().max()) for t in tensors if t.numel()]
    return max([v for v in values if v > 0], default=1.0)


def float_tol(dtype: torch.dtype, reduction_len: int = 1, magnitude: float = 1.0, *, layers: int = 1,
              ulps: float = ULPS) -> float:
    """Absolute tolerance between two float paths to the same values.

    ``ulps * eps(dtype) * sqrt(reduction_len) * layers * magnitude``: the probabilistic bound on
    the rounding of a sum of ``reduction_len`` terms computed in two orders (module docstring),
    relative to ``magnitude`` (the largest partial sum; the reference's largest absolute value
    where its entries are sums of mixed-sign terms), repeated over ``layers`` stacked blocks.

    Args:
        dtype: the precision the compared values were computed in (that of their reductions:
            float32 for a softmax upcast from bfloat16 logits).
        reduction_len: the longest sum behind one value: a dot product's or matrix product's
            inner dimension, a softmax's width, the keys attended over.
        magnitude: the scale the rounding is relative to (e.g. ``max_abs(reference)``).
        layers: how many such stages follow one another (a network's blocks).
        ulps: the constant in front (default ``ULPS``).
    """
    return ulps * eps(dtype) * math.sqrt(max(int(reduction_len), 1)) * max(int(layers), 1) * magnitude


def network_tol(config, dtype: torch.dtype, magnitude: float, seq_len: int = 1, *, ulps: float = ULPS) -> float:
    """Tolerance between two float paths through a decoder-only transformer (``config`` a
    transformers config, or anything with ``hidden_size``, ``intermediate_size`` and
    ``num_hidden_layers``) to outputs of size ``magnitude`` (its logits, or hidden states).

    The longest reduction of a block is its widest matrix product (``hidden_size``,
    ``intermediate_size``) or its attention over up to ``seq_len`` keys; the blocks are
    ``num_hidden_layers`` plus one for the final norm and LM head."""
    widest = max(config.hidden_size, getattr(config, "intermediate_size", 0) or 0, seq_len)
    return float_tol(dtype, widest, magnitude, layers=config.num_hidden_layers + 1, ulps=ulps)


def grad_tol(config, dtype: torch.dtype, magnitude: float, tokens: int, *, ulps: float = ULPS) -> float:
    """Tolerance between two float paths to a decoder's parameter gradients of size
    ``magnitude`` (e.g. ``max_abs`` of the reference gradient of that parameter).

    A weight's gradient sums one term per token (``tokens`` of them), each back-propagated
    through the blocks the forward went through, from the LM head's gradient (a sum over the
    vocabulary): ``network_tol``'s bound with the longest of these sums and layers, and the
    forward and the backward both counted as layers."""
    widest = max(config.hidden_size, getattr(config, "intermediate_size", 0) or 0, tokens,
                 getattr(config, "vocab_size", 0) or 0)
    return float_tol(dtype, widest, magnitude, layers=2 * (config.num_hidden_layers + 1), ulps=ulps)


def logprob_tol(config, dtype: torch.dtype, logit_magnitude: float, seq_len: int = 1, *,
                ulps: float = ULPS) -> float:
    """Tolerance between two float paths to a causal LM's token logprobs.

    ``log p_i = z_i - logsumexp(z)`` moves by at most twice the largest change of the logits
    ``z`` (``logsumexp`` is 1-Lipschitz in the max norm): ``network_tol`` at
    ``logit_magnitude`` (the largest ``|z| / temperature``). The ``logsumexp`` adds the rounding
    of its own sum of ``vocab_size`` positive terms, relative to that sum, i.e. absolute in the
    log; and ``max + log(sum)`` and ``z_i - logsumexp`` round at the size of the result,
    ``|logsumexp| <= logit_magnitude + log(vocab_size)``."""
    return (2 * network_tol(config, dtype, logit_magnitude, seq_len, ulps=ulps)
            + float_tol(dtype, config.vocab_size, 1.0, ulps=ulps)
            + ulps * eps(dtype) * (logit_magnitude + math.log(config.vocab_size)))


def entropy_tol(config, dtype: torch.dtype, logit_magnitude: float, seq_len: int = 1, *,
                logit_spread: float | None = None, ulps: float = ULPS) -> float:
    """Tolerance between two float paths to a next-token distribution's entropy.

    ``dH/dz_v = -p_v (z_v - E_p[z])``, so ``|dH| <= E_p|z - E_p[z]| * max|dz|``, with ``max|dz|``
    ``network_tol`` at ``logit_magnitude``; ``logit_spread`` is that ``E_p|z - E_p[z]|`` (the
    largest over the positions compared; default ``2 * logit_magnitude``, its a-priori bound).
    Plus the rounding of the ``logsumexp`` (as ``logprob_tol``) and of ``-sum_v p_v log p_v``
    (``vocab_size`` terms, partial sums up to ``logit_magnitude + log(vocab_size)``)."""
    spread = 2 * logit_magnitude if logit_spread is None else logit_spread
    dz = network_tol(config, dtype, logit_magnitude, seq_len, ulps=ulps)
    return (spread * dz + float_tol(dtype, config.vocab_size, 1.0, ulps=ulps)
            + float_tol(dtype, config.vocab_size, logit_magnitude + math.log(config.vocab_size), ulps=ulps))


@torch.no_grad()
def logit_magnitude(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    temperature: float = 1.0) -> float:
    """The largest ``|logit| / temperature`` of ``model`` over the attended positions of a batch:
    the scale ``logprob_tol`` and ``entropy_tol`` take (one forward; forward hooks included)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    if attention_mask is not None:
        logits = logits[attention_mask.bool()]
    return max_abs(logits) / temperature


@torch.no_grad()
def _logit_scale(model, sequences, temperature: float) -> tuple[float, float, int]:
    """``(largest |z|, largest E_p|z - E_p[z]|, longest length)`` for ``z = logits / temperature``
    of ``model`` over token ``sequences`` (lists of ids), from one forward over them
    right-padded, in eval mode (forward hooks included)."""
    rows = [list(s) for s in sequences]
    width = max(map(len, rows))
    device = next(model.parameters()).device
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, :len(row)] = torch.tensor(row, dtype=torch.long)
        mask[r, :len(row)] = 1
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
    finally:
        model.train(was_training)
    z = logits[mask.to(device).bool()].float() / temperature
    spread = 0.0
    for chunk in z.split(256):  # [rows, vocab] temporaries a chunk at a time
        p = torch.softmax(chunk, dim=-1)
        spread = max(spread, float((p * (chunk - (p * chunk).sum(-1, keepdim=True)).abs()).sum(-1).max()))
    return max_abs(z), spread, width


def logprob_tol_for(model, sequences, temperature: float = 1.0, *, ulps: float = ULPS) -> float:
    """``logprob_tol`` for ``model``'s logprobs over token ``sequences`` (lists of ids) sampled or
    scored at ``temperature``: the logits' magnitude from one forward over them, the attention's
    length their longest, the dtype the model's."""
    magnitude, _, width = _logit_scale(model, sequences, temperature)
    return logprob_tol(model.config, next(model.parameters()).dtype, magnitude, seq_len=width, ulps=ulps)


def entropy_tol_for(model, sequences, temperature: float = 1.0, *, ulps: float = ULPS) -> float:
    """``entropy_tol`` for ``model``'s next-token entropies over token ``sequences``, as
    ``logprob_tol_for`` (the logits' spread measured on the same forward)."""
    magnitude, spread, width = _logit_scale(model, sequences, temperature)
    return entropy_tol(model.config, next(model.parameters()).dtype, magnitude, seq_len=width,
                       logit_spread=spread, ulps=ulps)


def adam_first_step_tol(grad: torch.Tensor, grad_tol: float, lr: float, param: torch.Tensor, *,
                        adam_eps: float = 1e-8, ulps: float = ULPS) -> torch.Tensor:
    """Elementwise bound on how far apart two first (bias-corrected) AdamW steps from the same
    weights land when their gradients differ by rounding alone, at most ``grad_tol``.

    The step is ``lr * g / (|g| + adam_eps)`` (plus weight decay, the same on both). ``f(x) = x /
    (|x| + e)`` has slope ``e / (|x| + e)**2``, largest at the smallest ``|x|`` within
    ``grad_tol`` of ``grad``, and ``|f| < 1``: the steps differ by at most ``lr * min(2,
    grad_tol * e / ((|g| - grad_tol)+ + e)**2)``. Where a gradient is far above its rounding
    this is far below ``lr``; where it is within rounding of 0 (it nearly cancels) its sign is
    rounding's, and the step may flip: up to ``2 * lr``. Plus the rounding of ``param - step`` in
    the parameters' dtype."""
    g = grad.detach().abs().double()
    low = (g - grad_tol).clamp(min=0.0)
    flip = torch.clamp(grad_tol * adam_eps / (low + adam_eps) ** 2, max=2.0)
    return lr * flip + ulps * eps(param.dtype) * (param.detach().abs().double() + lr)


def rows_of(batch) -> list[list[int]]:
    """The unpadded token ids of each row of a ``TrainBatch`` (``input_ids``, ``attention_mask``),
    for ``logprob_tol_for`` and ``entropy_tol_for``."""
    return [[t for t, m in zip(ids, mask) if m] for ids, mask in zip(batch.input_ids.tolist(),
                                                                     batch.attention_mask.tolist())]


@torch.no_grad()
def head_bound(head: torch.nn.Linear, norm: torch.nn.Module) -> float:
    """A bound on ``|head(norm(x))|`` over every ``x``, for a linear ``head`` after an RMSNorm
    ``norm`` (a decoder's last): the partial sums of its dot products never exceed it either.

    An RMS-normalised vector has L2 norm ``sqrt(width)`` before the gain ``g`` (Gemma's is
    ``1 + w``), so ``|h|_2 <= max|g| sqrt(width)``, and ``|W_v . h + b_v| <= |W_v|_2 |h|_2 +
    |b_v|`` (Cauchy-Schwarz)."""
    gain = (1 + norm.weight) if "Gemma" in type(norm).__name__ else norm.weight
    bias = 0.0 if head.bias is None else float(head.bias.abs().max())
    return float(head.weight.norm(dim=-1).max() * gain.abs().max()) * math.sqrt(head.in_features) + bias


def logit_bound(model) -> float:
    """A bound on a Llama-family causal LM's ``|logits|`` over every input, from its weights:
    ``head_bound`` of its LM head after its final norm, or its final soft cap if lower. For when
    the inputs are not at hand; forward hooks on the head (a logit bias) are the caller's to add."""
    bound = head_bound(model.get_output_embeddings(), model.get_decoder().norm)
    cap = getattr(model.config, "final_logit_softcapping", None)
    return min(bound, cap) if cap else bound


def logprob_tol_any_input(model, seq_len: int, temperature: float = 1.0, *, ulps: float = ULPS) -> float:
    """``logprob_tol`` for ``model``'s logprobs of any sequences up to ``seq_len`` tokens at
    ``temperature``: its logits' size from ``logit_bound``, for checks whose sequences the test
    does not see (a training run's engine check)."""
    magnitude = logit_bound(model) / temperature
    return logprob_tol(model.config, next(model.parameters()).dtype, magnitude, seq_len=seq_len, ulps=ulps)

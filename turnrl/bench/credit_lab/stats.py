"""Bias, variance and signal-to-noise of a gradient estimator, from many independent batches.

``grads [B, D]`` are an estimator's gradients on ``B`` independent batches (flattened
``theta``), ``true [D]`` the exact gradient. Because methods rescale their gradients (a
group std, a token count), direction and scale are reported apart:

* ``cosine``: cosine of the mean estimated gradient to the true one (1: no bias in direction).
* ``scale``: ``<mean, true> / |true|^2`` (1 for an estimator unbiased in scale too).
* ``snr``: ``|mean|^2 / E|g - mean|^2``, the signal-to-noise ratio of one batch's gradient.
* ``nmse``: ``E|g / scale - true|^2 / |true|^2``, the mean squared error per batch once the
  scale is taken out (bias in direction plus variance, relative to the gradient's size).
* ``step_cosine``: the mean cosine of one batch's gradient to the true one, and ``uphill``,
  the fraction of batches whose gradient has a positive inner product with it.
* ``p_unbiased`` / ``p_direction``: Hotelling's T^2 test of ``E[g] = true`` (exactly
  unbiased), and of ``E[g]`` having no component orthogonal to ``true`` (unbiased up to a
  positive or negative scale). Under the null hypothesis each p-value is uniform, so a test at
  level ``alpha`` raises a false alarm with probability ``alpha``. The tests run over the
  coordinates most batches touch (``supported``): a state seen in a few batches has a far
  from normal mean, on which the test's false-alarm rate would not hold.
"""

from __future__ import annotations

import math

import torch

from turnrl.bench.special import f_sf


def hotelling_p(samples: torch.Tensor, scale: float | None = None, rel_tol: float = 1e-8) -> tuple[float, int]:
    """p-value of Hotelling's one-sample T^2 test of ``E[x] = 0`` for ``samples [B, D]``, and the
    rank ``r`` of their covariance it ran in.

    Directions whose variance is below ``rel_tol * scale`` are left out (a softmax's redundant
    logit, a state never visited, round-off left after projecting a direction out); a mean
    that is not 0 along them (beyond round-off, ``1e-5 * sqrt(scale)``) is a certain bias
    (p = 0). ``scale``: a typical squared norm of the quantity the samples come from
    (default: the samples' own mean squared norm).
    """
    x = samples.to(torch.float64)
    b = x.shape[0]
    if scale is None:
        scale = float((x**2).sum(dim=1).mean())
    mean = x.mean(dim=0)
    cov = torch.cov(x.T) if b > 1 else torch.zeros(x.shape[1], x.shape[1], dtype=x.dtype)
    cov = cov.reshape(x.shape[1], x.shape[1])
    eigval, eigvec = torch.linalg.eigh(cov)
    keep = eigval > rel_tol * max(scale, 1e-300)
    r = int(keep.sum())
    z = eigvec[:, keep].T @ mean
    null = mean - eigvec[:, keep] @ z
    if float(null.norm()) > 1e-5 * math.sqrt(max(scale, 1e-300)):  # float32 round-off is far below this
        return 0.0, r
    if r == 0:
        return 1.0, 0
    if b <= r:
        raise ValueError(f"Hotelling's test needs more batches than the covariance's rank: {b} <= {r}")
    t2 = b * float((z**2 / eigval[keep]).sum())
    return f_sf((b - r) / (r * (b - 1)) * t2, r, b - r), r


def supported(grads: torch.Tensor, min_share: float = 0.05, min_batches: int = 30) -> torch.Tensor:
    """``[D]`` bool: coordinates nonzero in at least ``max(min_batches, min_share * B)`` of the
    ``B`` batches. A state visited in a handful of batches has a sample mean far from normal,
    which Hotelling's test assumes: the tests leave such coordinates out."""
    need = max(min_batches, min_share * grads.shape[0])
    return (grads != 0).sum(dim=0) >= need


def summarize(grads: torch.Tensor, true: torch.Tensor) -> dict[str, float]:
    """The figures of the module docstring for ``grads [B, D]`` against ``true [D]`` (the two
    tests over the ``supported`` coordinates; ``tested`` is their share of ``|true|^2``)."""
    g = grads.to(torch.float64).reshape(grads.shape[0], -1)
    t = true.to(torch.float64).reshape(-1)
    mean = g.mean(dim=0)
    t_norm2 = float(t @ t)
    noise = float(((g - mean) ** 2).sum(dim=1).mean()) * g.shape[0] / max(g.shape[0] - 1, 1)
    scale = float(mean @ t) / t_norm2
    mean_norm2 = float(mean @ mean)
    per = g @ t
    g_norms = g.norm(dim=1)
    keep = supported(g)
    gk, tk = g[:, keep], t[keep]
    size2 = float((gk**2).sum(dim=1).mean())  # a batch gradient's squared norm
    unit = tk / max(float(tk.norm()), 1e-300)
    residual = gk - (gk @ unit)[:, None] * unit[None, :]
    return {
        "cosine": float(mean @ t) / math.sqrt(max(mean_norm2 * t_norm2, 1e-300)),
        "scale": scale,
        "snr": mean_norm2 / noise if noise > 0 else math.inf,
        "nmse": float(((g / scale - t) ** 2).sum(dim=1).mean()) / t_norm2 if scale != 0 else math.inf,
        "step_cosine": float((per / (g_norms * math.sqrt(t_norm2)).clamp(min=1e-300)).mean()),
        "uphill": float((per > 0).double().mean()),
        "p_unbiased": hotelling_p(gk - tk[None, :], size2)[0],
        "p_direction": hotelling_p(residual, size2)[0],
        "tested": float(tk @ tk) / t_norm2,
    }

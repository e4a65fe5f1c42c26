"""Bias, variance and signal-to-noise of a gradient estimator, from many independent batches.

``grads [B, D]`` are an estimator's gradients on ``B`` independent batches (flattened
``theta``), ``true [D]`` the exact gradient, ``u = true / |true|``. Each batch's gradient splits
into its projection on the true direction, ``a_b = <g_b, u>``, and the rest, ``r_b = g_b - a_b u``
(orthogonal to ``true``). Because methods rescale their gradients (a group std, a token count),
direction and scale are reported apart:

* ``cosine`` / ``angle``: cosine of the mean gradient to the true one, and the angle between
  them in degrees (1 / 0: no bias in direction).
* ``scale``: ``mean(a) / |true|``, the mean gradient's length along the true one relative to
  it (1 for an estimator unbiased in scale too).
* ``snr``: ``|mean|^2 / E|g - mean|^2``, the signal-to-noise ratio of one batch's gradient.
* ``nmse``: ``E|g / scale - true|^2 / |true|^2``, the mean squared error per batch once the
  scale is taken out (bias in direction plus variance, relative to the gradient's size).
* ``bias2`` and ``variance``: the two parts of ``nmse``: ``|E[g] / scale - true|^2 / |true|^2``
  (the mean's squared distance, less its own sampling noise ``tr Cov(r) / B``; floored at 0)
  and ``tr Cov(g) / scale^2 / |true|^2``. Averaging ``k`` independent batches (``k`` times the
  batch: the same groups, ``k`` times as many) leaves the bias and divides the variance:
  ``nmse_at(k) = bias2 + variance / k`` (exact for an estimator whose statistics stay inside
  a group; batch-wide ones, the critics' whitening, change a little with the batch).
* ``step_cosine``: the mean cosine of one batch's gradient to the true one, and ``uphill``,
  the fraction of batches whose gradient has a positive inner product with it.
* ``p_scale``: Student's t test of ``E[a] = |true|`` (unbiased in scale).
* ``p_direction``: a sign-flip test of ``E[r] = 0`` (no component orthogonal to ``true``:
  unbiased up to a positive or negative scale), ``sign_flip_p``. It weighs the directions in
  which the ``r_b`` spread by at least ``COND`` of the widest one alike (a chi-square-like
  statistic on that well-conditioned projection) and leaves the others out, as it does
  directions of round-off (below ``ROUND_OFF`` of the gradients' second moment); its p-value
  ``(1 + #{flipped >= observed}) / (FLIPS + 1)`` is never below ``1 / (FLIPS + 1)``.
* ``p_unbiased``: ``E[g] = true``, the two tests together (Bonferroni: twice the smaller p).

Under the null hypothesis each p-value is uniform (the sign-flip one on a grid of step
``1 / (FLIPS + 1)``), so a test at level ``alpha`` raises a false alarm with probability about
``alpha``; ``tests/bench/credit_lab/test_stats.py`` checks this on lab gradients.
"""

from __future__ import annotations

import math

import torch

from turnrl.bench.special import f_sf

FLIPS = 4999
"""Random sign flips of the direction test: its smallest p-value is ``1 / (FLIPS + 1)`` = 2e-4."""
COND = 1e-3
"""The direction test weighs the directions whose second moment is at least this share of the
largest one's (condition number at most 1e3) and leaves the rest out."""
ROUND_OFF = 1e-10
"""... and those holding less than this share of the gradients' own second moment: round-off
(an estimator whose every gradient lies along the true one leaves a residual of 1e-16 of it)."""


def sign_flip_p(samples: torch.Tensor, flips: int = FLIPS, seed: int = 0, cond: float = COND,
                floor: float = 0.0) -> float:
    """p-value of the sign-flip test of ``E[x] = 0`` for independent ``samples [B, D]``.

    The samples are whitened by their uncentred second moment ``M = sum_b x_b x_b^T`` within
    the eigendirections whose eigenvalue is at least ``cond`` times the largest: ``z_b = L x_b``.
    The statistic is ``T = |sum_b z_b|^2`` (at most ``B``); each flip draws signs ``e_b = +-1``
    and computes ``|sum_b e_b z_b|^2``. ``M``, and so ``L``, is the same under every flip, so
    under ``E[x] = 0`` with each ``x_b`` symmetric about 0 the test is exact, and without
    symmetry valid as ``B`` grows. Directions left out: those in which the samples hardly vary
    (a softmax's redundant logit, the exact values' float32 round-off), where a standardised
    test would call a bias of 1e-6 of the gradient certain; with ``floor``, also those whose
    eigenvalue is below it (round-off, when every sample is). Returns ``(1 + #{flipped >= T}) /
    (flips + 1)``, in ``[1 / (flips + 1), 1]`` (1 when no direction is left); deterministic for
    a given ``seed``.
    """
    x = samples.to(torch.float64).reshape(samples.shape[0], -1)
    eigval, eigvec = torch.linalg.eigh(x.T @ x)
    keep = (eigval >= cond * eigval.max()) & (eigval > floor) & (eigval > 0)
    if not bool(keep.any()):
        return 1.0
    z = x @ (eigvec[:, keep] / eigval[keep].sqrt())
    observed = float((z.sum(dim=0) ** 2).sum())
    generator = torch.Generator().manual_seed(seed)
    above, chunk = 0, max(1, 2_000_000 // max(z.shape[0], 1))
    for start in range(0, flips, chunk):
        n = min(chunk, flips - start)
        signs = torch.randint(0, 2, (n, z.shape[0]), generator=generator, dtype=torch.float64) * 2 - 1
        above += int((((signs @ z) ** 2).sum(dim=1) >= observed * (1 - 1e-12)).sum())
    return (1 + above) / (flips + 1)


def t_test_p(samples: torch.Tensor, mean: float) -> float:
    """Two-sided p-value of Student's one-sample t test of ``E[x] = mean`` for ``samples [B]``
    (1 when every sample equals ``mean``; 0 only when they are all equal and differ from it)."""
    x = samples.to(torch.float64).reshape(-1)
    b = x.shape[0]
    diff = float(x.mean()) - mean
    sd = float(x.std()) if b > 1 else 0.0
    if sd == 0.0:
        return 1.0 if diff == 0.0 else 0.0
    t = diff / (sd / math.sqrt(b))
    return f_sf(t * t, 1, b - 1)


def angle_degrees(cosine: float) -> float:
    """The angle, in degrees, whose cosine is ``cosine`` (clamped to [-1, 1])."""
    return math.degrees(math.acos(max(-1.0, min(1.0, cosine))))


def nmse_at(row: dict, k: float) -> float:
    """A row's ``nmse`` extrapolated to ``k`` times the batch: ``bias2 + variance / k``."""
    return row["bias2"] + row["variance"] / k


def summarize(grads: torch.Tensor, true: torch.Tensor, flips: int = FLIPS) -> dict[str, float]:
    """The figures of the module docstring for ``grads [B, D]`` against ``true [D]``."""
    g = grads.to(torch.float64).reshape(grads.shape[0], -1)
    t = true.to(torch.float64).reshape(-1)
    b = g.shape[0]
    mean = g.mean(dim=0)
    t_norm2 = float(t @ t)
    t_norm = math.sqrt(t_norm2)
    unit = t / max(t_norm, 1e-300)
    along = g @ unit  # a_b
    residual = g - along[:, None] * unit[None, :]  # r_b
    spread = float(((g - mean) ** 2).sum(dim=1).mean()) * b / max(b - 1, 1)  # tr Cov(g), unbiased
    spread_r = float(((residual - residual.mean(dim=0)) ** 2).sum(dim=1).mean()) * b / max(b - 1, 1)
    scale = float(along.mean()) / t_norm
    mean_norm2 = float(mean @ mean)
    cosine = float(mean @ t) / math.sqrt(max(mean_norm2 * t_norm2, 1e-300))
    off2 = float((residual.mean(dim=0) ** 2).sum())  # |mean r|^2
    size2 = scale * scale * t_norm2
    p_scale = t_test_p(along, t_norm)
    p_direction = sign_flip_p(residual, flips, floor=ROUND_OFF * float((g**2).sum()))
    return {
        "cosine": cosine,
        "angle": angle_degrees(cosine),
        "scale": scale,
        "snr": mean_norm2 / spread if spread > 0 else math.inf,
        "nmse": float(((g / scale - t) ** 2).sum(dim=1).mean()) / t_norm2 if scale != 0 else math.inf,
        "bias2": max(0.0, off2 - spread_r / b) / size2 if scale != 0 else math.inf,
        "variance": spread / size2 if scale != 0 else math.inf,
        "step_cosine": float((along / (g.norm(dim=1)).clamp(min=1e-300)).mean()),
        "uphill": float((along > 0).double().mean()),
        "p_scale": p_scale,
        "p_direction": p_direction,
        "p_unbiased": min(1.0, 2.0 * min(p_scale, p_direction)),
    }

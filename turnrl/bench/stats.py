"""The statistics of a benchmark suite: intervals over seeds, paired differences against a
baseline, samples to a success threshold, and the per-(env, method) summary built from them.

Pure functions of numbers. The only randomness is the bootstrap's, drawn from a NumPy
``Generator`` seeded by the caller (``seed``, default 0), so the same runs give the same
intervals every time the report is written.

Every interval here is a **95% expanded percentile bootstrap interval of a mean over seeds**
(Hesterberg 2015, "What teachers should know about the bootstrap"): the seeds' values are
resampled with replacement ``resamples`` times, each resample's mean taken, and the interval
is a pair of percentiles of those means, cut further out than the plain 2.5th and 97.5th
(``expanded_tail``) because the plain percentile interval is too narrow with few seeds. On
normal data (400 draws each) the plain one covered the true mean 74% of the time with 3
seeds, 87% with 5 and 92% with 10; the expanded one 74% with 3 (no bootstrap does better:
with 3 values it is their range, which misses the mean 1 time in 4), 92-93% with 5, 96% with
10 and 93-96% with 30 (two sets of draws; tests/bench/test_bench_stats.py checks 5 and 30). It describes the spread due to
the seeds (model init, warm start, task order, sampling) and nothing else. With one seed
there is nothing to resample: the interval is NaN (shown as "n/a"), never the point itself.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist

import numpy as np

from turnrl.bench.special import t_ppf

CONFIDENCE = 0.95
RESAMPLES = 10_000


@dataclass
class RunRecord:
    """One training run of the benchmark grid."""

    # the row's label: the algorithm config (turnrl.bench.grid) or the suite's method name
    algorithm: str
    seed: int
    # held-out success before RL and after (mean of the last 3 evaluations)
    before: float
    after: float
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out success)
    wall_s: float = 0.0
    run_dir: str = ""
    # the suite's env name ("" in an algorithm grid)
    env: str = ""
    # the sample budget's unit: episodes sampled per RL step (tasks_per_step * group_size)
    episodes_per_step: int = 0
    # what the run sampled in all: episodes and generated tokens (over every RL step)
    sampled_episodes: int = 0
    sampled_tokens: int = 0

    @property
    def auc(self) -> float:
        """Mean held-out success over the run's evaluations (area under the curve / steps)."""
        return auc(self.evals)


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values and its (expanded percentile) bootstrap interval.

    ``low`` and ``high`` are NaN when ``n < 2`` (one seed gives no interval). A set of equal
    values gives ``low == mean == high`` exactly.
    """

    mean: float
    low: float
    high: float
    n: int

    def format(self, digits: int = 2, signed: bool = False) -> str:
        """``0.62 [0.55, 0.70]``; ``0.62 [n/a]`` without an interval (one seed)."""
        spec = f"{'+' if signed else ''}.{digits}f"
        if math.isnan(self.low):
            return f"{self.mean:{spec}} [n/a]"
        return f"{self.mean:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


def bootstrap_ci(values: Sequence[float], confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                 seed: int = 0) -> Interval:
    """The mean of ``values`` and its expanded percentile bootstrap interval (module docstring).

    Args:
        values: one number per seed (at least one).
        confidence: the interval's nominal coverage, in (0, 1).
        resamples: bootstrap resamples (each: ``len(values)`` draws with replacement).
        seed: seed of the resampling generator (same values and seed: same interval).

    Returns:
        ``Interval(mean, low, high, n)``; ``low`` and ``high`` NaN when there is one value.

    Raises:
        ValueError: On no values, a non-finite value, or ``confidence`` outside (0, 1).
    """
    data = np.asarray(values, dtype=float)
    if data.ndim != 1 or data.size == 0:
        raise ValueError(f"bootstrap_ci needs a flat, non-empty sequence of numbers, got {values!r}")
    if not np.isfinite(data).all():
        raise ValueError(f"bootstrap_ci: values must be finite, got {values!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if data.size == 1:
        return Interval(float(data[0]), math.nan, math.nan, 1)
    if (data == data[0]).all():  # every resample is this value: no rounding of a sum may widen it
        return Interval(float(data[0]), float(data[0]), float(data[0]), int(data.size))
    mean, n = float(data.mean()), int(data.size)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    tail = expanded_tail(n, confidence) * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    # resampled means of equal values can round one ulp off them: keep the interval around the mean
    return Interval(mean, min(float(low), mean), max(float(high), mean), int(data.size))


def expanded_tail(n: int, confidence: float = CONFIDENCE) -> float:
    """The tail probability at which the expanded percentile interval of ``n`` values cuts the
    bootstrap distribution (Hesterberg 2015): ``Phi(-sqrt(n / (n - 1)) * t_{n-1, 1-alpha/2})``
    with ``alpha = 1 - confidence``, instead of the plain percentile interval's ``alpha / 2``.
    It widens the interval by the factors the plain one misses with few values (the t
    quantile, and the bootstrap's ``(n - 1) / n`` variance); it tends to ``alpha / 2`` as ``n``
    grows. For ``n = 5`` at 95%: 0.00095 instead of 0.025."""
    t = t_ppf(1 - (1 - confidence) / 2, n - 1)
    return NormalDist().cdf(-math.sqrt(n / (n - 1)) * t)


def paired_differences(values: Mapping[int, float], baseline: Mapping[int, float]) -> dict[int, float]:
    """``value - baseline`` per seed that both have (seed-matched pairs), in seed order.

    Pairing by seed takes out what the seed does to both runs alike (same init, warm start and
    tasks), so the difference's interval is narrower than the two intervals suggest.
    """
    return {seed: values[seed] - baseline[seed] for seed in sorted(values.keys() & baseline.keys())}


def paired_ci(values: Mapping[int, float], baseline: Mapping[int, float], confidence: float = CONFIDENCE,
              resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    """Mean seed-matched difference ``values - baseline`` and its bootstrap interval (the pairs
    are resampled, not the two sides apart). Identical inputs give exactly 0 [0, 0].

    Raises:
        ValueError: When the two share no seed.
    """
    diffs = paired_differences(values, baseline)
    if not diffs:
        raise ValueError(f"no seed in common for a paired difference: seeds {sorted(values)} vs baseline seeds "
                         f"{sorted(baseline)}")
    return bootstrap_ci(list(diffs.values()), confidence, resamples, seed)


EXACT_FLIPS = 16
"""Up to this many pairs ``exact_paired_p`` enumerates every sign assignment (2^16); beyond,
it draws ``RESAMPLES`` of them."""


def sign_test_p(diffs: Sequence[float]) -> float:
    """Two-sided exact sign test of ``median(diff) = 0``: the probability, under a fair coin per
    pair, of a split of positive and negative differences at least as uneven as this one (ties
    dropped; 1.0 when every pair ties). With 5 pairs all one way it is 0.0625."""
    pos, neg = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    n = pos + neg
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(pos, neg) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def exact_paired_p(diffs: Sequence[float], seed: int = 0) -> float:
    """Two-sided exact paired permutation (sign-flip) test of ``mean(diff) = 0``: the share of
    the ``2^n`` ways to flip the pairs' signs whose mean is at least as far from 0 as the
    observed one (Fisher's; no distribution assumed). Exact up to ``EXACT_FLIPS`` pairs, a
    seeded Monte Carlo estimate beyond. 1.0 when every difference is 0."""
    data = np.asarray(list(diffs), dtype=float)
    n = data.size
    if n == 0 or not np.any(data):
        return 1.0
    observed = abs(data.sum())
    if n <= EXACT_FLIPS:
        signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
    else:
        signs = np.random.default_rng(seed).choice([-1, 1], size=(RESAMPLES, n))
    sums = np.abs(signs @ data)
    return float(np.mean(sums >= observed * (1 - 1e-12)))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input's order: with ``m`` tests sorted by p, the
    ``k``-th smallest becomes ``max_{j <= k} min(1, (m - j + 1) p_(j))``. Rejecting where the
    adjusted p is below ``alpha`` keeps the chance of any false rejection among the ``m``
    below ``alpha``."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    out, running = [1.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        out[i] = running
    return out


@functools.lru_cache(maxsize=64)
def detectable_effect(n: int, comparisons: int = 1, alpha: float = 0.05, power: float = 0.8, trials: int = 2000,
                      seed: int = 0) -> float:
    """The smallest mean paired difference, in standard deviations of the per-seed differences,
    that ``n`` seed pairs detect with probability ``power``: ``exact_paired_p`` below
    ``alpha / comparisons`` (the Bonferroni bound of Holm's first step, so conservative for
    Holm) in ``trials`` simulated experiments of normal differences. Found by bisection with one
    set of draws for every effect tried (common random numbers: the estimate is monotone).
    ``inf`` when even an effect of 100 sd would not do (``n`` too small for the level: with 5
    pairs no p is below 0.0625). The suite's power analysis: times a method's measured sd of
    differences it is the difference the suite could have detected."""
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((trials, n))
    if n <= EXACT_FLIPS:
        signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
    else:
        signs = rng.choice([-1, 1], size=(RESAMPLES, n))

    def rejects(effect: float) -> float:
        data = noise + effect
        p = np.mean(np.abs(data @ signs.T) >= np.abs(data.sum(axis=1, keepdims=True)) * (1 - 1e-12), axis=1)
        return float(np.mean(p < alpha / comparisons))

    low, high = 0.0, 100.0
    if rejects(high) < power:
        return math.inf
    for _ in range(20):
        mid = (low + high) / 2
        low, high = (mid, high) if rejects(mid) < power else (low, mid)
    return high


def samples_to_threshold(evals: Sequence[tuple[int, float]], threshold: float, episodes_per_step: int) -> int | None:
    """Sampled episodes until held-out success first reaches ``threshold``.

    Args:
        evals: ``(RL step, held-out success)`` in step order (step 0: before RL).
        threshold: the success to reach (``>=``).
        episodes_per_step: episodes sampled per RL step (``tasks_per_step * group_size``).

    Returns:
        ``step * episodes_per_step`` of the first evaluation at or above the threshold (0 when
        the policy starts there), or None when no evaluation reaches it.
    """
    for step, success in evals:
        if success >= threshold:
            return step * episodes_per_step
    return None


def median_samples(samples: Sequence[int | None]) -> float | None:
    """Median over seeds of ``samples_to_threshold``, a seed that never reached counting as
    infinitely many samples; None ("not reached") when the median is such a seed, i.e. when
    half the seeds or more did not reach it (so a median never hides the seeds that failed).
    """
    if not samples:
        raise ValueError("median_samples needs at least one seed")
    median = float(np.median([math.inf if s is None else s for s in samples]))
    return None if math.isinf(median) or math.isnan(median) else median


def auc(evals: Sequence[tuple[int, float]]) -> float:
    """Mean held-out success over a run's evaluations (area under the curve / its length)."""
    return sum(s for _, s in evals) / len(evals) if evals else 0.0


@dataclass(frozen=True)
class MethodSummary:
    """What the suite reports for one method on one env, over its seeds."""

    env: str
    method: str
    seeds: tuple[int, ...]
    # final held-out success (mean of the last 3 evaluations per run), mean and interval over seeds
    final: Interval
    # seed-matched final - baseline's final; None for the baseline itself
    diff: Interval | None
    # of the seeds paired with the baseline's: how many end above it and how many below (an equal
    # final, e.g. a method that reduces to the baseline, counts as neither); 0 for the baseline
    ahead: int
    behind: int
    # of those pairs: the exact sign test's p, the exact paired permutation test's p, and the
    # latter Holm-adjusted over the env's comparisons with the baseline (None for the baseline)
    p_sign: float | None
    p_exact: float | None
    p_holm: float | None
    # the power analysis: the smallest mean difference these seeds detect with 80% power after
    # the env's multiple-comparison correction (detectable_effect x the sd of the per-seed
    # differences; None for the baseline or with fewer than 2 pairs; inf: no difference could be)
    detectable: float | None
    # success threshold of samples_to_threshold, and its median over seeds (None: not reached)
    threshold: float
    samples_median: float | None
    reached: int
    # mean held-out success over the evaluations, mean and interval over seeds
    auc: Interval
    # means per run
    tokens: float
    wall_s: float
    # ``diff`` at confidence 1 - 0.05/m over the env's m comparisons with the baseline (Bonferroni):
    # the m intervals hold their true differences together with probability >= 95%, so one that
    # excludes 0 is a difference after the correction (the interval's counterpart of a Holm p
    # below 0.05; the bootstrap and the exact test can disagree at the edge). None: the baseline
    diff_adjusted: Interval | None = None


def growth_exponent(sizes: Sequence[float], costs: Sequence[float]) -> float:
    """``k`` of ``cost ~ size^k``: the least-squares slope of ``log cost`` on ``log size`` (the
    scaling benchmarks' figure: 1 = linear, 2 = quadratic). Needs two distinct positive sizes
    and positive costs."""
    if len(sizes) != len(costs) or len(set(sizes)) < 2 or min(sizes) <= 0 or min(costs) <= 0:
        raise ValueError(f"need two or more distinct positive sizes and as many positive costs; got {sizes}, {costs}")
    lx, ly = np.log(np.asarray(sizes, float)), np.log(np.asarray(costs, float))
    return float(((lx - lx.mean()) * (ly - ly.mean())).sum() / ((lx - lx.mean()) ** 2).sum())


def summarize(records: Sequence[RunRecord], baseline: str, thresholds: Mapping[str, float],
              seed: int = 0) -> list[MethodSummary]:
    """One ``MethodSummary`` per (env, method), in the records' first-seen order.

    Args:
        records: finished runs (``env``, ``algorithm`` = method name, ``seed`` and figures set).
        baseline: the method the paired differences are taken against.
        thresholds: env name -> success threshold.
        seed: seed of every bootstrap.

    Raises:
        ValueError: On two runs of one (env, method, seed), an env without a threshold, or a
            method whose seeds share none with the baseline's.
    """
    by_cell: dict[tuple[str, str], dict[int, RunRecord]] = {}
    for r in records:
        runs = by_cell.setdefault((r.env, r.algorithm), {})
        if r.seed in runs:
            raise ValueError(f"two runs of env {r.env!r}, method {r.algorithm!r}, seed {r.seed}")
        runs[r.seed] = r
    out = []
    pairs: dict[int, tuple[dict, dict]] = {}  # index in out -> (finals, baseline's finals) of a compared method
    for (env, method), runs in by_cell.items():
        if env not in thresholds:
            raise ValueError(f"no success threshold for env {env!r} (thresholds for {sorted(thresholds)})")
        final = {s: r.after for s, r in runs.items()}
        base = by_cell.get((env, baseline))
        diff, ahead, behind, p_sign, p_exact, spread = None, 0, 0, None, None, None
        if method != baseline and base is not None:
            base_final = {s: r.after for s, r in base.items()}
            diff = paired_ci(final, base_final, seed=seed)
            pairs[len(out)] = (final, base_final)
            deltas = list(paired_differences(final, base_final).values())
            ahead, behind = sum(d > 0 for d in deltas), sum(d < 0 for d in deltas)
            p_sign, p_exact = sign_test_p(deltas), exact_paired_p(deltas, seed)
            spread = float(np.std(deltas, ddof=1)) if len(deltas) > 1 else None
        samples = [samples_to_threshold(r.evals, thresholds[env], r.episodes_per_step) for r in runs.values()]
        out.append(MethodSummary(
            env=env, method=method, seeds=tuple(sorted(runs)), final=bootstrap_ci(list(final.values()), seed=seed),
            diff=diff, ahead=ahead, behind=behind, p_sign=p_sign, p_exact=p_exact, p_holm=None, detectable=spread,
            threshold=thresholds[env], samples_median=median_samples(samples),
            reached=sum(s is not None for s in samples),
            auc=bootstrap_ci([auc(r.evals) for r in runs.values()], seed=seed),
            tokens=float(np.mean([r.sampled_tokens for r in runs.values()])),
            wall_s=float(np.mean([r.wall_s for r in runs.values()]))))
    for env in dict.fromkeys(m.env for m in out):  # Holm over each env's comparisons with the baseline
        tested = [i for i, m in enumerate(out) if m.env == env and m.p_exact is not None]
        for i, adjusted in zip(tested, holm([out[i].p_exact for i in tested])):
            sd = out[i].detectable  # the sd of the differences, until scaled here
            detectable = None if sd is None else detectable_effect(len(out[i].seeds), len(tested)) * sd
            adjusted_ci = paired_ci(*pairs[i], confidence=1 - (1 - CONFIDENCE) / len(tested), seed=seed)
            out[i] = replace(out[i], p_holm=adjusted, detectable=detectable, diff_adjusted=adjusted_ci)
    return out


def pointwise_band(curves: Sequence[Sequence[float]], seed: int = 0) -> tuple[list[float], list[float]] | None:
    """The bootstrap interval of the mean over seeds at each evaluation of equal-length curves
    (one per seed): ``(lows, highs)``, or None for a single curve."""
    if len(curves) < 2:
        return None
    intervals = [bootstrap_ci(column, seed=seed) for column in zip(*curves)]
    return [i.low for i in intervals], [i.high for i in intervals]

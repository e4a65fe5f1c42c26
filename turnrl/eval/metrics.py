"""The figures of ``turnrl eval`` that are more than a mean, as pure functions: pass@k (the
unbiased estimator), distinct-n and the agreement of a learned reward model with the verifier.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k of one task (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code", eq. 1): the probability that at least one of ``k``
    samples drawn without replacement from ``n`` samples, ``c`` of them correct, is correct,

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i).

    Computed exactly, in integers (``math.comb``) and one ``Fraction``, then rounded once to
    the nearest float: no overflow for large ``n`` (Python integers are unbounded) and no
    rounding error accumulated along the product. ``pass_at_k(n, c, 1) == c / n`` exactly.

    Args:
        n: samples drawn for the task (``n >= 1``).
        c: how many of them are correct (``0 <= c <= n``).
        k: the budget (``1 <= k <= n``).

    Returns:
        A float in [0, 1]: 0.0 when ``c == 0``, 1.0 when ``n - c < k`` (every draw of ``k``
        holds a correct sample).

    Raises:
        ValueError: If ``k > n`` (pass@k needs at least ``k`` samples per task: raise the
            sample count), or ``n``, ``c``, ``k`` are out of range.
    """
    return float(_pass_at_k_exact(n, c, k))


def mean_pass_at_k(correct: Sequence[int], n: int, k: int) -> float:
    """pass@k of a task set: the mean over tasks of ``pass_at_k(n, c_i, k)``, summed exactly
    and rounded once, so that ``mean_pass_at_k(c, n, 1) == sum(c) / (len(c) * n)`` exactly.

    Args:
        correct: ``[tasks]`` correct samples of each task, each of ``n`` samples.
        n: samples per task; k: the budget (``1 <= k <= n``).

    Raises:
        ValueError: On no tasks, or as ``pass_at_k``.
    """
    if not correct:
        raise ValueError("mean_pass_at_k needs at least one task's sample counts, got none")
    return float(sum((_pass_at_k_exact(n, c, k) for c in correct), Fraction(0)) / len(correct))


def _pass_at_k_exact(n: int, c: int, k: int) -> Fraction:
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass@k needs n >= 1 samples and 0 <= c <= n correct ones, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs at least k={k} samples per task, got n={n}; draw more samples per task "
                         f"(turnrl eval --samples {max(k, 1)}) or ask for k <= {n}")
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct-n (Li et al. 2016): distinct word n-grams over all word n-grams of ``texts``.

    Words are the whitespace-separated pieces of each text (so the figure does not depend on a
    tokenizer and compares across models); n-grams never cross from one text to the next. The
    texts are pooled: with several samples of one task, copies of one reply lower the figure.

    Args:
        texts: the texts (e.g. every sampled assistant turn of a set of episodes).
        n: the n-gram length (``n >= 1``).

    Returns:
        A float in (0, 1] (1.0: no n-gram repeats), or 0.0 when the texts hold no n-gram.

    Raises:
        ValueError: If ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"distinct-n needs n >= 1, got {n}")
    grams = [tuple(words[i:i + n]) for words in (text.split() for text in texts) for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def pairwise_agreement(proxy: Sequence[float], verifier: Sequence[float]) -> float | None:
    """How often a learned reward model orders two episodes as the verifier does: over every
    pair of episodes whose verifier returns differ, the fraction the proxy ranks the same way
    (a proxy tie counts 1/2). 1.0: the proxy sorts episodes as the verifier does; 0.5: chance.

    Threshold-free, which suits a Bradley-Terry reward model: its scores have an arbitrary
    offset and scale, so "proxy > 0" means nothing, but its order is what it was trained on.
    This is the ROC AUC of the proxy for a pass/fail verifier.

    Args:
        proxy: ``[N]`` the reward model's return of each episode.
        verifier: ``[N]`` the env's own return of the same episodes.

    Returns:
        The fraction, or None when every verifier return is equal (no pair to order).

    Raises:
        ValueError: If the lengths differ.
    """
    _same_length(proxy, verifier)
    agree, pairs = 0.0, 0
    for i in range(len(proxy)):
        for j in range(i + 1, len(proxy)):
            if verifier[i] == verifier[j]:
                continue
            pairs += 1
            d = (proxy[i] - proxy[j]) * (verifier[i] - verifier[j])
            agree += 1.0 if d > 0 else 0.5 if d == 0 else 0.0
    return agree / pairs if pairs else None


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """The Pearson correlation of ``x`` and ``y``, or None when either is constant (or fewer
    than 2 values).

    Raises:
        ValueError: If the lengths differ.
    """
    _same_length(x, y)
    if len(x) < 2:
        return None
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def _same_length(a: Sequence[float], b: Sequence[float]) -> None:
    if len(a) != len(b):
        raise ValueError(f"one value per episode in both sequences, got {len(a)} and {len(b)}")

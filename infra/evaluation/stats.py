"""The statistics of an evaluation (pure): Wilson interval, exact McNemar, paired bootstrap, Holm's
step-down correction and the unbiased pass@k estimator. Checked against hand-computed values and
scipy in tests/unit/evaluation/test_stats.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Z_95 = 1.959963984540054  # two-sided 95% normal quantile
Alternative = Literal["two-sided", "less", "greater"]
ALTERNATIVES = ("two-sided", "less", "greater")
MAX_RESAMPLES = 1_000_000  # a paired bootstrap's resamples: 8 MB of means, bounded time per pair


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion; (nan, nan) without trials.

    >>> [round(x, 4) for x in wilson_interval(8, 10)]
    [0.4902, 0.9433]
    >>> wilson_interval(0, 0)
    (nan, nan)
    """
    if trials <= 0:
        return (math.nan, math.nan)
    if not 0 <= successes <= trials:
        raise ValueError(f"successes={successes}: must be between 0 and trials={trials}")
    p = successes / trials
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    return (max(0.0, centre - half), min(1.0, centre + half))


def binomial_tail(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exact (integer arithmetic).

    >>> binomial_tail(0, 3), binomial_tail(3, 3)
    (0.125, 1.0)
    """
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2**n


@dataclass(frozen=True)
class McNemar:
    """Discordant pairs of a paired success comparison and the exact test's p-value.
    `a_only`: pairs that A solved and B did not; `b_only`: the reverse."""

    a_only: int
    b_only: int
    p_value: float
    alternative: str = "two-sided"


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool], alternative: Alternative = "two-sided") -> McNemar:
    """Exact McNemar test on paired successes: a binomial test (p = 1/2) on the discordant pairs.
    `alternative` "less": A's success rate is lower than B's; "greater": higher.

    >>> mcnemar_exact([1, 1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0, 0])
    McNemar(a_only=6, b_only=0, p_value=0.03125, alternative='two-sided')
    >>> mcnemar_exact([1, 0], [1, 0]).p_value
    1.0
    >>> mcnemar_exact([0, 0, 0], [1, 1, 1], "less").p_value
    0.125
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes: {len(a)} and {len(b)} episodes (must be equal)")
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative={alternative!r}: expected one of {ALTERNATIVES}")
    a_only = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    b_only = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    n = a_only + b_only
    if alternative == "less":
        p = binomial_tail(a_only, n)
    elif alternative == "greater":
        p = binomial_tail(b_only, n)
    else:
        p = min(1.0, 2 * binomial_tail(min(a_only, b_only), n))
    return McNemar(a_only, b_only, p, alternative)


@dataclass(frozen=True)
class Bootstrap:
    """Mean paired difference (A - B), its percentile interval and the bootstrap p-value."""

    difference: float
    low: float
    high: float
    p_value: float
    resamples: int
    confidence: float = 0.95


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], resamples: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> Bootstrap:
    """Paired bootstrap of the mean difference A - B: resample the pairs with replacement (seeded),
    take the percentile interval, and the two-sided p-value of "no difference" as the share of
    resampled means at least as far from the observed mean as the observed mean is from 0 (the
    resampled distribution shifted to the null), counted as (1 + hits) / (1 + resamples).

    >>> r = paired_bootstrap([1.0, 0.5, 1.0, 0.0], [1.0, 0.5, 1.0, 0.0], resamples=200)
    >>> (r.difference, r.low, r.high, r.p_value)
    (0.0, 0.0, 0.0, 1.0)
    >>> paired_bootstrap([1.0] * 20, [0.0] * 20, resamples=200).p_value < 0.01
    True
    """
    import numpy as np

    if len(a) != len(b):
        raise ValueError(f"paired rewards: {len(a)} and {len(b)} episodes (must be equal)")
    if not 1 <= resamples <= MAX_RESAMPLES:
        raise ValueError(f"resamples={resamples}: must be between 1 and {MAX_RESAMPLES}")
    if seed < 0:
        raise ValueError(f"seed={seed}: must be >= 0")
    if not a:
        return Bootstrap(math.nan, math.nan, math.nan, math.nan, resamples, confidence)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence}: must be between 0 and 1")
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    observed = float(d.mean())
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, 1000):  # bounded memory: 1000 resamples of n pairs at a time
        stop = min(start + 1000, resamples)
        means[start:stop] = d[rng.integers(0, len(d), size=(stop - start, len(d)))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    # the tolerance keeps rounding noise from counting a zero-variance sample as "further away"
    hits = int(np.sum(np.abs(means - observed) >= abs(observed) - 1e-12))
    return Bootstrap(
        round(observed, 12), round(float(low), 12), round(float(high), 12),
        min(1.0, (1 + hits) / (1 + resamples)), resamples, confidence,
    )  # fmt: skip


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (family-wise error control).
    A NaN p-value (no test possible) stays NaN and does not count as a test.

    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    >>> holm([])
    []
    """
    ranked = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m = len(ranked)
    out = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(ranked):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = round(running, 12)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate of one task from `n` samples of which `c` succeeded:
    1 - C(n - c, k) / C(n, k) (Chen et al. 2021), the chance that k samples drawn without
    replacement hold at least one success.

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 2), pass_at_k(4, 0, 4), pass_at_k(4, 2, 3)
    (0.25, 0.5, 0.0, 1.0)
    """
    if not 0 <= c <= n:
        raise ValueError(f"successes={c}: must be between 0 and samples={n}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k}: must be between 1 and the samples per task ({n})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)

"""Statistics of a comparison: the confidence interval of a perplexity delta
and summaries of per-token KL divergences."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvlib.gates import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, CI_LEVEL, MIN_CI_UNITS


def ppl_delta(base_nll: np.ndarray, comp_nll: np.ndarray, counts: np.ndarray) -> float:
    """exp(sum comp / n) - exp(sum base / n): the perplexity delta of pooled windows."""
    n = counts.sum()
    return math.exp(comp_nll.sum() / n) - math.exp(base_nll.sum() / n) if n else math.nan


def bootstrap_delta_ci(base_nll, comp_nll, counts, samples: int = BOOTSTRAP_SAMPLES, level: float = CI_LEVEL,
                       seed: int = BOOTSTRAP_SEED, min_units: int = MIN_CI_UNITS) -> tuple[float, float]:
    """Percentile bootstrap CI of the pooled perplexity delta, resampling windows.

    ``base_nll``/``comp_nll`` are each window's summed target NLLs, ``counts`` its
    target counts. Windows are the resampling unit because neighbouring tokens
    share a context (and a compressed cache); NaN with fewer than ``min_units`` windows
    (kvlib.gates.MIN_CI_UNITS says why), where an interval would be degenerate.
    """
    b, c, n = (np.asarray(a, dtype=np.float64) for a in (base_nll, comp_nll, counts))
    if b.size == 0 or b.size < min_units:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, b.size, size=(samples, b.size))
    tot = n[idx].sum(1)
    # math.exp, as the point estimate uses: NumPy's SIMD exp may differ in the last bit.
    deltas = np.array([math.exp(cs / t) - math.exp(bs / t) for cs, bs, t in
                       zip(c[idx].sum(1).tolist(), b[idx].sum(1).tolist(), tot.tolist())])
    alpha = (1 - level) / 2
    lo = np.quantile(deltas, alpha, method="lower")  # actual resampled deltas, never interpolated
    hi = np.quantile(deltas, 1 - alpha, method="higher")
    return float(lo), float(hi)


@dataclass(frozen=True)
class KLDSummary:
    """KL(exact || compressed) of the next-token distribution, over scored tokens (nats)."""

    mean: float
    median: float
    p99: float
    tokens: int

    @classmethod
    def of(cls, values) -> "KLDSummary":
        v = np.asarray(values, dtype=np.float64)
        if v.size == 0:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(float(v.mean()), float(np.median(v)), float(np.quantile(v, 0.99)), int(v.size))


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN below 3 finite pairs."""
    pairs = [(a, b) for a, b in zip(x, y) if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]
    if len(pairs) < 3:
        return math.nan

    def ranks(v: np.ndarray) -> np.ndarray:
        order = v.argsort(kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for val in np.unique(v):  # ties share their mean rank
            r[v == val] = r[v == val].mean()
        return r

    a, b = ranks(np.array([p[0] for p in pairs])), ranks(np.array([p[1] for p in pairs]))
    if a.std() == 0 or b.std() == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])

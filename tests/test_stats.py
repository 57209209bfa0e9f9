"""The confidence interval of the gated delta: a percentile bootstrap over windows, and none from
too few windows (never a 'robust' verdict on a degenerate interval)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvlib.gates import MIN_CI_UNITS, robust
from kvlib.runs.sweep import SchemeResult, recommend
from kvlib.runs.validate import ci_text
from kvlib.scoring.stats import bootstrap_delta_ci, ppl_delta


def _windows(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    counts = np.full(n, 512.0)
    base = counts * rng.uniform(2.2, 2.6, n)
    return base, base + counts * rng.uniform(0.0, 0.04, n), counts


@pytest.mark.parametrize("n", range(1, MIN_CI_UNITS))
def test_no_ci_below_the_minimum(n):
    lo, hi = bootstrap_delta_ci(*_windows(n))
    assert math.isnan(lo) and math.isnan(hi)
    assert not robust(hi)  # a pass without a CI is never robust


def test_one_window_is_not_a_robust_interval():
    """kv-validate --max-windows 2 once printed 'CI +0.4846 to +0.4846' and called it robust."""
    base, comp, n = _windows(1)
    assert math.isnan(bootstrap_delta_ci(base, comp, n)[1])
    assert "no CI" in ci_text(*bootstrap_delta_ci(base, comp, n))


def test_ci_from_enough_windows_brackets_the_estimate_and_is_not_degenerate():
    base, comp, n = _windows(MIN_CI_UNITS + 3)
    lo, hi = bootstrap_delta_ci(base, comp, n)
    d = ppl_delta(base, comp, n)
    assert lo < d < hi
    per_window = [ppl_delta(base[i:i + 1], comp[i:i + 1], n[i:i + 1]) for i in range(len(n))]
    assert lo > min(per_window) and hi < max(per_window)  # not one window's delta at either end


def test_the_minimum_is_where_one_unit_alone_is_rare():
    """The rule in gates.py: a resample of one unit n times has probability n * n**-n; from the
    minimum on it is below a tenth of the 2.5 % tail, just below it is not."""
    alone = lambda n: n * float(n) ** -n  # noqa: E731
    assert alone(MIN_CI_UNITS) < 0.025 / 10 <= alone(MIN_CI_UNITS - 1)


def test_the_bootstrap_is_a_function_of_its_inputs():
    w = _windows(9)
    assert bootstrap_delta_ci(*w) == bootstrap_delta_ci(*w)


def test_no_ci_means_no_recommendation_and_says_why():
    s = SchemeResult(name="int4", spec="sym4/g64", kind="kvq", bits_per_element=4.25, context_delta=0.1,
                     ci_low=math.nan, ci_high=math.nan, passed=True, robust=False)
    assert s.verdict_text.startswith("PASS (no CI")
    name, sentence = recommend([s])
    assert name is None and "no CI" in sentence

"""The gates and their settings, in one place: the validation, the sweep and
the reports read them from here and never repeat the numbers."""

from __future__ import annotations

import numpy as np

# Pass when the perplexity delta over the tokens that attended to a compressed
# context is below this (the KVQuant-style gate of the design documents).
PPL_DELTA_THRESHOLD = 0.5

# The confidence interval of that delta: a percentile bootstrap over windows.
CI_LEVEL = 0.95
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0

# No CI from fewer windows than this. The resampling unit is a window (its tokens share one compressed
# context, so they are not independent). With n units, a resample made of one unit n times has
# probability n * n**-n: 1.0 for n = 1 (the "interval" is the point), 0.22 for 3, 0.016 for 4 and
# 0.0016 for 5. From 5 on it is far below the 2.5 % tail a 95 % percentile interval reads, so its
# bounds are not a single window's delta; below 5 no CI is reported and no result is "robust".
MIN_CI_UNITS = 5

CI_METHOD = (f"{CI_LEVEL:.0%} percentile bootstrap over windows ({BOOTSTRAP_SAMPLES} resamples, seed "
             f"{BOOTSTRAP_SEED}): windows with a compressed context are resampled with replacement and the "
             "gated delta recomputed from their summed per-token NLLs, so tokens of one window stay together; "
             f"none with fewer than {MIN_CI_UNITS} such windows (then no result is called robust)")


# A search over many settings (an engine's knobs) that stops at the first robust pass picks the first
# of many noisy intervals to fall under the gate; its answer stands only if it passes robustly again
# on this many fresh windows (the zoo goals' 21), none of which the search scored.
CONFIRM_WINDOWS = 21


def verdict(delta: float, threshold: float = PPL_DELTA_THRESHOLD) -> bool:
    """The gate: the gated perplexity delta is below the threshold."""
    return delta < threshold


def robust(ci_high: float, threshold: float = PPL_DELTA_THRESHOLD) -> bool:
    """Passes with confidence: the CI's upper bound is below the threshold too (never without a CI)."""
    return ci_high < threshold  # False for NaN: too few windows for a CI


# RULER (kvlib.checks.ruler): a scheme's score on a task and length is compared only where the
# exact cache can do the task; below this accuracy (percent) the cell is a floor, shown as such.
RULER_EXACT_FLOOR = 50.0


def ruler_qualifies(exact_accuracy: float, floor: float = RULER_EXACT_FLOOR) -> bool:
    """Whether the exact cache does a task well enough at a length for schemes to be compared there."""
    return exact_accuracy >= floor


def _mean_percent(scores: list[float]) -> float:
    """The accuracy of ``scores`` as RULER's scoring computes it (float64 mean × 100), so a bound
    decided on partial scores agrees with the accuracy computed at the end."""
    return float(np.asarray(scores, dtype=np.float64).mean() * 100)


def ruler_sure(exact_scores: list[float], samples: int, floor: float = RULER_EXACT_FLOOR) -> bool:
    """Whether the exact cache qualifies on a cell of ``samples`` samples whatever the rest score
    (a score of 0 on every one still to come would leave it at the floor or above)."""
    return ruler_qualifies(_mean_percent(list(exact_scores) + [0.0] * (samples - len(exact_scores))), floor)


def ruler_out_of_reach(exact_scores: list[float], samples: int, floor: float = RULER_EXACT_FLOOR) -> bool:
    """Whether the exact cache can no longer qualify on a cell of ``samples`` samples: a score of 1
    on every one still to come would leave its accuracy below the floor (so the rest need not run)."""
    return not ruler_qualifies(_mean_percent(list(exact_scores) + [1.0] * (samples - len(exact_scores))), floor)

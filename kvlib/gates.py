"""The gates and their settings, in one place: the validation, the sweep and
the reports read them from here and never repeat the numbers."""

from __future__ import annotations

# Pass when the perplexity delta over the tokens that attended to a compressed
# context is below this (the KVQuant-style gate of the design documents).
PPL_DELTA_THRESHOLD = 0.5

# The confidence interval of that delta: a percentile bootstrap over windows.
CI_LEVEL = 0.95
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0

CI_METHOD = (f"{CI_LEVEL:.0%} percentile bootstrap over windows ({BOOTSTRAP_SAMPLES} resamples, seed "
             f"{BOOTSTRAP_SEED}): windows with a compressed context are resampled with replacement and the "
             "gated delta recomputed from their summed per-token NLLs, so tokens of one window stay together")


def verdict(delta: float, threshold: float = PPL_DELTA_THRESHOLD) -> bool:
    """The gate: the gated perplexity delta is below the threshold."""
    return delta < threshold


def robust(ci_high: float, threshold: float = PPL_DELTA_THRESHOLD) -> bool:
    """Passes with confidence: the CI's upper bound is below the threshold too."""
    return ci_high < threshold

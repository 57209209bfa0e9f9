"""RULER's scoring (``scripts/eval/synthetic/constants.py`` and ``evaluate.py`` at commit c3f5e3b):
a case-insensitive substring test of each reference in the stripped prediction; ``string_match_all``
credits the fraction of references found, ``string_match_part`` any; accuracy is the mean over
samples × 100. kvlib adds a percentile bootstrap CI over samples, and for the average over tasks a
bootstrap that resamples each task's samples on their own (the tasks are fixed, not drawn).
"""

from __future__ import annotations

import math
import re
from typing import Callable, Sequence

import numpy as np

from kvlib.gates import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, CI_LEVEL

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """evaluate.py lines 50-58: strip, control characters to newlines, strip."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    p = prediction.lower()
    return sum(r.lower() in p for r in references) / len(references)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    p = prediction.lower()
    return max(float(r.lower() in p) for r in references)


METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "string_match_all": string_match_all, "string_match_part": string_match_part}


def score(metric: str, prediction: str, references: Sequence[str]) -> float:
    """One sample's score in [0, 1]."""
    return METRICS[metric](postprocess(prediction), references)


def accuracy(scores: Sequence[float]) -> tuple[float, float, float]:
    """(mean, CI low, CI high) in percent; the CI is NaN with fewer than 2 samples."""
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0:
        return math.nan, math.nan, math.nan
    if s.size < 2:
        return float(s.mean() * 100), math.nan, math.nan
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = s[rng.integers(0, s.size, size=(BOOTSTRAP_SAMPLES, s.size))].mean(1) * 100
    a = (1 - CI_LEVEL) / 2
    return float(s.mean() * 100), float(np.quantile(means, a, method="lower")), \
        float(np.quantile(means, 1 - a, method="higher"))


def average(per_task: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """The mean over tasks of each task's accuracy (RULER's average), with a CI that resamples
    every task's samples on their own, in percent."""
    tasks = [np.asarray(t, dtype=np.float64) for t in per_task if len(t)]
    if not tasks:
        return math.nan, math.nan, math.nan
    point = float(np.mean([t.mean() for t in tasks]) * 100)
    if any(t.size < 2 for t in tasks):
        return point, math.nan, math.nan
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    boot = np.mean([t[rng.integers(0, t.size, size=(BOOTSTRAP_SAMPLES, t.size))].mean(1) for t in tasks], axis=0) * 100
    a = (1 - CI_LEVEL) / 2
    return point, float(np.quantile(boot, a, method="lower")), float(np.quantile(boot, 1 - a, method="higher"))

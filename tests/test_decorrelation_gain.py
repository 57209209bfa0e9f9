"""benchmarks/decorrelation_gain.py's rate-distortion arithmetic against hand-computed cases."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location("decorrelation_gain", Path(__file__).parents[1] / "benchmarks" / "decorrelation_gain.py")
dg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dg)


def test_equal_variances_save_nothing():
    assert dg.saving(np.full(64, 3.0), 2.0) == pytest.approx(0.0, abs=1e-9)


def test_all_components_above_water_save_half_log_of_mean_over_geometric_mean():
    # variances 4 and 1 at 2 bits: both stay above the water level, so the saving is the high-rate
    # coding gain 0.5 log2(AM / GM) = 0.5 log2(2.5 / 2)
    assert dg.saving(np.array([4.0, 1.0]), 2.0) == pytest.approx(0.5 * math.log2(2.5 / 2.0), abs=1e-6)


def test_a_component_below_water_gets_no_bits():
    # variances 1 and 1e-6 at 1 bit a component on average: all 2 bits go to the first, whose
    # distortion is 2^-4; the second costs its variance
    assert dg.water_fill(np.array([1.0, 1e-6]), 1.0) == pytest.approx((2.0 ** -4 + 1e-6) / 2, rel=1e-6)


def test_the_basis_is_fitted_on_calibration_rows_only():
    rng = np.random.default_rng(0)
    cal = rng.normal(size=(4000, 2)) @ np.array([[3.0, 0.0], [0.0, 0.5]])
    rot = np.array([[math.cos(0.7), -math.sin(0.7)], [math.sin(0.7), math.cos(0.7)]])
    ev = rng.normal(size=(4000, 2)) @ np.array([[3.0, 0.0], [0.0, 0.5]])
    assert sorted(dg.component_variances(cal, ev, "pca")) == pytest.approx([0.25, 9.0], rel=0.1)
    # the same evaluation rows rotated away from the calibrated basis lose the concentration
    spread = sorted(dg.component_variances(cal, ev @ rot, "pca"))
    assert spread[0] > 1.0 and spread[1] < 8.5

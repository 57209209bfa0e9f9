"""The OCP MX formats (kv-compress's ocp:mxfp8_e4m3 and ocp:mxfp4): the shared vectors (from
tests/mx_reference.py, ml_dtypes' casts) pin the codec in test_engine_formats; here the rule's
corners and the menu."""

from __future__ import annotations

import json
import subprocess

import numpy as np

import mx_reference as mr


def test_the_shared_exponent_is_the_floor_rule():
    """X = 2**(floor(log2 amax) - emax): a block whose max is 7 keeps X = 1 in MXFP4 and saturates 7 to 6
    (TensorRT-LLM's non-KV MX code rounds the exponent up instead and would read 8), and a block of
    max 500 in MXFP8 keeps X = 1 and saturates to 448."""
    x = np.zeros(32, np.float32)
    x[0] = 7
    raw, back = mr.compress_tensor(x, "mxfp4")
    assert raw[-1] == 127 and back[0] == 6
    x[0] = 500
    raw, back = mr.compress_tensor(x, "mxfp8_e4m3")
    assert raw[-1] == 127 and back[0] == 448
    raw, back = mr.compress_tensor(np.zeros(32, np.float32), "mxfp4")
    assert raw[-1] == 0 and not back.any()  # an all-zero block: 2**-127


def test_ocp_formats_are_listed(cli):
    rows = json.loads(subprocess.run([cli, "schemes", "-engine", "ocp"], capture_output=True, text=True, check=True).stdout)
    assert [(r["name"], r["key_bits_per_element"]) for r in rows] == [("ocp:mxfp8_e4m3", 8.25), ("ocp:mxfp4", 4.25)]
    assert all(r["engine_version"] == mr.VERSION and r["evidence"] == "read" for r in rows)

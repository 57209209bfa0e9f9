"""transformers' cache module imports hqq only when a quantizer is used (kvlib._hqq_deferred): in a
fresh interpreter that imports kvlib first, loading the cache module (every model load does)
imports neither hqq nor torch's dynamo, and transformers' own HQQ cache layer still quantizes,
importing hqq then, with the same codes as hqq's Quantizer called directly."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("hqq")

PROBE = r"""
import sys
import kvlib  # noqa: F401
import torch
import transformers.cache_utils as cu
assert "hqq" not in sys.modules and "torch._dynamo" not in sys.modules, "hqq imported with the cache module"
assert cu.is_hqq_available() and type(cu.HQQQuantizer).__name__ == "DeferredQuantizer"
layer = cu.HQQQuantizedLayer(nbits=4, axis_key=1, axis_value=1, q_group_size=64, residual_length=0)
x = torch.randn(1, 2, 8, 64)
k, v = layer.update(x, x.clone())
assert "hqq.core.quantize" in sys.modules
from hqq.core.quantize import Quantizer
q, meta = Quantizer.quantize(x.contiguous(), axis=1, device=x.device, compute_dtype=x.dtype, nbits=4, group_size=64)
assert torch.equal(layer._quantized_keys[0], q), "the layer's codes are not hqq's"
print("ok")
"""


def test_the_cache_module_loads_without_hqq_and_its_layer_still_quantizes():
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "ok"


def test_a_cache_module_imported_before_kvlib_keeps_transformers_import():
    """install() leaves a process alone once the cache module is in (no hook, nothing wrapped)."""
    import transformers.cache_utils  # noqa: F401

    from kvlib import _hqq_deferred

    _hqq_deferred.uninstall()
    _hqq_deferred.install()
    assert _hqq_deferred._FINDER not in sys.meta_path

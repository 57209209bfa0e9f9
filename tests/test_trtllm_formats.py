"""TensorRT-LLM's 8-bit KV caches (kv-compress's trtllm:fp8 and trtllm:int8): the shared vectors
(tests/vectors/engine_vectors.json, from tests/trtllm_reference.py) pin the codec bit for bit in
test_engine_formats; here the reference's casts are checked against torch's, and the menu."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import torch

import trtllm_reference as tr


def test_satfinite_e4m3_is_torchs_cast_within_the_range():
    """In range the reference's E4M3 is torch's cast (round to nearest even) on every bfloat16; past
    ±448 and for ±Inf it saturates to ±448 (0x7E/0xFE), as cvt.rn.satfinite does."""
    x = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    got = tr.e4m3_satfinite(x)
    fin = np.isfinite(x) & (np.abs(x) <= 448)
    want = torch.from_numpy(x[fin].copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(got[fin], want)
    past = ~np.isnan(x) & ~fin
    assert np.all(got[past] & 0x7F == 0x7E) and np.all((got[past] >> 7) == (x[past] < 0))
    assert np.all(got[np.isnan(x)] == 0x7F)


def test_int8_rounds_half_to_even_and_reaches_minus_128():
    raw, back, sat = tr.compress_tensor(np.array([2.5, 3.5, -2.5, -127.5, -128.5, 127.5, 126.5, np.nan], np.float32), "int8", "F32")
    assert [int(c) for c in np.frombuffer(raw, np.int8)] == [2, 4, -2, -128, -128, 127, 126, 0]
    assert sat == 1  # 127.5 rounds to 128 and saturates; -128.5 rounds to even, -128, and does not
    assert back[3] == -128


def test_trtllm_is_listed_with_its_flags(cli):
    rows = json.loads(subprocess.run([cli, "schemes", "-engine", "trtllm"], capture_output=True, text=True, check=True).stdout)
    assert [(r["name"], r["flags"], r.get("scale_max")) for r in rows] == [
        ("trtllm:fp8", "kv_cache_config.dtype=fp8", 448),
        ("trtllm:int8", "quant_config.kv_cache_quant_algo=INT8 (TensorRT engine backend)", 127),
        ("trtllm:nvfp4", "kv_cache_config.dtype=nvfp4 (or a checkpoint's kv_cache_quant_algo NVFP4)", 6 * 448)]
    assert all(r["engine_version"] == tr.VERSION and r["evidence"] == "read" for r in rows)
    nvfp4 = rows[2]
    assert nvfp4["key_bits_per_element"] == 4.5 and not nvfp4.get("shared_scale")  # K and V keep scales of their own
    assert "[unverified]" in nvfp4["evidence_detail"] and "quantization.cuh" in nvfp4["source"]
    from kvlib.codec.spec import resolve_codec
    from kvlib.transforms.engine import query_codec

    assert query_codec(resolve_codec("trtllm:fp8").key).spec == "k=trtllm:fp8,v=none"
    assert query_codec(resolve_codec("trtllm:int8").key) is None


def test_nvfp4_guard_differs_from_vllms_only_in_the_codes_of_tiny_blocks():
    """TensorRT-LLM's guard is vecMax != 0: a block whose scale rounds to E4M3 zero gets output scale
    rcp(0) = Inf, so +-6 codes for its nonzero values and 0x7 for its zeros (NaN), where vLLM's guard
    (the converted scale != 0) stores zero codes; both read back as zeros. Elsewhere the two agree."""
    import vllm_reference as vr

    x = np.zeros((2, 16), np.float32)
    x[0, :3] = [1e-3, -1e-3, 5e-4]
    x[1] = np.linspace(-3, 3, 16, dtype=np.float32)
    raw_t, y_t, _ = tr.compress_tensor(x, "nvfp4", "BF16")
    raw_v, y_v = vr.compress_tensor(x, "nvfp4")
    t, v = np.frombuffer(raw_t, np.uint8).reshape(2, 9), np.frombuffer(raw_v, np.uint8).reshape(2, 9)
    assert t[0, 8] == v[0, 8] == 0 and list(t[0, :2]) == [0xF7, 0x77] and np.all(t[0, 2:8] == 0x77)
    assert list(v[0, :2]) == [0x80, 0x00] and np.all(v[0, 2:8] == 0)
    assert np.array_equal(t[1], v[1]) and np.all(y_t[:16] == 0) and np.all(y_v.reshape(-1)[:16] == 0)

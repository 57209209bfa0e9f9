"""NumPy reference of SGLang 0.5.10.post1's FP8 KV-cache formats (kv-compress's sglang:fp8_e4m3 and
sglang:fp8_e5m2), for the shared vectors; tests/test_sglang_formats.py checks it and the CLI against
torch's own casts, which are what SGLang calls. Production code never imports it.

MHATokenToKVPool.set_kv_buffer (srt/mem_cache/memory_pool.py:995-1030): with a checkpoint k_scale,
cache_k.div_(k_scale) in the cache's dtype (the scale rounded to it, the quotient computed in float32
and rounded to it); without one, nothing; then .to(float8): round to nearest even, not saturating
(e4m3fn: NaN past 464; e5m2: Inf from 61440). The read multiplies by the float32 scale.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from kvq_reference import from_bf16_bits, to_bf16_bits

F32 = np.float32
VERSION = "SGLang 0.5.10.post1 (wheel; torch's float8 casts)"
FORMATS = ("fp8_e4m3", "fp8_e5m2")
FP8 = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to the cache's dtype (round to nearest even), back as float32."""
    x = np.asarray(x, F32)
    if dtype == "BF16":
        return from_bf16_bits(to_bf16_bits(x))
    if dtype == "F16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(F32)
    return x


def torch_cast_codes(y: np.ndarray, fmt: str) -> np.ndarray:
    """torch's .to(float8) as bytes: round to nearest even, NaN (e4m3fn) or Inf (e5m2) past the range;
    a NaN keeps its sign."""
    y = np.asarray(y, F32)
    with np.errstate(invalid="ignore", over="ignore"):
        c = y.astype(FP8[fmt]).view(np.uint8)
    sign = ((y.view(np.uint32) >> 24) & 0x80).astype(np.uint8)
    return np.where(np.isnan(y), sign | np.uint8(0x7F), c).astype(np.uint8)


def compress_tensor(x: np.ndarray, fmt: str, dtype: str, scale: float = 1.0) -> tuple[bytes, np.ndarray]:
    """One tensor's bytes and reconstruction, as set_kv_buffer writes it and attention reads it."""
    x = np.asarray(x, F32).reshape(-1)
    s = F32(scale)
    y = x if s == 1 else round_to(x / round_to(s, dtype), dtype)
    codes = torch_cast_codes(y, fmt)
    with np.errstate(invalid="ignore", over="ignore"):
        back = codes.view(FP8[fmt]).astype(F32) * s
    return codes.tobytes(), back.astype(F32)

"""NumPy reference of SGLang 0.5.10.post1's KV-cache formats (kv-compress's sglang:fp8_e4m3,
sglang:fp8_e5m2 and sglang:fp4_e2m1), for the shared vectors; tests/test_sglang_formats.py checks it and the CLI against
SGLang's own code (tests/third_party/) and torch's casts. Production code never imports it.

MHATokenToKVPool.set_kv_buffer (srt/mem_cache/memory_pool.py:995-1032): with a checkpoint k_scale,
cache_k.div_(k_scale) in the cache's dtype (the scale rounded to it, as CUDA's division kernel loads
it, the quotient computed in float32 and rounded to it); without one, nothing; then .to(float8) as
torch 2.9.1, which SGLang requires, casts: round to nearest even, not saturating (e4m3fn: NaN past
464; e5m2: Inf from 61440; torch 2.12 on saturates e4m3 to 448). The read multiplies by the float32
scale.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from kvq_reference import from_bf16_bits, to_bf16_bits

F32 = np.float32
VERSION = "SGLang 0.5.10.post1 (wheel)"
FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp4_e2m1")
FP8_FORMATS = ("fp8_e4m3", "fp8_e5m2")
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
    if fmt == "fp4_e2m1":
        return fp4_compress(x)
    x = np.asarray(x, F32).reshape(-1)
    s = F32(scale)
    y = x if s == 1 else round_to(x / round_to(s, dtype), dtype)
    codes = torch_cast_codes(y, fmt)
    with np.errstate(invalid="ignore", over="ignore"):
        back = codes.view(FP8[fmt]).astype(F32) * s
    return codes.tobytes(), back.astype(F32)


E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], F32)
E2M1_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5], np.float64)


def fp4_exponent(amax: np.ndarray) -> np.ndarray:
    """KVFP4's block exponent, compiled as on CUDA: p = amax * float32(1/6), then the exact
    ceil(log2(max(p, 1e-10))) (the smallest e with 2**e >= p, at least -33)."""
    p = (np.asarray(amax, F32) * F32(1.0 / 6.0)).astype(np.float64)
    frac, exp = np.frexp(np.maximum(p, 1e-300))
    e = np.where(frac == 0.5, exp - 1, exp)
    return np.where(p <= 1e-10, -33, e).astype(np.int64)


def fp4_compress(x: np.ndarray) -> tuple[bytes, np.ndarray]:
    """sglang:fp4_e2m1 of a 4-D [b, h, t, d] tensor (d % 16 == 0): per block of 16, 8 bytes of
    nibbles (element 2i low) then the scale byte e + 127; and the read (E2M1 value * 2**(sf-127))."""
    blocks = np.asarray(x, F32).reshape(-1, 16)
    e = fp4_exponent(np.max(np.abs(blocks), axis=1))
    s = np.ldexp(blocks.astype(np.float64), -e[:, None]).astype(F32)  # torch's float32 quotient: -0 on underflow
    codes = (s < 0).astype(np.uint8) << 3
    codes += np.sum(np.abs(s)[..., None] >= E2M1_BOUNDS, axis=-1).astype(np.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    raw = np.concatenate([packed, (e + 127).astype(np.uint8)[:, None]], axis=1)
    with np.errstate(over="ignore"):  # 6 * 2**126: Inf, as float32 gives
        back = E2M1_VALUES[codes & 7] * np.ldexp(F32(1), e.astype(np.int32))[:, None].astype(F32)
    back = np.where(codes & 8, -back, back).astype(F32)
    return raw.tobytes(), back.reshape(-1)

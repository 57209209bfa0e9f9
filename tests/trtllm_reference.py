"""NumPy reference of TensorRT-LLM's 8-bit KV caches (kv-compress's trtllm:fp8 and trtllm:int8),
written from its C++ kernels (docs/research/tensorrt-llm-1.2.1-kv-formats.md, sections 1 and 2).
Production code never imports it.

fp8: the multiplier float32(1/scale) rounded to the cache's dtype T, the product rounded to T, then
cvt.rn.satfinite.e4m3 (ml_dtypes' float8_e4m3fn cast, clamped to ±448 first: satfinite); the read is
code * scale. int8: float32(x * float32(1/scale)), round to nearest even, saturate to [-128, 127],
NaN to 0; the read is code * scale. nvfp4 (section 3): tests/nvfp4_reference.py with the guard
vecMax != 0 (quantization.cuh @2a0ce833), one global scale for K and another for V.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import nvfp4_reference as nr
from sglang_reference import round_to

F32 = np.float32
VERSION = "TensorRT-LLM 1.2.1 (its C++ kernels, read through the source index; the 1.2.1 tag could not be fetched)"
EIGHT_BIT = ("fp8", "int8")
FORMATS = EIGHT_BIT + ("nvfp4",)  # kv-compress schemes -engine trtllm, in this order


def e4m3_satfinite(y: np.ndarray) -> np.ndarray:
    """cvt.rn.satfinite.e4m3: round to nearest even; beyond ±448 and ±Inf, ±448; NaN 0x7F."""
    y = np.asarray(y, F32)
    with np.errstate(invalid="ignore"):
        c = np.clip(np.where(np.isnan(y), F32(0), y), F32(-448), F32(448)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return np.where(np.isnan(y), np.uint8(0x7F), c).astype(np.uint8)


def compress_tensor(x: np.ndarray, fmt: str, dtype: str, scale: float = 1.0) -> tuple[bytes, np.ndarray, int]:
    """Bytes, the engine's read and the count of saturated values of one tensor."""
    if fmt == "nvfp4":
        raw, y, sat = nr.compress(x, scale, guard_vecmax=True)
        return raw, y.reshape(-1), sat
    x = np.asarray(x, F32).reshape(-1)
    s = F32(scale)
    inv = F32(F32(1) / s)
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt == "fp8":
            y = round_to(x * round_to(inv, dtype), dtype)
            codes = e4m3_satfinite(y)
            back = codes.view(ml_dtypes.float8_e4m3fn).astype(F32) * s
            return codes.tobytes(), back.astype(F32), int(np.sum(np.abs(y) > 448))
        r = np.rint((x * inv).astype(F32).astype(np.float64))
        sat = int(np.sum((r > 127) | (r < -128)))
        q = np.clip(np.where(np.isnan(r), 0, r), -128, 127).astype(np.int8)
        return q.view(np.uint8).tobytes(), (q.astype(F32) * s).astype(F32), sat

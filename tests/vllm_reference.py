"""NumPy reference of vLLM 0.33.0's KV-cache formats (kv-compress's vllm:* schemes), written from
the engine's source to pin the Go codec with shared vectors (tests/vectors/vllm_vectors.json).
Production code never imports it. Paths are relative to the vllm package of the 0.33.0 wheel
(commit 4ba787ec9) and, for CUDA kernels, to the repository's csrc/.

- Per-tensor FP8 (fp8 = fp8_e4m3, fp8_e5m2): csrc/cache_kernels.cu reshape_and_cache_flash
  (CopyWithScaleOp) and csrc/quantization/w8a8/fp8/nvidia/quant_utils.cuh scaled_convert:
  float32(x) / scale (IEEE), then __nv_cvt_float_to_fp8(., __NV_SATFINITE, .): round to nearest
  even, saturating at the largest finite value (448, 57344), infinities included. The scale is the
  checkpoint's or 1.0 (model_executor/layers/quantization/kv_cache.py:117-169). Read: code * scale.
- Per-token-head (int8_per_token_head, fp8_per_token_head):
  v1/attention/ops/triton_reshape_and_cache_flash.py:168-283. Per (token, KV head):
  scale = max(amax / QMAX, 1e-6) (float32), codes = x * (1 / scale), int8 rounded half away from
  zero by +-0.5 and the store's truncation after a clamp to [-128, 127]; fp8 clamped to +-448 and
  cast. Stored: head_dim codes then the float32 scale. Read: code * scale.

- NVFP4 (nvfp4, nvfp4_4over6): csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu over
  quantization/fp4/nvfp4_utils.cuh, checked against the wheel's SM100 SASS: tests/nvfp4_reference.py,
  with the guard on the converted block scale (float(sf) != 0) and, for nvfp4_4over6, the /4 candidate.

The float8 casts are ml_dtypes' (round to nearest even), after the clamp that makes them
saturating; tests/test_vllm_formats.py checks them against torch's own float8 casts.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import nvfp4_reference as nr
from sglang_reference import round_to

F32 = np.float32
ENGINE = "vllm"
VERSION = "vLLM 0.33.0 (wheel, commit 4ba787ec9)"
PER_TENSOR = ("fp8", "fp8_e4m3", "fp8_e5m2")
PER_HEAD = ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")
NVFP4 = ("nvfp4", "nvfp4_4over6")
FORMATS = PER_TENSOR + PER_HEAD + NVFP4  # kv-compress schemes -engine vllm, in this order
STATIC_SCALE = PER_TENSOR + NVFP4  # the formats with a static per-tensor scale (/scaleS)
FP8 = {"fp8": (ml_dtypes.float8_e4m3fn, 448.0), "fp8_e4m3": (ml_dtypes.float8_e4m3fn, 448.0),
       "fp8_e5m2": (ml_dtypes.float8_e5m2, 57344.0)}
FP8_NAN = 0x7F  # the PTX conversions' canonical NaN (kv-compress refuses NaN input before it matters)


def fp8_codes(y: np.ndarray, fmt: str) -> np.ndarray:
    """__nv_cvt_float_to_fp8(y, __NV_SATFINITE, E4M3|E5M2) as bytes."""
    dtype, top = FP8[fmt]
    y = np.asarray(y, F32)
    with np.errstate(invalid="ignore"):
        c = np.clip(y, F32(-top), F32(top)).astype(dtype).view(np.uint8)
    return np.where(np.isnan(y), np.uint8(FP8_NAN), c).astype(np.uint8)


def fp8_values(codes: np.ndarray, fmt: str) -> np.ndarray:
    return np.asarray(codes, np.uint8).view(FP8[fmt][0]).astype(F32)


def quantize_per_tensor(x: np.ndarray, fmt: str, scale: float) -> tuple[bytes, np.ndarray]:
    """One tensor's bytes (one per element) and its reconstruction, with the static scale."""
    s = F32(scale)
    with np.errstate(over="ignore"):
        codes = fp8_codes(np.asarray(x, F32).reshape(-1) / s, fmt)
        y = fp8_values(codes, fmt) * s
    return codes.tobytes(), y.astype(F32)


def quantize_per_head(x: np.ndarray, fmt: str) -> tuple[bytes, np.ndarray]:
    """Rows of head_dim values (x[..., d]): each row's codes then its float32 scale."""
    x = np.asarray(x, F32)
    rows = x.reshape(-1, x.shape[-1])
    qmax = F32(127) if fmt.startswith("int8") else F32(448)
    scale = np.maximum(np.max(np.abs(rows), axis=1) / qmax, F32(1e-6)).astype(F32)
    v = (rows * (F32(1) / scale)[:, None]).astype(F32)
    if fmt.startswith("int8"):
        v = np.where(v >= 0, v + F32(0.5), v - F32(0.5)).astype(F32)
        codes = np.trunc(np.clip(v, F32(-128), F32(127))).astype(np.int8).view(np.uint8)
        vals = codes.view(np.int8).astype(F32)
    else:
        codes = fp8_codes(np.clip(v, F32(-448), F32(448)), "fp8_e4m3")
        vals = fp8_values(codes, "fp8_e4m3")
    blocks = np.concatenate([codes, scale[:, None].astype("<f4").view(np.uint8)], axis=1)
    y = (vals * scale[:, None]).astype(F32)
    return blocks.tobytes(), y.reshape(x.shape)


def saturated(x: np.ndarray, fmt: str, scale: float) -> int:
    """How many values a static scale puts beyond the format's largest finite value (stored as it)."""
    if fmt in NVFP4:
        return compress_nvfp4(x, fmt, scale)[2]
    if fmt not in PER_TENSOR:
        return 0
    with np.errstate(over="ignore"):
        return int(np.sum(np.abs(np.asarray(x, F32) / F32(scale)) > F32(FP8[fmt][1])))


def rht_signs(n: int) -> np.ndarray:
    """vLLM's RHT signs (torch.bernoulli(0.5) under manual_seed(0x9E3779B9)): -1 where bit 23 of
    the i-th MT19937 output is set, from NumPy's own MT19937 seeded as std::mt19937(seed)."""
    bg = np.random.MT19937()
    bg._legacy_seeding(0x9E3779B9)
    raw = bg.random_raw(n).astype(np.uint64)
    return np.where(raw & (1 << 23), F32(-1), F32(1)).astype(F32)


def _butterfly(y: np.ndarray) -> np.ndarray:
    """The unnormalised Hadamard over the last axis (a power of two), stride 1 first, in float32."""
    n = y.shape[-1]
    h = 1
    while h < n:
        v = y.reshape(*y.shape[:-1], n // (2 * h), 2, h)
        y = np.stack([v[..., 0, :] + v[..., 1, :], v[..., 0, :] - v[..., 1, :]], axis=-2).reshape(y.shape).astype(F32)
        h <<= 1
    return y


def _half_away(v: np.ndarray) -> np.ndarray:
    return np.where(v >= 0, np.trunc((v + F32(0.5)).astype(F32)), np.trunc((v - F32(0.5)).astype(F32))).astype(F32)


def quantize_int4(x: np.ndarray, dtype: str) -> tuple[bytes, np.ndarray]:
    """int4_per_token_head: the RHT (signs, butterfly in blocks of d's largest power-of-two divisor,
    rounded to the cache's dtype), then per row asymmetric 4-bit codes and the float32 scale with the
    zero point in its low 4 bits; the read (q - zp) * scale rotated back (signs * H(.) / block)."""
    x = np.asarray(x, F32)
    d = x.shape[-1]
    b = d & -d
    signs = rht_signs(b)
    rows = x.reshape(-1, d // b, b)
    with np.errstate(over="ignore", invalid="ignore"):
        y = round_to(_butterfly((rows * signs).astype(F32)), dtype).reshape(-1, d)
    with np.errstate(all="ignore"):  # a rotation past float32's range: Inf, NaN, codes 0 (kv-compress's rule)
        lo, hi = np.nanmin(y, axis=1), np.nanmax(y, axis=1)  # tl.min / tl.max skip NaN
        sc = ((hi - lo) / F32(15)).astype(F32)
        scale = np.where(sc > F32(1e-6), sc, F32(1e-6)).astype(F32)
        zp = _half_away((-lo / scale).astype(F32))
        zp = np.where(np.isnan(zp), F32(0), np.clip(zp, 0, 15)).astype(F32)
        inv = (F32(1) / scale).astype(F32)
        # x * inv + zp as one fused rounding (Triton's default fp fusion): exact in float64, then float32
        qf = _half_away((y.astype(np.float64) * inv[:, None].astype(np.float64) + zp[:, None]).astype(F32))
        q = np.where(np.isnan(qf), 0, np.clip(qf, 0, 15)).astype(np.uint8)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)
    stored = (scale.view(np.uint32) & np.uint32(0xFFFFFFF0)) | zp.astype(np.uint32)
    blocks = np.concatenate([packed, stored.astype("<u4").view(np.uint8).reshape(-1, 4)], axis=1)
    with np.errstate(all="ignore"):
        deq = ((q.astype(F32) - zp[:, None]) * (stored & np.uint32(0xFFFFFFF0)).view(F32)[:, None]).astype(F32)
        back = (_butterfly(deq.reshape(-1, d // b, b)) * F32(1.0 / b) * signs).astype(F32)
    return blocks.tobytes(), back.reshape(x.shape)


def compress_nvfp4(x: np.ndarray, fmt: str, scale: float = 1.0) -> tuple[bytes, np.ndarray, int]:
    """nvfp4 / nvfp4_4over6 of a tensor (head_dim % 16 == 0): bytes, the read, values clamped."""
    return nr.compress(x, scale, four_over_six=fmt == "nvfp4_4over6", guard_vecmax=False)


def compress_tensor(x: np.ndarray, fmt: str, scale: float = 1.0, dtype: str = "F32") -> tuple[bytes, np.ndarray]:
    if fmt in NVFP4:
        return compress_nvfp4(x, fmt, scale)[:2]
    if fmt == "int4_per_token_head":
        return quantize_int4(x, dtype)
    if fmt in PER_HEAD:
        return quantize_per_head(x, fmt)
    raw, y = quantize_per_tensor(x, fmt, scale)
    return raw, y.reshape(np.shape(x))

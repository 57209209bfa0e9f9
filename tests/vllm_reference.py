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
- TurboQuant (turboquant_k8v4, turboquant_4bit_nc, turboquant_k3v4_nc, turboquant_3bit_nc: each a K
  format and a V format, below): v1/attention/ops/triton_turboquant_store.py and its launcher, the
  read of triton_turboquant_decode.py, the centroids of vLLM's own solver (run here, verbatim), the
  boundary layers of config.py; tests/vllm_turboquant_harness.py runs vLLM's own code on the vectors.

The float8 casts are ml_dtypes' (round to nearest even), after the clamp that makes them
saturating; tests/test_vllm_formats.py checks them against torch's own float8 casts.
"""

from __future__ import annotations

import functools

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
TURBOQUANT_PRESETS = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")  # K/V pairs
FORMATS = PER_TENSOR + PER_HEAD + NVFP4 + TURBOQUANT_PRESETS  # kv-compress schemes -engine vllm, in this order
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
    if fmt == "turboquant_k8":  # no scale: beyond 448 the largest
        return int(np.sum(np.abs(np.asarray(x, F32)) > F32(448)))
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
    if fmt.startswith("turboquant_"):
        return compress_turboquant(x, fmt)
    if fmt in NVFP4:
        return compress_nvfp4(x, fmt, scale)[:2]
    if fmt == "int4_per_token_head":
        return quantize_int4(x, dtype)
    if fmt in PER_HEAD:
        return quantize_per_head(x, fmt)
    raw, y = quantize_per_tensor(x, fmt, scale)
    return raw, y.reshape(np.shape(x))


# --- TurboQuant (vllm:turboquant_*: model_executor/layers/quantization/turboquant/, ----------------
# v1/attention/ops/triton_turboquant_store.py, triton_turboquant_decode.py, backends/turboquant_attn.py)

TURBOQUANT = {  # preset -> (its K format, its V format), config.py:20-41; TURBOQUANT_PRESETS's order
    "turboquant_k8v4": ("turboquant_k8", "turboquant_v4"),
    "turboquant_4bit_nc": ("turboquant_k4_nc", "turboquant_v4"),
    "turboquant_k3v4_nc": ("turboquant_k3_nc", "turboquant_v4"),
    "turboquant_3bit_nc": ("turboquant_k3_nc", "turboquant_v3"),
}
TQ_BITS = {"turboquant_k4_nc": 4, "turboquant_k3_nc": 3, "turboquant_v4": 4, "turboquant_v3": 3}
TQ_BOUNDARY = 2  # TurboQuantConfig.get_boundary_skip_layers's n (config.py:180)


def tq_spec(preset: str) -> str:
    """A preset's canonical spec, its K and V formats."""
    k, v = TURBOQUANT[preset]
    return f"k=vllm:{k},v=vllm:{v}"


def tq_centroids(d: int, bits: int) -> np.ndarray:
    """vLLM's own Lloyd-Max centroids: its solver (tests/third_party/vllm_turboquant_centroids.py,
    verbatim) run here, as get_centroids(d, bits) returns them (float32)."""
    return _tq_centroids(d, bits).copy()


@functools.lru_cache(maxsize=None)
def _tq_centroids(d: int, bits: int) -> np.ndarray:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "third_party" / "vllm_turboquant_centroids.py"
    spec = importlib.util.spec_from_file_location("vllm_turboquant_centroids", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_centroids(d, bits).numpy().astype(F32)


def tq_hadamard_entry(d: int) -> np.float32:
    """|PiT[i][j]|: torch's float32 1.0 / float32(math.sqrt(d)) (turboquant_attn.py:116-120)."""
    return F32(1) / F32(np.sqrt(np.float64(d)))


def tq_rotate(rows: np.ndarray) -> np.ndarray:
    """PiT applied to each row: the float32 butterfly (stride 1 first), times the entry."""
    return (_butterfly(np.asarray(rows, F32)) * tq_hadamard_entry(rows.shape[-1])).astype(F32)


def _sum_squares_in_order(rows: np.ndarray) -> np.ndarray:
    """Each row's sum of float32 squares, added in index order in float32."""
    s = np.zeros(rows.shape[0], F32)
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(rows.shape[1]):
            s = (s + (rows[:, j] * rows[:, j]).astype(F32)).astype(F32)
    return s


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Rows of codes: 4-bit two a byte (even index low); 3-bit 8 in 24 little-endian bits."""
    codes = codes.astype(np.uint32)
    if bits == 4:
        return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    g = codes.reshape(codes.shape[0], -1, 8)
    p = np.sum(g << (np.arange(8, dtype=np.uint32) * 3), axis=-1, dtype=np.uint32)
    return np.stack([p & 0xFF, (p >> 8) & 0xFF, (p >> 16) & 0xFF], axis=-1).reshape(codes.shape[0], -1).astype(np.uint8)


def _unpack(packed: np.ndarray, bits: int, d: int) -> np.ndarray:
    if bits == 4:
        return np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(packed.shape[0], d).astype(np.int64)
    b = packed.reshape(packed.shape[0], -1, 3).astype(np.uint32)
    p = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    return ((p[..., None] >> (np.arange(8, dtype=np.uint32) * 3)) & 7).reshape(packed.shape[0], d).astype(np.int64)


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(v, F32).astype(np.float16).astype("<f2").view(np.uint8).reshape(-1, 2)


def _f16_read(b: np.ndarray) -> np.ndarray:
    return b.copy().view("<f2")[:, 0].astype(F32)


def tq_key_mse(rows: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """MSE keys (_tq_fused_store_mse and its launcher, store.py:220-447): ||k|| (float32 squares summed
    in order, rounded root), x / (||k|| + 1e-8), rotated, each index the count of midpoints <= it
    (the midpoints float32 (c_k + c_k+1)/2); stored indices then fp16(||k||). Read with norm correction
    (decode.py:394-409): c / sqrt(sum c^2 + 1e-16) (in order) times fp16(||k||), rotated back."""
    rows = np.asarray(rows, F32)
    n, d = rows.shape
    cents = tq_centroids(d, bits)
    mids = ((cents[:-1] + cents[1:]).astype(F32) / F32(2)).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        norm = np.sqrt(_sum_squares_in_order(rows)).astype(F32)
        y = tq_rotate((rows / (norm + F32(1e-8)).astype(F32)[:, None]).astype(F32))
    idx = np.sum(y[:, :, None] >= mids[None, None, :], axis=-1)  # a NaN counts no midpoint
    blocks = np.concatenate([_pack(idx, bits), _f16_bytes(norm)], axis=1)
    return blocks, tq_key_mse_read(blocks, bits, d)


def tq_key_mse_read(blocks: np.ndarray, bits: int, d: int) -> np.ndarray:
    nb = (d * bits + 7) // 8
    c = tq_centroids(d, bits)[_unpack(blocks[:, :nb], bits, d)]
    with np.errstate(over="ignore", invalid="ignore"):
        inv = (F32(1) / np.sqrt((_sum_squares_in_order(c) + F32(1e-16)).astype(F32))).astype(F32)
        z = (_f16_read(blocks[:, nb:nb + 2])[:, None] * (c * inv[:, None]).astype(F32)).astype(F32)
        return tq_rotate(z)


def _signed_min(rows: np.ndarray) -> np.ndarray:
    """min with -0.0 below +0.0 (Go's min), whatever the order of the row."""
    m = rows.min(axis=1)
    neg0 = np.any((rows == 0) & np.signbit(rows), axis=1)
    return np.where((m == 0) & neg0, F32(-0.0), m).astype(F32)


def _signed_max(rows: np.ndarray) -> np.ndarray:
    m = rows.max(axis=1)
    pos0 = np.any((rows == 0) & ~np.signbit(rows), axis=1)
    return np.where((m == 0) & pos0, F32(0.0), m).astype(F32)


def tq_value(rows: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Values (_store_quantized_value, store.py:25-136): scale = (max - min) / (2^b - 1) floored at 1e-8,
    q = clamp(trunc((v - min) / scale + 0.5), 0, 2^b - 1) (NaN: 0), then fp16(scale), fp16(min).
    Read: q * scale + min with the fp16 values (decode.py:411-450)."""
    rows = np.asarray(rows, F32)
    top = F32(2 ** bits - 1)
    lo, hi = _signed_min(rows), _signed_max(rows)
    with np.errstate(over="ignore", invalid="ignore"):
        sc = ((hi - lo).astype(F32) / top).astype(F32)
        scale = np.where(sc > F32(1e-8), sc, F32(1e-8)).astype(F32)
        q = (((rows - lo[:, None]).astype(F32) / scale[:, None]).astype(F32) + F32(0.5)).astype(F32)
        k = np.where(np.isnan(q), F32(0), np.clip(np.trunc(q), F32(0), top)).astype(np.int64)
    blocks = np.concatenate([_pack(k, bits), _f16_bytes(scale), _f16_bytes(lo)], axis=1)
    return blocks, tq_value_read(blocks, bits, rows.shape[1])


def tq_value_read(blocks: np.ndarray, bits: int, d: int) -> np.ndarray:
    nb = (d * bits + 7) // 8
    k = _unpack(blocks[:, :nb], bits, d).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        return ((k * _f16_read(blocks[:, nb:nb + 2])[:, None]).astype(F32)
                + _f16_read(blocks[:, nb + 2:nb + 4])[:, None]).astype(F32)


def compress_turboquant(x: np.ndarray, fmt: str) -> tuple[bytes, np.ndarray]:
    """One tensor ([..., head_dim]) through a TurboQuant half: its stored bytes and its read."""
    x = np.asarray(x, F32)
    rows = x.reshape(-1, x.shape[-1])
    if fmt == "turboquant_k8":  # k.float() to float8 e4m3, no scale (SM90+: satfinite, nearest even)
        codes = fp8_codes(rows.reshape(-1), "fp8_e4m3")
        return codes.tobytes(), fp8_values(codes, "fp8_e4m3").reshape(x.shape)
    bits = TQ_BITS[fmt]
    blocks, y = tq_key_mse(rows, bits) if fmt.startswith("turboquant_k") else tq_value(rows, bits)
    return blocks.tobytes(), y.reshape(x.shape)


def tq_boundary_layers(num_layers: int, n: int = TQ_BOUNDARY) -> list[int]:
    """The layers a TurboQuant cache keeps unquantized (config.py:205-213, a dense model)."""
    n = min(n, num_layers // 2)
    return sorted(set(range(n)) | set(range(num_layers - n, num_layers)))


assert tuple(TURBOQUANT) == TURBOQUANT_PRESETS

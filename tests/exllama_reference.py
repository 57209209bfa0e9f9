"""NumPy reference of ExLlamaV2 0.3.2's and ExLlamaV3 1.6.5's quantized caches (kv-compress's exllamav2:fp8, exllamav2:q4,
exllamav2:q8; exllamav2:q6 is K q8 and V q4), written from the wheel's CUDA sources
(docs/research/exllama-kv-formats.md, part A), in NumPy's float16 arithmetic: every float16 +, -, *
and / is computed wider and rounded once to float16, as the kernels' half2 intrinsics round.
Production code never imports it.

- fp8 (ExLlamaV2Cache_8bit, v2/cuda/cache.cu:25-37): the top byte of each fp16.
- q4/q8 (v2/cuda/cache_q.cuh:4-185): per chunk of 64, two interleaved groups of 32 (even and odd
  elements) through the unnormalised Sylvester Hadamard in float16; per contiguous 32 of the
  result an fp16 scale amax * 2**(1-bits); codes rint(fp16(fp16(w / amax) * M + M)) clamped to
  [0, 2M-1] (NaN: 0), M = 2**(bits-1); element 2k in the low nibble. The read: fp16((q - M) * scale),
  the same butterfly, then * 2**-5.
- ExLlamaV3's CacheLayer_quant, 2-8 bits (v3/cache/q_cache_kernels.cuh:61-236; part B): per group of
  32, the fp16 values through the float32 Hadamard of 32 times float32(1/sqrt(32)); s = max|v| + 1e-10;
  q = clamp(floor(fp32(fp32(v * fp32(1/s)) * m + m)), 0, 2**bits - 1); bit planes 8, 4, 2, 1; the
  scale as fp16. The read: (q - (m - 0.5)) * fp32(fp32(fp16 scale * fp32(1/sqrt(32))) * 2**(1-bits)), the
  butterfly, fp16.
"""

from __future__ import annotations

import numpy as np

F16, F32 = np.float16, np.float32
VERSION = "ExLlamaV2 0.3.2 (wheel; its CUDA sources)"
FORMATS = ("fp8", "q4", "q8")
BITS = {"q4": 4, "q8": 8}


def _butterfly(w: np.ndarray) -> np.ndarray:
    """The fp16 Hadamard over [..., 64] chunks: each of the two interleaved groups of 32."""
    w = w.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for p in (0, 1):
            g = w[..., p::2]  # a view: the group of parity p
            h = 1
            while h < 32:
                idx = np.array([l for l in range(32) if not l & h])
                a, b = g[..., idx].copy(), g[..., idx | h].copy()
                g[..., idx], g[..., idx | h] = a + b, a - b
                h <<= 1
    return w


def quantize_chunks(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes [n, 64] and fp16 scales [n, 2] of chunks of 64 (float32 input, rounded to fp16 first)."""
    m = F16(1 << (bits - 1))
    with np.errstate(over="ignore"):
        w = _butterfly(np.asarray(x, F32).reshape(-1, 64).astype(F16))
    groups = w.reshape(-1, 2, 32)
    amax = np.max(np.where(np.isnan(groups), F16(0), np.abs(groups)), axis=-1)  # max.f16 skips NaN
    scale = (amax * F16(2.0 ** (1 - bits))).astype(F16)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        qf = (groups / amax[..., None]).astype(F16)
        z = (qf.astype(np.float64) * float(m) + float(m)).astype(F32).astype(F16)  # one rounding (exact in f64; f32 odd-free here)
    q = np.where(np.isnan(z), 0, np.clip(np.rint(z.astype(np.float64)), 0, 2 * float(m) - 1)).astype(np.uint8)
    return q.reshape(-1, 64), scale


def dequantize_chunks(q: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    m = 1 << (bits - 1)
    with np.errstate(over="ignore", invalid="ignore"):
        v = ((q.reshape(-1, 2, 32).astype(np.int32) - m).astype(F16) * scale[..., None]).astype(F16)
        w = _butterfly(v.reshape(-1, 64))
        return (w * F16(2.0 ** -5)).astype(F16).astype(F32)


def compress_tensor(x: np.ndarray, fmt: str) -> tuple[bytes, np.ndarray]:
    """One tensor's bytes as kv-compress lays them out (ExLlamaV2's Q4/Q8 per chunk of 64: codes, then
    the two fp16 scales; ExLlamaV3's, fmt "v3:BITS", per group of 32) and the engine's read, float32."""
    x = np.asarray(x, F32).reshape(-1)
    if fmt.startswith("v3:"):
        return v3_compress(x, int(fmt[3:]))
    if fmt == "fp8":
        with np.errstate(over="ignore"):
            h = x.astype(F16).view(np.uint16)
        codes = (h >> 8).astype(np.uint8)
        return codes.tobytes(), (codes.astype(np.uint16) << 8).view(F16).astype(F32)
    bits = BITS[fmt]
    q, scale = quantize_chunks(x, bits)
    packed = q if bits == 8 else (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    raw = np.concatenate([packed, scale.astype("<f2").view(np.uint8).reshape(-1, 4)], axis=1)
    return raw.tobytes(), dequantize_chunks(q, scale, bits).reshape(-1)


V3_BITS = tuple(range(2, 9))
R32 = np.array([0x3E3504F3], np.uint32).view(F32)[0]


def _v3_butterfly(v: np.ndarray) -> np.ndarray:
    """The float32 Hadamard of 32 in natural order over [..., 32] (each + and - rounded to float32)."""
    v = v.copy()
    h = 1
    while h < 32:
        idx = np.array([i for i in range(32) if not i & h])
        a, c = v[..., idx].copy(), v[..., idx | h].copy()
        v[..., idx], v[..., idx | h] = a + c, a - c
        h <<= 1
    return v


def _planes(bits: int) -> list[int]:
    return [w for w in (8, 4, 2, 1) if bits & w]


def v3_compress(x: np.ndarray, bits: int) -> tuple[bytes, np.ndarray]:
    """ExLlamaV3's bytes per group of 32 (4*bits bytes of bit planes, then the fp16 scale) and its read."""
    m = F32(1 << (bits - 1))
    with np.errstate(over="ignore", invalid="ignore"):
        v = _v3_butterfly(np.asarray(x, F32).reshape(-1, 32).astype(F16).astype(F32)) * R32
        s = (np.max(np.where(np.isnan(v), F32(0), np.abs(v)), axis=1) + F32(1e-10)).astype(F32)
        t = (v * (F32(1) / s)[:, None]).astype(F32)
        y = (t * m + m).astype(F32)
    q = np.where(np.isnan(y), 0, np.clip(np.floor(y), 0, (1 << bits) - 1)).astype(np.uint32)
    words = np.zeros((q.shape[0], bits), np.uint32)
    wb, rem = 0, bits
    for w in _planes(bits):
        rem -= w
        field = (q >> rem) & ((1 << w) - 1)
        for j in range(32):
            words[:, wb + j * w // 32] |= field[:, j] << np.uint32(j * w % 32)
        wb += w
    with np.errstate(over="ignore"):
        scale = s.astype(F16)
    raw = np.concatenate([words.astype("<u4").view(np.uint8), scale.astype("<f2").view(np.uint8).reshape(-1, 2)], axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        sm = ((scale.astype(F32) * R32).astype(F32) * F32(2.0 ** (1 - bits))).astype(F32)
        back = _v3_butterfly(((q.astype(F32) - (m - F32(0.5))) * sm[:, None]).astype(F32)).astype(F16).astype(F32)
    return raw.tobytes(), back.reshape(-1)

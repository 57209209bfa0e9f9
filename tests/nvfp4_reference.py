"""NumPy reference of the NVFP4 KV caches (kv-compress's vllm:nvfp4, vllm:nvfp4_4over6 and
trtllm:nvfp4), written from NVIDIA's cvt_warp_fp16_to_fp4 recipe as the engines ship it (vLLM 0.33.0:
csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu and its SM100 SASS in the wheel; TensorRT-LLM:
kernels/quantization.cuh @2a0ce833), to pin the Go codec with shared vectors. Production code never
imports it; tests/vllm_reference.py and tests/trtllm_reference.py call it.

Per block of 16 values, with the global scale g = float32(1 / k):
  vecMax = max |x|; SF = g * float32(vecMax * rcp(6)); sf = E4M3 satfinite(SF);
  os = guard ? rcp(float(sf) * rcp(g)) : 0      (vLLM: float(sf) != 0; TensorRT-LLM: vecMax != 0)
  code = E2M1 satfinite(x * os)                  (element 2i in the low nibble; NaN -> 0x7)
read: E2M1(code) * float(sf) * k. rcp is the IEEE float32 reciprocal with ftz (subnormal in or out ->
0), standing in for rcp.approx.ftz.f32; rcp(6) = float32(1/6) (0x3E2AAAAB, the vLLM binary's constant).

nvfp4_4over6 adds a candidate with vecMax * 0.25 and keeps it when its squared reconstruction error is
strictly smaller; the error is computed as the binary does, with fused multiply-adds: per pair (x, y),
dx = fma(q(x*os), rcp(os), -x), the pair's error fma(dx, dx, float32(dy*dy)), summed in float32. The
fused multiply-adds here are exact rational arithmetic (fractions.Fraction) rounded once to float32.

The casts are ml_dtypes' (float8_e4m3fn after a clamp to +-448, float4_e2m1fn: round to nearest even,
saturating); tests/test_vllm_formats.py checks them against a brute-force nearest-value search.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np

F32 = np.float32
BLOCK = 16
SCALE_MAX = 6 * 448  # a calibrated k is amax / SCALE_MAX
RCP6 = F32(1) / F32(6)
TINY = F32(np.finfo(np.float32).tiny)  # the smallest normal float32


def e4m3_codes(y: np.ndarray) -> np.ndarray:
    """__nv_fp8_e4m3(float): round to nearest even, beyond +-448 (and Inf) +-448, NaN 0x7F."""
    y = np.asarray(y, F32)
    with np.errstate(invalid="ignore"):
        c = np.clip(np.where(np.isnan(y), F32(0), y), F32(-448), F32(448)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return np.where(np.isnan(y), np.uint8(0x7F), c).astype(np.uint8)


def e4m3_values(c: np.ndarray) -> np.ndarray:
    return np.asarray(c, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32)


def e2m1_codes(v: np.ndarray) -> np.ndarray:
    """cvt.rn.satfinite.e2m1x2.f32 of each value: a 4-bit code, sign in bit 3; NaN -> 0x7."""
    v = np.asarray(v, F32)
    with np.errstate(invalid="ignore"):
        c = np.where(np.isnan(v), F32(0), v).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & np.uint8(0xF)
    return np.where(np.isnan(v), np.uint8(0x7), c).astype(np.uint8)


def e2m1_values(c: np.ndarray) -> np.ndarray:
    return (np.asarray(c, np.uint8) & np.uint8(0xF)).view(ml_dtypes.float4_e2m1fn).astype(F32)


def rcp_ftz(a: np.ndarray) -> np.ndarray:
    """rcp.approx.ftz.f32, taken as the IEEE reciprocal: a subnormal input counts as +-0, a subnormal
    result is +-0."""
    a = np.asarray(a, F32)
    a = np.where((a != 0) & (np.abs(a) < TINY), np.copysign(F32(0), a), a).astype(F32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        r = (F32(1) / a).astype(F32)
    return np.where((r != 0) & (np.abs(r) < TINY), np.copysign(F32(0), r), r).astype(F32)


def to_float32(q: Fraction) -> F32:
    """The float32 nearest the rational q (ties to even), subnormals and overflow included."""
    if q == 0:
        return F32(0)
    sign, q = (-1 if q < 0 else 1), abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if q < Fraction(2) ** e:
        e -= 1  # now 2**e <= q < 2**(e + 1)
    e = max(e, -126)
    n = round(q / Fraction(2) ** (e - 23))  # Fraction rounds half to even
    if e > 127:
        return F32(sign * np.inf)
    with np.errstate(over="ignore"):
        return F32(sign * math.ldexp(n, e - 23))


def fma32(a, b, c) -> F32:
    """a * b + c rounded once to float32."""
    a, b, c = F32(a), F32(b), F32(c)
    if not (np.isfinite(a) and np.isfinite(b) and np.isfinite(c)):
        with np.errstate(all="ignore"):
            return F32(np.float64(a) * np.float64(b) + np.float64(c))
    return to_float32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def candidate(vecmax: np.ndarray, g: F32, rcp_den: F32, guard_vecmax: bool):
    """Per block: SF (float32, before the conversion), its E4M3 byte, the output scale."""
    with np.errstate(over="ignore", invalid="ignore"):
        sf = (g * (vecmax * rcp_den).astype(F32)).astype(F32)
        sf_byte = e4m3_codes(sf)
        narrow = e4m3_values(sf_byte)
        cond = vecmax != 0 if guard_vecmax else narrow != 0
        os = np.where(cond, rcp_ftz((narrow * rcp_ftz(g)).astype(F32)), F32(0)).astype(F32)
    return sf, sf_byte, os


def reconstruction_error(row: np.ndarray, os: F32) -> F32:
    """nvfp4_reconstruction_error of one block, with the binary's fused multiply-adds."""
    dq = rcp_ftz(os) if os != 0 else F32(0)
    total = F32(0)
    with np.errstate(all="ignore"):
        for i in range(0, BLOCK, 2):
            x, y = F32(row[i]), F32(row[i + 1])
            if os == 0:
                e = fma32(x, x, F32(y * y))
            else:
                qx, qy = e2m1_values(e2m1_codes(np.array([x * os, y * os], F32)))
                dx, dy = fma32(qx, dq, -x), fma32(qy, dq, -y)
                e = fma32(dx, dx, F32(dy * dy))
            total = F32(total + e)
    return total


def compress(x: np.ndarray, scale: float = 1.0, four_over_six: bool = False,
             guard_vecmax: bool = False) -> tuple[bytes, np.ndarray, int]:
    """Blocks of 16 along the last axis: [8 code bytes | scale byte] each, the read, and how many
    values were clamped (past +-6 times a block scale that the static scale pushed past E4M3's range:
    SF > 464, where rounding to nearest would no longer give 448)."""
    x = np.asarray(x, F32)
    blocks = x.reshape(-1, BLOCK)
    k = F32(scale)
    g = F32(F32(1) / k)
    vecmax = np.max(np.abs(blocks), axis=1).astype(F32)
    sf, sf_byte, os = candidate(vecmax, g, RCP6, guard_vecmax)
    if four_over_six:
        sf4, sf_byte4, os4 = candidate(vecmax, g, F32(0.25), guard_vecmax)
        use4 = np.array([reconstruction_error(b, o4) < reconstruction_error(b, o6)
                         for b, o4, o6 in zip(blocks, os4, os)], bool)
        sf, sf_byte, os = np.where(use4, sf4, sf), np.where(use4, sf_byte4, sf_byte), np.where(use4, os4, os)
    with np.errstate(over="ignore", invalid="ignore"):
        v = (blocks * os[:, None]).astype(F32)
        codes = e2m1_codes(v)
        sat = int(np.sum((np.abs(v) > 6) & (sf > 464)[:, None]))
        y = ((e2m1_values(codes) * e4m3_values(sf_byte)[:, None]).astype(F32) * k).astype(F32)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    raw = np.concatenate([packed, sf_byte[:, None].astype(np.uint8)], axis=1)
    return raw.tobytes(), y.reshape(x.shape), sat

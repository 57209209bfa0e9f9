"""NumPy reference of the OCP Microscaling formats (kv-compress's ocp:mxfp8_e4m3 and ocp:mxfp4), from
the OCP MX v1.0 specification's conversion rule, with ml_dtypes' casts (float8_e4m3fn, float4_e2m1fn,
and float8_e8m0fnu for the shared scale). Production code never imports it.

Per block of 32: e = floor(log2(max|V|)) - emax (8 for E4M3, 2 for E2M1), clamped to [-127, 127],
-127 for an all-zero block; the scale byte is E8M0 of 2**e (e + 127); each element V / 2**e cast with
round to nearest even, saturated at the element's largest normal (448, 6) first; E2M1 codes two to
a byte, element 2i low. The read is element * 2**e (float32).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
VERSION = "OCP Microscaling Formats (MX) v1.0 (the specification's conversion rule)"
FORMATS = {"mxfp8_e4m3": (ml_dtypes.float8_e4m3fn, 8, 448.0), "mxfp4": (ml_dtypes.float4_e2m1fn, 2, 6.0)}


def compress_tensor(x: np.ndarray, fmt: str) -> tuple[bytes, np.ndarray]:
    elem, emax, top = FORMATS[fmt]
    blocks = np.asarray(x, F32).reshape(-1, 32)
    amax = np.max(np.abs(blocks), axis=1).astype(np.float64)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax, -127)
    # log2 of a float32 is exact enough here, but floor must not round up near powers of two: fix it exactly
    e = np.where(amax > 0, np.where(np.ldexp(1.0, (e + emax).astype(int)) > amax, e - 1, e), e)
    e = np.clip(e, -127, 127).astype(np.int32)
    scaled = np.clip(np.ldexp(blocks.astype(np.float64), -e[:, None]), -top, top)
    codes = scaled.astype(elem)
    sbyte = np.ldexp(1.0, e).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    assert np.array_equal(sbyte.astype(np.int32), e + 127)
    raw = codes.view(np.uint8)
    if fmt == "mxfp4":
        raw = (raw[:, 0::2] & 0xF) | ((raw[:, 1::2] & 0xF) << 4)
    out = np.concatenate([raw, sbyte[:, None]], axis=1)
    back = (codes.astype(F32) * np.ldexp(F32(1), e)[:, None].astype(F32)).astype(F32)
    return out.tobytes(), back.reshape(-1)

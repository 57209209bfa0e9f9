"""NumPy reference of the kvq quantizer: the spec in executable form.

It exists only to pin the Go codec's arithmetic with shared test vectors
(tests/vectors/kvq_vectors.json); production code never imports it.
"""

from __future__ import annotations

import numpy as np


class ScaleOverflow(ValueError):
    """A group's scale does not fit in FP16."""


def quantize(x: np.ndarray, bits: int, group_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize flat float32 x; return (codes int8, scales as FP16 bits uint16, reconstruction float32)."""
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(x)):
        raise ValueError("NaN or Inf in input")
    qmax = np.float32(2 ** (bits - 1) - 1)
    qmin = -qmax - np.float32(1)
    n = x.size
    starts = np.arange(0, n, group_size)
    codes = np.zeros(n, dtype=np.int8)
    scales = np.zeros(starts.size, dtype=np.uint16)
    recon = np.zeros(n, dtype=np.float32)
    with np.errstate(over="ignore"):
        for gi, lo in enumerate(starts):
            g = x[lo : lo + group_size]
            amax = np.max(np.abs(g)) if g.size else np.float32(0)
            h = np.float32(amax / qmax).astype(np.float16)
            if not np.isfinite(h):
                raise ScaleOverflow(f"group {gi}: scale overflows FP16")
            s = np.float32(h)
            scales[gi] = h.view(np.uint16)
            if s == 0:
                continue
            q = np.clip(np.rint(g / s), qmin, qmax).astype(np.int8)  # np.rint: half to even
            codes[lo : lo + group_size] = q
            recon[lo : lo + group_size] = q.astype(np.float32) * s  # integer q: never -0
    return codes, scales, recon


def pack(codes: np.ndarray, bits: int) -> bytes:
    """Little-endian bit stream: code i in bits [i*bits, (i+1)*bits), two's complement."""
    u = (codes.astype(np.int16) & ((1 << bits) - 1)).astype(np.uint8)
    bitplanes = np.unpackbits(u[:, None], axis=1, bitorder="little")[:, :bits]
    return np.packbits(bitplanes.reshape(-1), bitorder="little").tobytes()


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (no NaNs here)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = b + 0x7FFF + ((b >> 16) & 1)
    return (b >> 16).astype(np.uint16)


def from_bf16_bits(h: np.ndarray) -> np.ndarray:
    return (h.astype(np.uint32) << 16).view(np.float32)


def decode(raw: bytes, dtype: str) -> np.ndarray:
    """Raw little-endian tensor bytes of dtype F32/F16/BF16 -> float32."""
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").copy()
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if dtype == "BF16":
        return from_bf16_bits(np.frombuffer(raw, dtype="<u2"))
    raise ValueError(dtype)


def encode(x: np.ndarray, dtype: str) -> bytes:
    """float32 -> raw little-endian bytes of dtype (narrow types round to nearest even)."""
    if dtype == "F32":
        return np.asarray(x, dtype="<f4").tobytes()
    if dtype == "F16":
        return np.asarray(x, dtype=np.float32).astype("<f2").tobytes()
    if dtype == "BF16":
        return to_bf16_bits(x).astype("<u2").tobytes()
    raise ValueError(dtype)

"""NumPy reference of LMCache 0.5.6's serdes as kv-compress stores them (lmcache:fp8, lmcache:kivi,
lmcache:cachegen), written from the research notes (docs/research/lmcache-0.5.6-serdes.md), for the
shared vectors (tests/make_lmcache_vectors.py); tests/test_lmcache_formats.py checks it, and the CLI,
against LMCache's own code (tests/lmcache_harness.py). Production code never imports it.

- fp8 (v1/distributed/serde/fp8.py:34-86): ``.to(torch.float8_e4m3fn)``, no scale, with torch 2.13's
  saturating conversion (past 448: 448), round to nearest even; read back exactly.
- kivi (v1/storage_backend/naive_serde/kivi_serde.py:7-22): the identity.
- cachegen: per layer and role, per chunk of <= 256 tokens (per batch row): one maximum per token over
  all heads x head_dim; symbols round(x * (MAX / max) + MAX) in float32 (MAX = bins // 2 - 1; NaN and
  Inf give 0); a CDF per channel over the chunk (33 entries, floor(65503 * cum / n) + k); one
  arithmetic-coded stream per channel (the 32-bit coder, MSB first); the read ((s - MAX) / MAX) * max in
  float32. Stored per chunk: maxima (dtype), CDFs (uint16 x 33 per channel), lengths (uint32 per
  channel), the streams.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from kvq_reference import from_bf16_bits, to_bf16_bits

F32 = np.float32
VERSION = "LMCache 0.5.6 (wheel, commit g3e11e108)"
FORMATS = ("fp8", "kivi", "cachegen")
CHUNK = 256  # chunk_size (v1/config.py:90), and tokens per stream (cachegen_basics.py:18)
NB = 32  # int(bins.max()): the CDF has NB + 1 entries
CDF_TOP = 0xFFFF - NB


def bins(layer: int, role: str, layers: int) -> int:
    """CacheGenConfig.from_model_name's rule for a model of ``layers`` layers."""
    if layers < 10:
        return 32
    return 32 if layer < (10 if role == "key" else 2) else 16


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    x = np.asarray(x, F32)
    if dtype == "BF16":
        return from_bf16_bits(to_bf16_bits(x))
    if dtype == "F16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(F32)
    return x


def dtype_bytes(x: np.ndarray, dtype: str) -> bytes:
    """Values of the dtype (exactly representable) as its little-endian bytes."""
    x = np.asarray(x, F32)
    if dtype == "BF16":
        return to_bf16_bits(x).astype("<u2").tobytes()
    if dtype == "F16":
        return x.astype("<f2").tobytes()
    return x.astype("<f4").tobytes()


def fp8(x: np.ndarray) -> tuple[bytes, np.ndarray, int]:
    """The fp8 serde: codes, the values read back, and how many values saturated (|x| > 448)."""
    x = np.asarray(x, F32).reshape(-1)
    with np.errstate(invalid="ignore"):
        codes = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn)  # clip, then round to nearest even
    return codes.view(np.uint8).tobytes(), codes.astype(F32), int(np.sum(np.abs(x) > 448))


def symbols(x: np.ndarray, mx: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """One chunk [n, C] (float32 values of the cache's dtype): its per-token maxima and symbols."""
    m = np.max(np.abs(x), axis=1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        factor = (mx / m).astype(F32)  # float32 division: Inf for a zero maximum
        b = ((x * factor[:, None]).astype(F32) + mx).astype(F32)
        q = np.rint(b)  # half to even
    q = np.where(np.isfinite(q), q, 0)  # CPU torch's int8 cast of NaN and Inf
    return m.astype(F32), q.astype(np.int64).astype(np.uint8)


def cdf(sym: np.ndarray) -> np.ndarray:
    """calculate_cdf of one channel's symbols: 33 uint16 entries."""
    hist = np.bincount(sym, minlength=NB)[:NB]
    cum = np.concatenate([[0], np.cumsum(hist)]).astype(np.int64)
    return (CDF_TOP * cum // len(sym) + np.arange(NB + 1)).astype(np.uint16)


def encode_stream(sym: np.ndarray, table: np.ndarray) -> bytes:
    """The 32-bit arithmetic coder (16-bit frequencies, bits MSB first, zero padding)."""
    low, high, pending = 0, 0xFFFFFFFF, 0
    bits: list[int] = []

    def put(bit: int) -> None:
        nonlocal pending
        bits.append(bit)
        bits.extend([1 - bit] * pending)
        pending = 0

    t = [int(v) for v in table]
    for s in (int(v) for v in sym):
        span = high - low + 1
        lo, hi = t[s], (0x10000 if s == NB - 1 else t[s + 1])
        high = (low + (span * hi >> 16) - 1) & 0xFFFFFFFF
        low = (low + (span * lo >> 16)) & 0xFFFFFFFF
        while True:
            if (high ^ low) & 0x80000000 == 0:
                put(high >> 31)
                low, high = (low << 1) & 0xFFFFFFFF, ((high << 1) | 1) & 0xFFFFFFFF
            elif low & 0x40000000 and not high & 0x40000000:
                pending += 1
                low, high = (low << 1) & 0x7FFFFFFF, ((high << 1) | 0x80000001) & 0xFFFFFFFF
            else:
                break
    pending += 1
    put(1 if low & 0x40000000 else 0)
    bits.extend([0] * (-len(bits) % 8))
    return np.packbits(np.array(bits, np.uint8)).tobytes()


def cachegen(x: np.ndarray, dtype: str, nbins: int) -> tuple[bytes, np.ndarray]:
    """lmcache:cachegen of one [b, h, t, d] tensor (values of its dtype, as float32) with ``nbins``
    bins: its stored bytes and reconstruction (float32, before the rounding to the dtype)."""
    b_, h_, t_, d_ = x.shape
    c = h_ * d_
    mx = F32(nbins // 2 - 1)
    level = ((np.arange(NB, dtype=F32) - mx) / mx).astype(F32)
    out, back = [], np.zeros(x.shape, F32)
    for b in range(b_):
        for t0 in range(0, t_, CHUNK):
            chunk = np.asarray(x[b, :, t0:t0 + CHUNK], F32).transpose(1, 0, 2).reshape(-1, c)  # [n, C], c = h*D + d
            m, sym = symbols(chunk, mx)
            tables = [cdf(sym[:, ch]) for ch in range(c)]
            streams = [encode_stream(sym[:, ch], tables[ch]) for ch in range(c)]
            out += [dtype_bytes(m, dtype), np.concatenate(tables).astype("<u2").tobytes(),
                    np.array([len(s) for s in streams], "<u4").tobytes(), *streams]
            y = (level[sym] * m[:, None]).astype(F32)
            back[b, :, t0:t0 + CHUNK] = y.reshape(-1, h_, d_).transpose(1, 0, 2)
    return b"".join(out), back

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


# ---------------------------------------------------------------------------
# kvq v2: every scheme. A scheme is a dict with the Go Scheme's JSON fields
# (method, bits, group, axis, rotate, outliers, residual, sparsity).

GGML = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")


def quantize_asym(g: np.ndarray, bits: int) -> tuple[np.ndarray, int, int, np.ndarray]:
    """One asymmetric group: (codes uint8, scale FP16 bits, zero FP16 bits, reconstruction)."""
    qmax = np.float32(2**bits - 1)
    lo, hi = (g.min(), g.max()) if g.size else (np.float32(0), np.float32(0))
    with np.errstate(over="ignore"):
        m = np.float32(lo).astype(np.float16)
        s = np.float32((hi - lo) / qmax).astype(np.float16)
    if not (np.isfinite(m) and np.isfinite(s)):
        raise ScaleOverflow("group scale overflows FP16")
    mf, sf = np.float32(m), np.float32(s)
    if sf == 0:
        q = np.zeros(g.size, np.uint8)
    else:
        q = np.rint(np.clip((g - mf) / sf, np.float32(0), qmax)).astype(np.uint8)
    recon = (q.astype(np.float32) * sf).astype(np.float32) + mf
    return q, int(s.view(np.uint16)), int(m.view(np.uint16)), recon


def quantize_full(g: np.ndarray, bits: int) -> tuple[np.ndarray, int, np.ndarray]:
    """One full-range symmetric group ("symf"): s = fp16(e / -2^(b-1)), e the first element of
    largest |x|; q = clip(rint(x / s), -2^(b-1), 2^(b-1) - 1). (codes, scale FP16 bits, recon)."""
    half = np.float32(2 ** (bits - 1))
    e = g[int(np.argmax(np.abs(g)))] if g.size else np.float32(0)
    with np.errstate(over="ignore"):
        h = np.float32(e / -half).astype(np.float16)
    if not np.isfinite(h):
        raise ScaleOverflow("group scale overflows FP16")
    s = np.float32(h)
    if s == 0:  # stored as +0
        return np.zeros(g.size, np.int8), 0, np.zeros(g.size, np.float32)
    q = np.clip(np.rint(g / s), -half, half - 1).astype(np.int8)
    return q, int(h.view(np.uint16)), q.astype(np.float32) * s


# Lloyd-Max ("lm"): the levels of a unit Gaussian and the candidate scales' fractions, per width.
LM_LEVELS = {2: [0.4528, 1.5104], 3: [0.2451, 0.7560, 1.3439, 2.1519],
             4: [0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6180, 2.0690, 2.7326]}
LM_FRACTIONS = {2: [0.45, 0.55, 0.65, 0.75], 3: [0.7, 0.8, 0.9, 1.0], 4: [0.85, 0.95, 1.05, 1.15]}


def lm_codebook(bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(levels L, midpoints M, candidate factors F) in float32, computed in float64 first."""
    full = [-v for v in reversed(LM_LEVELS[bits])] + LM_LEVELS[bits]
    mids = [(a + b) / 2 for a, b in zip(full[:-1], full[1:])]
    return (np.array(full, np.float32), np.array(mids, np.float32),
            np.array([f / full[-1] for f in LM_FRACTIONS[bits]], np.float32))


def lane_sum(v: np.ndarray) -> np.float32:
    """Lane j sums v[j], v[j+8], ... in order in float32; then ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))."""
    lanes = [np.float32(0)] * 8
    for i, x in enumerate(v.astype(np.float32)):
        lanes[i % 8] = np.float32(lanes[i % 8] + x)
    l = lanes  # noqa: E741
    return np.float32(np.float32(np.float32(l[0] + l[1]) + np.float32(l[2] + l[3]))
                      + np.float32(np.float32(l[4] + l[5]) + np.float32(l[6] + l[7])))


def quantize_lm(g: np.ndarray, bits: int) -> tuple[np.ndarray, int, np.ndarray]:
    """One Lloyd-Max group: the candidate scale of least squared error (the first on ties);
    codes = #{k : x > M[k]*s}; recon = L[code]*s. A zero scale: codes n/2, recon +0."""
    levels, mids, fracs = lm_codebook(bits)
    a = np.max(np.abs(g)) if g.size else np.float32(0)
    best, best_err = None, np.float32(0)
    for f in fracs:
        with np.errstate(over="ignore"):
            h = np.float32(a * f).astype(np.float16)
        if not np.isfinite(h):
            raise ScaleOverflow("group scale overflows FP16")
        s = np.float32(h)
        q = (g[:, None] > (mids * s)[None, :]).sum(1)
        d = g - (levels * s)[q]
        err = lane_sum((d * d).astype(np.float32))
        if best is None or err < best_err:
            best, best_err = h, err
    s = np.float32(best)
    if s == 0:
        return np.full(g.size, levels.size // 2, np.int16), int(best.view(np.uint16)), np.zeros(g.size, np.float32)
    q = (g[:, None] > (mids * s)[None, :]).sum(1)
    return q.astype(np.int16), int(best.view(np.uint16)), (levels * s)[q]


def hadamard_rows(x: np.ndarray, d: int) -> np.ndarray:
    """The float32 Walsh-Hadamard butterfly on rows of d, then times float32(1/sqrt(d))."""
    v = np.array(x, dtype=np.float32).reshape(-1, d)
    h = 1
    while h < d:
        for i in range(0, d, 2 * h):
            a, b = v[:, i : i + h].copy(), v[:, i + h : i + 2 * h].copy()
            v[:, i : i + h], v[:, i + h : i + 2 * h] = a + b, a - b
        h *= 2
    return (v * np.float32(1 / np.sqrt(d))).reshape(-1)


def _smallest_first(mag: np.ndarray) -> np.ndarray:
    return np.argsort(mag, kind="stable")


def saturate(y: np.ndarray, dtype: str) -> np.ndarray:
    """Clamp to the dtype's finite range, as the codec does before rounding."""
    lim = {"F32": np.finfo(np.float32).max, "F16": np.float32(65504), "BF16": np.float32(3.3895313892515355e38)}[dtype]
    return np.clip(y, -lim, lim).astype(np.float32)


def compress_tensor(raw: bytes, dtype: str, shape: list[int], sc: dict) -> tuple[dict[str, bytes], bytes, int]:
    """Compress one tensor: (stored parts by suffix, restored bytes, outlier count)."""
    x = decode(raw, dtype).reshape(shape)
    needs4d = sc["axis"] == "channel" or sc["rotate"] or sc["residual"] > 0
    if needs4d and len(shape) != 4:
        raise ValueError("needs a 4-D")
    four = len(shape) == 4
    slab = four and (sc["residual"] > 0 or sc["axis"] == "channel")
    if slab:
        b, h, t, d = shape
        tq = t - min(sc["residual"], t)
        xq = x[:, :, :tq, :].copy()
        esz = {"F32": 4, "F16": 2, "BF16": 2}[dtype]
        resid_nat = np.frombuffer(raw, np.uint8).reshape(b, h, t, d * esz)[:, :, tq:, :]
        resid = resid_nat.tobytes()
    else:
        xq, resid, tq = x.copy(), b"", None
    qidx = np.arange(x.size).reshape(shape)[:, :, :tq, :].reshape(-1) if slab else np.arange(x.size)
    flat = xq.reshape(-1).copy()
    nq = flat.size
    if sc["sparsity"] > 0:
        k = int(sc["sparsity"] * nq)
        flat[_smallest_first(np.abs(flat))[:k]] = 0
    out_idx, out_val = np.zeros(0, np.uint32), np.zeros(0, np.uint16)
    if sc["outliers"] > 0:
        k = int(sc["outliers"] * nq)
        sel = np.sort(np.argsort(-np.abs(flat), kind="stable")[:k])
        vals = flat[sel].astype(np.float16)
        if not np.all(np.isfinite(vals)):
            raise ScaleOverflow("outlier overflows FP16")
        out_idx, out_val = qidx[sel].astype(np.uint32), vals.view(np.uint16)
        flat[sel] = 0
    if sc["rotate"]:
        if shape[3] & (shape[3] - 1):
            raise ValueError("power-of-two head_dim")
        flat = hadamard_rows(flat, shape[3])
    # q-order
    if sc["axis"] == "channel":
        b, h, _, d = shape
        xp = flat.reshape(b * h, tq, d).transpose(0, 2, 1).reshape(-1)
        row_len = tq
    else:
        xp, row_len = flat, nq
    parts: dict[str, bytes] = {}
    yp = np.zeros(nq, np.float32)
    m = sc["method"]
    if m in GGML:
        import gguf.quants as gq
        from gguf import GGMLQuantizationType as T

        if nq % 32:
            raise ValueError("multiple of 32")
        qt = getattr(T, m.upper())
        blocks = gq.quantize(xp.reshape(-1, 32), qt)
        with np.errstate(over="ignore", invalid="ignore"):
            yp = gq.dequantize(blocks, qt).reshape(-1).astype(np.float32)
        if not np.all(np.isfinite(yp)):
            raise ScaleOverflow("block scale overflows FP16")
        parts[".codes"] = blocks.tobytes()
    else:
        g, bits = sc["group"], sc["bits"]
        codes = np.zeros(nq, np.int16)
        scales, zeros = [], []
        for r0 in range(0, nq, row_len) if nq else []:
            for lo in range(r0, r0 + row_len, g):
                hi = min(lo + g, r0 + row_len)
                grp = xp[lo:hi]
                if m == "sym":
                    c, s, y = quantize(grp, bits, g)
                    scales.append(int(s[0]))
                elif m in ("symf", "lm"):
                    c, s, y = (quantize_full if m == "symf" else quantize_lm)(grp, bits)
                    scales.append(s)
                else:
                    c, s, z, y = quantize_asym(grp, bits)
                    scales.append(s)
                    zeros.append(z)
                codes[lo:hi], yp[lo:hi] = c, y
        parts[".codes"] = pack(codes, bits)
        parts[".scales"] = np.array(scales, "<u2").tobytes()
        if m == "asym":
            parts[".zeros"] = np.array(zeros, "<u2").tobytes()
    if out_idx.size:
        parts[".outlier_index"] = out_idx.astype("<u4").tobytes()
        parts[".outlier_value"] = out_val.astype("<u2").tobytes()
    if resid:
        parts[".residual"] = resid
    # Reconstruction: back to natural order, rotate, splice, outliers, dtype.
    if sc["axis"] == "channel":
        b, h, _, d = shape
        yq = yp.reshape(b * h, d, tq).transpose(0, 2, 1).reshape(-1)
    else:
        yq = yp
    if sc["rotate"]:
        yq = hadamard_rows(yq, shape[3])
    y = x.astype(np.float32).reshape(-1).copy()
    y[qidx] = yq
    y[out_idx.astype(np.int64)] = out_val.view(np.float16).astype(np.float32)
    return parts, encode(saturate(y, dtype), dtype), int(out_idx.size)

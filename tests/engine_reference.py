"""NumPy reference of the serving engines' KV-cache formats (kv-compress's engine-qualified
schemes, ``llama.cpp:q4_0`` and the rest): the arithmetic in executable form, step for step as
the engine's C, to pin the Go codec with shared vectors (tests/vectors/engine_vectors.json).
Production code never imports it.

llama.cpp as vendored in the llama-cpp-python 0.3.36 sdist (llama.cpp 0c1e57098, ggml 0.25.3),
x86-64 CPU build; paths below are relative to its vendor/llama.cpp/:

- the cache write: src/llama-graph.cpp:2883-2890 (rotation), src/llama-kv-cache.cpp:1336-1360
  (ggml_set_rows of one f32 row per token), ggml/src/ggml-cpu/ops.cpp:5476-5492 (from_float of
  the cache type on each row), ggml/src/ggml-cpu/ggml-cpu.c:216-385 (which from_float);
- the rotation: src/llama-kv-cache.cpp:315-336 (when), 1447-1487 (its size),
  src/llama-impl.h:57-76 (per chunk of n along head_dim), ggml/src/ggml-cpu/ops.cpp:12256-12330
  (the CPU kernel: inputs times 1.0f/sqrtf(n) first, then u+v / u-v butterflies);
- the quantizers: ggml/src/ggml-quants.c:113-274 (q4_0, q4_1, q5_0, q5_1 _ref),
  4937-5084 (iq4_nl), ggml/src/ggml-cpu/arch/x86/quants.c:302-398 (q8_0 on AVX/AVX2),
  ggml/src/ggml-cpu/ggml-cpu.c:3480-3511 (f16 with F16C), ggml/src/ggml-impl.h:419-444 (the
  FP32->FP16 of every block scale in ggml-quants.c);
- the read: ggml/src/ggml-quants.c:459-567, 2725-2741 (dequantize_row_*).

C conversions of a float to int8_t/uint8_t that the quantizers do are those of the x86 build
(cvttss2si: NaN and values beyond int32 give 0x80000000, then the low byte), which only blocks
whose largest |x| is below 2^-125 or whose scale overflows reach.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
ENGINE = "llama.cpp"
FORMATS = ("f16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")  # the -ctk/-ctv menu, common/arg.cpp:304-314
BLOCK_BYTES = {"f16": 2, "q8_0": 34, "q5_1": 24, "q5_0": 22, "q4_1": 20, "q4_0": 18, "iq4_nl": 18}  # per block
BITS = {"f16": 16, "q8_0": 8, "q5_1": 5, "q5_0": 5, "q4_1": 4, "q4_0": 4, "iq4_nl": 4}
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)  # ggml-common.h:1120-1122
IQ4NL_EMPTY_CODE = 8  # kvlib's code for a block with max|x| < 1e-15, which the engine leaves unwritten (see iq4_nl)


# --- float16 ----------------------------------------------------------------------------------

def fp16_bits(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_fp16 (ggml-impl.h:419-444): round to nearest even, overflow to Inf,
    every NaN to sign | 0x7E00."""
    x = np.asarray(x, F32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    sign = (x.view(np.uint32) >> 16).astype(np.uint16) & np.uint16(0x8000)
    return np.where(np.isnan(x), sign | np.uint16(0x7E00), h).astype(np.uint16)


def fp16_bits_f16c(x: np.ndarray) -> np.ndarray:
    """VCVTPS2PH with rounding 0 (ggml_cpu_fp32_to_fp16, ggml-cpu.c:3480-3511, and
    GGML_CPU_FP32_TO_FP16 with F16C, simd-mappings.h:61-64): as fp16_bits, but a NaN keeps its
    sign and the top 10 bits of its payload, quieted."""
    x = np.asarray(x, F32)
    b = x.view(np.uint32)
    nan = ((b >> 16).astype(np.uint16) & np.uint16(0x8000)) | np.uint16(0x7E00) | ((b >> 13) & 0x3FF).astype(np.uint16)
    return np.where(np.isnan(x), nan, fp16_bits(x)).astype(np.uint16)


def fp16_value(h: np.ndarray) -> np.ndarray:
    """FP16 bits to float32, exactly (ggml_compute_fp16_to_fp32, ggml-impl.h:388-417)."""
    return np.asarray(h, np.uint16).view(np.float16).astype(F32)


def c_cast_int(v: np.ndarray) -> np.ndarray:
    """(int32)(float) as x86 cvttss2si: truncation; NaN and |v| >= 2^31 give INT32_MIN."""
    v = np.asarray(v, F32).astype(np.float64)
    ok = np.isfinite(v) & (v >= -(2.0**31)) & (v < 2.0**31)
    return np.where(ok, np.trunc(np.where(ok, v, 0)), -(2.0**31)).astype(np.int64)


def c_int8(v: np.ndarray) -> np.ndarray:
    """(int8_t)(float) on x86-64: the low byte of cvttss2si (NaN and Inf give 0)."""
    return (c_cast_int(v) & 0xFF).astype(np.uint8).view(np.int8)


def c_uint8(v: np.ndarray) -> np.ndarray:
    """(uint8_t)(float) on x86-64: the low byte of cvttss2si."""
    return (c_cast_int(v) & 0xFF).astype(np.uint8)


# --- the Hadamard rotation ------------------------------------------------------------------------

def rotation_size(role: str, head_dim: int, head_dims_agree: bool = True) -> tuple[int, str]:
    """(n, why): the engine's Hadamard size for a quantized cache of this role, 0 when it runs
    without one. llama-kv-cache.cpp:321-336 (on when every layer has one head size and
    head_dim % 64 == 0), 1447-1466 (K: the largest power of two >= 64 dividing head_dim),
    1468-1487 (V: 64)."""
    if not head_dims_agree:
        return 0, "off (layers have different head sizes)"
    if head_dim % 64:
        return 0, f"off (head_dim {head_dim} is not a multiple of 64)"
    n = 64
    if role == "key":
        n = head_dim & -head_dim
    return n, f"on (Hadamard {n})"


def hadamard_rows(x: np.ndarray, n: int) -> np.ndarray:
    """ggml_compute_forward_fwht_impl (ops.cpp:12256-12330) on rows of n float32 values: each
    value times 1.0f/sqrtf(n) first, then for len = 1, 2, ..., n/2 the butterflies
    u, v = u + v, u - v (the SIMD stages' FMA u + v*(-1) is exactly u - v). Orthonormal and its
    own inverse."""
    scale = F32(1) / np.sqrt(F32(n))
    with np.errstate(over="ignore", invalid="ignore"):
        v = (np.asarray(x, F32).reshape(-1, n) * scale).astype(F32)
        h = 1
        while h < n:
            w = v.reshape(-1, n // (2 * h), 2, h)
            a, b = w[:, :, 0, :].copy(), w[:, :, 1, :].copy()
            w[:, :, 0, :], w[:, :, 1, :] = a + b, a - b
            h *= 2
    return v.reshape(-1)


# --- the block quantizers: x is [nblocks, 32] float32 -----------------------------------------------

def _signed_extreme(x: np.ndarray) -> np.ndarray:
    """max in `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`: the first element of largest |x|
    (NaNs never win)."""
    a = np.abs(x)
    a = np.where(np.isnan(a), F32(-1), a)
    idx = np.argmax(a, axis=1)
    m = x[np.arange(x.shape[0]), idx]
    return np.where(a.max(axis=1) > 0, m, F32(0)).astype(F32)


def _recip(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)


def _nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """qs[j] = (codes[j] & 0xF) | (codes[j+16] & 0xF) << 4."""
    return ((lo & 0xF) | ((hi & 0xF) << 4)).astype(np.uint8)


def _high_bits(q: np.ndarray) -> np.ndarray:
    """qh: bit j is bit 4 of code j (q5_0, q5_1)."""
    bits = ((q.astype(np.uint32) >> 4) & 1) << np.arange(32, dtype=np.uint32)
    return bits.sum(axis=1, dtype=np.uint64).astype("<u4")


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q4_0_ref, ggml-quants.c:113-148."""
    with np.errstate(all="ignore"):
        d = (_signed_extreme(x) / F32(-8)).astype(F32)
        id_ = _recip(d)
        v = (x * id_[:, None]).astype(F32) + F32(8.5)
    q = np.minimum(15, c_int8(v).astype(np.int64)).astype(np.uint8)  # MIN(15, (int8_t)...) -> uint8_t
    qs = (q[:, :16].astype(np.int64) | (q[:, 16:].astype(np.int64) << 4)).astype(np.uint8)
    out = np.zeros((x.shape[0], 18), np.uint8)
    out[:, :2] = fp16_bits(d).astype("<u2")[:, None].view(np.uint8)
    out[:, 2:] = qs
    return out


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q5_0_ref, ggml-quants.c:187-229."""
    with np.errstate(all="ignore"):
        d = (_signed_extreme(x) / F32(-16)).astype(F32)
        id_ = _recip(d)
        v = (x * id_[:, None]).astype(F32) + F32(16.5)
    q = np.minimum(31, c_int8(v).astype(np.int64)).astype(np.uint8)
    out = np.zeros((x.shape[0], 22), np.uint8)
    out[:, :2] = fp16_bits(d).astype("<u2")[:, None].view(np.uint8)
    out[:, 2:6] = _high_bits(q)[:, None].view(np.uint8)
    out[:, 6:] = _nibbles(q[:, :16], q[:, 16:])
    return out


def _min_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`if (v < min) min = v; if (v > max) max = v;` from FLT_MAX / -FLT_MAX (NaNs skipped)."""
    big = np.finfo(F32).max
    rows = np.arange(x.shape[0])
    a, b = np.where(np.isnan(x), big, x), np.where(np.isnan(x), -big, x)
    lo = a[rows, np.argmin(a, axis=1)]  # the first of equal minima: -0.0 and +0.0 keep the first's sign
    hi = b[rows, np.argmax(b, axis=1)]
    return lo.astype(F32), hi.astype(F32)


def _quantize_q_1(x: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo, hi = _min_max(x)
    with np.errstate(all="ignore"):
        d = ((hi - lo) / F32(qmax)).astype(F32)
        id_ = _recip(d)
        v = ((x - lo[:, None]).astype(F32) * id_[:, None]).astype(F32) + F32(0.5)
    return d, lo, v


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    """quantize_row_q4_1_ref, ggml-quants.c:150-185."""
    d, m, v = _quantize_q_1(x, 15)
    q = np.minimum(15, c_int8(v).astype(np.int64)).astype(np.uint8)
    qs = (q[:, :16].astype(np.int64) | (q[:, 16:].astype(np.int64) << 4)).astype(np.uint8)
    out = np.zeros((x.shape[0], 20), np.uint8)
    out[:, :2] = fp16_bits(d).astype("<u2")[:, None].view(np.uint8)
    out[:, 2:4] = fp16_bits(m).astype("<u2")[:, None].view(np.uint8)
    out[:, 4:] = qs
    return out


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    """quantize_row_q5_1_ref, ggml-quants.c:231-274 (no clamp: (uint8_t)(x0 + 0.5f))."""
    d, m, v = _quantize_q_1(x, 31)
    q = c_uint8(v)
    out = np.zeros((x.shape[0], 24), np.uint8)
    out[:, :2] = fp16_bits(d).astype("<u2")[:, None].view(np.uint8)
    out[:, 2:4] = fp16_bits(m).astype("<u2")[:, None].view(np.uint8)
    out[:, 4:8] = _high_bits(q)[:, None].view(np.uint8)
    out[:, 8:] = _nibbles(q[:, :16], q[:, 16:])
    return out


def _maxps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MAXPS: a > b ? a : b (a NaN in either gives b)."""
    return np.where(a > b, a, b)


def q8_0_amax_x86(x: np.ndarray) -> np.ndarray:
    """The max|x| reduction of arch/x86/quants.c:318-330, lane by lane as MAXPS orders it."""
    a = np.abs(x)  # _mm256_andnot_ps(-0.0f, v): NaNs stay NaN
    lanes = a[:, 0:8]
    for k in (1, 2, 3):
        lanes = _maxps(lanes, a[:, 8 * k : 8 * k + 8])
    m4 = _maxps(lanes[:, 4:8], lanes[:, 0:4])  # _mm_max_ps(extract hi, lo)
    m2 = _maxps(m4, m4[:, [2, 3, 2, 3]])  # movehl
    return _maxps(m2[:, 0], m2[:, 1]).astype(F32)  # max_ss with movehdup


def quantize_q8_0_x86(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0 on x86 AVX/AVX2, arch/x86/quants.c:302-398 (what set_rows runs for a
    q8_0 cache on x86): d = amax/127 (stored with F16C), id = 127/amax, codes round half to even,
    int32 conversion (NaN -> INT32_MIN) and signed saturation to int8."""
    amax = q8_0_amax_x86(x)
    with np.errstate(all="ignore"):
        d = (amax / F32(127)).astype(F32)
        id_ = np.where(amax != 0, F32(127) / np.where(amax != 0, amax, F32(1)), F32(0)).astype(F32)
        v = np.rint((x * id_[:, None]).astype(F32))  # _mm256_round_ps(_MM_ROUND_NEAREST): half to even
    i = c_cast_int(v)  # _mm256_cvtps_epi32 of integral values: the same as truncation
    q = np.clip(i, -128, 127).astype(np.int8)  # packs_epi32, packs_epi16: signed saturation
    out = np.zeros((x.shape[0], 34), np.uint8)
    out[:, :2] = fp16_bits_f16c(d).astype("<u2")[:, None].view(np.uint8)
    out[:, 2:] = q.view(np.uint8)
    return out


def quantize_q8_0_ref(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0_ref, ggml-quants.c:276-300 (what gguf.quants implements, and the CPU build
    without AVX): id = 1/(amax/127), roundf (half away from zero). For comparison only."""
    amax = np.zeros(x.shape[0], F32)
    for j in range(x.shape[1]):  # amax = MAX(amax, fabsf(v)): a > b ? a : b
        amax = _maxps(amax, np.abs(x[:, j])).astype(F32)
    with np.errstate(all="ignore"):
        d = (amax / F32(127)).astype(F32)
        id_ = _recip(d)
        v = (x * id_[:, None]).astype(F32)
        r = (np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5)).astype(F32)  # roundf: half away from zero
    q = c_int8(r)  # y[i].qs[j] = roundf(x0): (int8_t) of a float
    out = np.zeros((x.shape[0], 34), np.uint8)
    out[:, :2] = fp16_bits(d).astype("<u2")[:, None].view(np.uint8)
    out[:, 2:] = q.view(np.uint8)
    return out


def _best_index(al: np.ndarray) -> np.ndarray:
    """best_index_int8(16, kvalues_iq4nl, x), ggml-quants.c:28-37, elementwise."""
    val = KVALUES_IQ4NL.astype(F32)
    out = np.empty(al.shape, np.int64)
    for idx in np.ndindex(al.shape):
        x = al[idx]
        if x <= val[0]:
            out[idx] = 0
            continue
        if x >= val[15]:
            out[idx] = 15
            continue
        ml, mu = 0, 15
        while mu - ml > 1:
            mav = (ml + mu) // 2
            if x < val[mav]:
                mu = mav
            else:
                ml = mav
        out[idx] = mu - 1 if F32(x - val[mu - 1]) < F32(val[mu] - x) else mu
    return out


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    """quantize_row_iq4_nl_ref (ggml-quants.c:5071-5084) -> quantize_row_iq4_nl_impl
    (4937-5046) with super_block_size = block_size = 32, no importance weights and ntry = -1:
    weights x^2; d0 = max/-127 with max the first element of largest |x|; codes = the nearest
    codebook entry to x/d0; d = sumqx/sumq2 (float32 sums in element order, products left to
    right, no FMA: ggml-base is built without -march). A block with max|x| < 1e-15 gets d = 0
    and codes the engine leaves unwritten (L is never set for it); kvlib writes code 8 (+1), so
    the block restores +0."""
    out = np.zeros((x.shape[0], 18), np.uint8)
    kv = KVALUES_IQ4NL.astype(F32)
    for b in range(x.shape[0]):
        xb = x[b].astype(F32)
        amax, mx = F32(0), F32(0)
        for v in xb:
            if abs(v) > amax:
                amax, mx = abs(v), v
        if amax < F32(1e-15):
            d = F32(0)
            codes = np.full(32, IQ4NL_EMPTY_CODE, np.int64)
        else:
            with np.errstate(all="ignore"):
                d0 = F32(mx / F32(-127))
                id_ = F32(F32(1) / d0)
                codes = _best_index((id_ * xb).astype(F32))
                sumqx, sumq2 = F32(0), F32(0)
                for j in range(32):
                    q, w = kv[codes[j]], F32(xb[j] * xb[j])
                    sumqx = F32(sumqx + F32(F32(w * q) * xb[j]))
                    sumq2 = F32(sumq2 + F32(F32(w * q) * q))
                d = F32(sumqx / sumq2) if sumq2 > 0 else F32(0)
        out[b, :2] = fp16_bits(np.array([d], F32)).astype("<u2").view(np.uint8)
        out[b, 2:] = _nibbles(codes[:16], codes[16:])
    return out


def quantize_f16(x: np.ndarray) -> np.ndarray:
    """ggml_cpu_fp32_to_fp16 with F16C (ggml-cpu.c:3480-3511): element by element."""
    return fp16_bits_f16c(np.asarray(x, F32).reshape(-1)).astype("<u2").view(np.uint8)


QUANTIZE = {"f16": quantize_f16, "q8_0": quantize_q8_0_x86, "q5_1": quantize_q5_1, "q5_0": quantize_q5_0,
            "q4_1": quantize_q4_1, "q4_0": quantize_q4_0, "iq4_nl": quantize_iq4_nl}


# --- the read ------------------------------------------------------------------------------------

def dequantize(fmt: str, raw: bytes) -> np.ndarray:
    """dequantize_row_* (ggml-quants.c:459-567, 2725-2741): float32, each product rounded, then
    the minimum added (q4_1, q5_1); no FMA (ggml-base is built without -march)."""
    if fmt == "f16":
        return fp16_value(np.frombuffer(raw, "<u2"))
    b = np.frombuffer(raw, np.uint8).reshape(-1, BLOCK_BYTES[fmt])
    d = fp16_value(b[:, :2].copy().view("<u2")[:, 0])[:, None]
    with np.errstate(all="ignore"):
        if fmt == "q8_0":
            return (b[:, 2:].view(np.int8).astype(F32) * d).astype(F32).reshape(-1)
        if fmt in ("q4_1", "q5_1"):
            m = fp16_value(b[:, 2:4].copy().view("<u2")[:, 0])[:, None]
            off = 4
        else:
            off = 2
        if fmt in ("q5_0", "q5_1"):
            qh = b[:, off : off + 4].copy().view("<u4")[:, 0].astype(np.int64)
            off += 4
        qs = b[:, off:].astype(np.int64)
        q = np.concatenate([qs & 0xF, qs >> 4], axis=1)
        if fmt in ("q5_0", "q5_1"):
            q |= ((qh[:, None] >> np.arange(32)) & 1) << 4
        if fmt == "iq4_nl":
            y = d * KVALUES_IQ4NL.astype(F32)[q]
        elif fmt in ("q4_0", "q5_0"):
            y = (q - (8 if fmt == "q4_0" else 16)).astype(F32) * d
        else:
            y = (q.astype(F32) * d).astype(F32) + m
        return y.astype(F32).reshape(-1)


# --- a whole tensor ---------------------------------------------------------------------------

def compress_tensor(x: np.ndarray, shape: list[int], fmt: str, rot: int) -> tuple[bytes, np.ndarray]:
    """One [batch, heads, tokens, head_dim] tensor (any shape without rotation), float32 values:
    (the cache bytes, blocks of 32 along head_dim in row-major order, and the reconstruction:
    dequantized, then rotated back). rot is the Hadamard size (0: none)."""
    v = np.asarray(x, F32).reshape(-1)
    if rot:
        v = hadamard_rows(v, rot)
    raw = QUANTIZE[fmt](v if fmt == "f16" else v.reshape(-1, 32)).tobytes()
    y = dequantize(fmt, raw)
    if rot:
        y = hadamard_rows(y, rot)
    return raw, y

"""Generate tests/vectors/engine_vectors.json: kv-compress's engine formats (llama.cpp:f16 ...
llama.cpp:iq4_nl, and none) from the NumPy reference in tests/engine_reference.py, which
tests/test_engine_formats.py checks against llama.cpp's own C and the gguf package.

`python tests/make_engine_vectors.py` rewrites it; tests/test_engine_formats.py checks the committed
file equals this output and that the CLI reproduces it bit for bit; go test checks the Go package
against the same file (engine_test.go).

Three sections: "cases", whole caches through kv-compress (every format on F32, F16 and BF16 caches
with head_dim 64, 128 and 256, rotation on and off, outlier channels, an all-zero token-head, values
past the format's range, the refusals); "blocks", single blocks of any float32 bits (NaN, Inf,
subnormals, ties) through the block API; "rotations", the Hadamard kernel alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import engine_reference as er
import exllama_reference as xr
import mx_reference as mr
import sglang_reference as sr
import trtllm_reference as tr
import vllm_reference as vr
from kvq_reference import decode, encode, to_bf16_bits

OUT = Path(__file__).parent / "vectors" / "engine_vectors.json"
F32 = np.float32
QUANTIZED = [f for f in er.FORMATS if f != "f16"]


def spec_name(fmt: str, rotate: bool = True) -> str:
    """The canonical spelling: llama.cpp:q4_0, llama.cpp:q4_0/norot (f16 never rotates)."""
    return f"llama.cpp:{fmt}" + ("" if rotate or fmt == "f16" else "/norot")


def kv(rng, shape, role: str) -> np.ndarray:
    """Cache-like values: Gaussian, keys with two large channels (as post-RoPE keys have) and one
    larger still; an all-zero token-head (head 1, token 0)."""
    x = rng.standard_normal(shape).astype(F32)
    if role == "key":
        x[..., :2] *= F32(8)
        x[..., 5] *= F32(40)
    x[:, 1, 0, :] = 0
    return x


def restored_bytes(y: np.ndarray, dtype: str) -> bytes:
    """The reconstruction written in the source dtype as kv-compress writes an engine format's:
    finite values saturate at the dtype's largest, an Inf stays Inf; a NaN is F16 sign | 0x7e00,
    BF16 its top half | 0x40 (safetensors' conversions)."""
    y = np.asarray(y, F32).copy()
    if dtype == "F32":
        return y.astype("<f4").tobytes()
    lim = F32(65504) if dtype == "F16" else F32(3.3895313892515355e38)
    fin = np.isfinite(y)
    y[fin] = np.clip(y[fin], -lim, lim)
    nan = np.isnan(y)
    b = y.view(np.uint32)
    if dtype == "F16":
        with np.errstate(over="ignore"):
            h = y.astype(np.float16).view(np.uint16)
        h = np.where(nan, ((b >> 16) & 0x8000).astype(np.uint16) | np.uint16(0x7E00), h)
    else:
        h = np.where(nan, ((b >> 16) | 0x40).astype(np.uint16), to_bf16_bits(np.where(nan, F32(0), y)))
    return np.asarray(h, "<u2").tobytes()


def tensor(name: str, x: np.ndarray, dtype: str) -> dict:
    raw = encode(np.asarray(x, F32).reshape(-1), dtype)
    return dict(name=name, dtype=dtype, shape=list(x.shape), raw=raw)


def role_of(name: str) -> str:
    return "key" if name.endswith("_key") else "value"


def grid_case(rng, engine: str, fmt: str, dtype: str, hd: int, scale: float = 1.0) -> dict:
    """One case of the grid every engine format gets: keys and values of a [1, 2, 2, hd] cache (one
    token for head_dim 256) in the source dtype, through ENGINE:FMT (with /scaleS when not 1)."""
    ts = [tensor(f"layer_0_{r}", kv(rng, [1, 2, 2 if hd < 256 else 1, hd], r), dtype) for r in ("key", "value")]
    spec = f"{engine}:{fmt}" + ("" if scale == 1 else f"/scale{scale}")
    return dict(name=f"{engine}_{fmt}_{dtype.lower()}_hd{hd}", spec=spec, tensors=ts,
                schemes={t["name"]: (f"{engine}:{fmt}", scale) for t in ts})


def run_case(c: dict) -> dict:
    """Compress every tensor of a case as kv-compress does: the scheme of its slot, the engine's
    rotation for it, blocks of 32 in row-major order, and the restored bytes."""
    entry = dict(name=c["name"], spec=c["spec"], tensors=[])
    dims: dict[str, set] = {}
    for t in c["tensors"]:
        if len(t["shape"]) == 4:
            dims.setdefault(role_of(t["name"]), set()).add(t["shape"][3])
    for t in c["tensors"]:
        fmt, rotate = c["schemes"][t["name"]]
        out = dict(name=t["name"], dtype=t["dtype"], shape=t["shape"], input_hex=t["raw"].hex())
        entry["tensors"].append(out)
        if "error" in c:
            continue
        x = decode(t["raw"], t["dtype"])
        if fmt.startswith("sglang:"):  # rotate holds the static scale
            raw, y = sr.compress_tensor(x, fmt.split(":")[1], t["dtype"], rotate)
            out.update(format=fmt, parts={".codes": raw.hex()}, restored_hex=restored_bytes(y, t["dtype"]).hex(), rotation_size=0,
                       non_finite=int(np.sum(~np.isfinite(y))), saturated=0)
            continue
        if fmt.startswith("trtllm:"):  # rotate holds the static scale
            raw, y, sat = tr.compress_tensor(x, fmt.split(":")[1], t["dtype"], rotate)
            out.update(format=fmt, parts={".codes": raw.hex()}, restored_hex=restored_bytes(y, t["dtype"]).hex(), rotation_size=0,
                       non_finite=int(np.sum(~np.isfinite(y))), saturated=sat)
            continue
        if fmt.startswith("ocp:"):
            raw, y = mr.compress_tensor(x, fmt.split(":")[1])
            out.update(format=fmt, parts={".codes": raw.hex()}, restored_hex=restored_bytes(y, t["dtype"]).hex(), rotation_size=0,
                       non_finite=int(np.sum(~np.isfinite(y))))
            continue
        if fmt.startswith(("exllamav2:", "exllamav3:")):
            raw, y = xr.compress_tensor(x, ("v3:" if fmt.startswith("exllamav3:") else "") + fmt.split(":")[1])
            out.update(format=fmt, parts={".codes": raw.hex()}, restored_hex=restored_bytes(y, t["dtype"]).hex(), rotation_size=0,
                       non_finite=int(np.sum(~np.isfinite(y))))
            continue
        if fmt.startswith("vllm:"):  # rotate holds the static scale of a per-tensor format
            raw, y = vr.compress_tensor(x.reshape(t["shape"]), fmt.split(":")[1], rotate, t["dtype"])
            out.update(format=fmt, parts={".codes": raw.hex()}, restored_hex=restored_bytes(y, t["dtype"]).hex(), rotation_size=0,
                       non_finite=int(np.sum(~np.isfinite(y))), saturated=vr.saturated(x, fmt.split(":")[1], rotate))
            continue
        if fmt == "none":
            out.update(parts={".codes": t["raw"].hex()}, restored_hex=t["raw"].hex())
            continue
        rot, why = 0, ""
        if fmt != "f16" and rotate:
            rot, why = er.rotation_size(role_of(t["name"]), t["shape"][3], len(dims[role_of(t["name"])]) == 1)
        raw, y = er.compress_tensor(x, t["shape"], fmt, rot)
        out.update(format=fmt, parts={".codes": raw.hex()}, restored_hex=restored_bytes(y, t["dtype"]).hex(), rotation_size=rot,
                   non_finite=int(np.sum(~np.isfinite(y))))
    if "error" in c:
        entry["error"] = c["error"]
    return entry


def _cases() -> list[dict]:
    rng = np.random.default_rng(20260502)
    cases = []

    def both_roles(name, spec, fmt, rotate, dtype, shape, xs=None):
        ts = [tensor(f"layer_0_{r}", kv(rng, shape, r) if xs is None else xs[r], dtype) for r in ("key", "value")]
        cases.append(dict(name=name, spec=spec, tensors=ts, schemes={t["name"]: (fmt, rotate) for t in ts}))

    # Every format on every source dtype and head_dim 64, 128, 256, keys and values, with the
    # engine's default rotation (K: Hadamard of head_dim's largest power of two, V: 64).
    for fmt in er.FORMATS:
        for dtype in ("F32", "F16", "BF16"):
            for hd in (64, 128, 256):
                both_roles(f"{fmt}_{dtype.lower()}_hd{hd}", spec_name(fmt), fmt, True, dtype, [1, 2, 2 if hd < 256 else 1, hd])
    # Rotation off: /norot (LLAMA_ATTN_ROT_DISABLE=1), and head_dim 96 (not a multiple of 64).
    for fmt in QUANTIZED:
        both_roles(f"{fmt}_norot_hd128", spec_name(fmt, False), fmt, False, "F32", [1, 2, 1, 128])
        both_roles(f"{fmt}_hd96_no_rotation", spec_name(fmt), fmt, True, "F32", [1, 2, 2, 96])
    # Layers of different head sizes: the engine rotates neither role.
    ts = [tensor(f"layer_{i}_{r}", kv(rng, [1, 2, 2, hd], r), "F32") for i, hd in ((0, 64), (1, 128)) for r in ("key", "value")]
    cases.append(dict(name="q4_0_mixed_head_sizes", spec="llama.cpp:q4_0", tensors=ts, schemes={t["name"]: ("q4_0", True) for t in ts}))
    # K and V formats set independently (-ctk q8_0 -ctv q4_0), and layers skipped with none.
    both_roles("per_role_q8_0_q4_0", "k=llama.cpp:q8_0,v=llama.cpp:q4_0", None, True, "BF16", [1, 2, 3, 128])
    cases[-1]["schemes"] = {"layer_0_key": ("q8_0", True), "layer_0_value": ("q4_0", True)}
    ts = [tensor(f"layer_{i}_{r}", kv(rng, [1, 2, 2, 64], r), "F16") for i in range(3) for r in ("key", "value")]
    cases.append(dict(name="skip_layers_none", spec="llama.cpp:q4_0,k0-1=none,v0-1=none", tensors=ts,
                      schemes={t["name"]: ("none" if t["name"][6] in "01" else "q4_0", True) for t in ts}))
    for dtype in ("F32", "F16", "BF16"):
        t = tensor("t", rng.standard_normal(40).astype(F32) * 5, dtype)
        cases.append(dict(name=f"none_{dtype.lower()}", spec="none", tensors=[t], schemes={"t": ("none", False)}))
    # Values past the format's range, as the engine stores them: f16 overflows to Inf; a block
    # scale past FP16 is stored as Inf and reads back as Inf and NaN.
    big = np.array([1e5, -7e4, 65519, 65520, -65504, 3, 0, 1], F32)
    cases.append(dict(name="f16_overflow_f32", spec="llama.cpp:f16", tensors=[tensor("t", big, "F32")], schemes={"t": ("f16", False)}))
    cases.append(dict(name="f16_overflow_bf16", spec="llama.cpp:f16", tensors=[tensor("t", big, "BF16")], schemes={"t": ("f16", False)}))
    over = np.tile(np.linspace(-1, 1, 32, dtype=F32), 2)
    over[:32] *= F32(1e7)  # q8_0: d = 1e7/127 > 65504; q4_0: d = 1.25e6
    for fmt in QUANTIZED:
        cases.append(dict(name=f"{fmt}_scale_overflow", spec=spec_name(fmt, False), tensors=[tensor("t", over, "F32")],
                          schemes={"t": (fmt, False)}))
    # Rotation scales first: values near FLT_MAX rotate without overflow (their block scale then
    # overflows FP16, as above) ...
    huge = (rng.standard_normal([1, 1, 2, 64]) * 1e37).astype(F32)
    huge[0, 0, 0, :4] = 3.3e38
    cases.append(dict(name="q8_0_rotated_near_flt_max", spec="llama.cpp:q8_0", tensors=[tensor("layer_0_key", huge, "F32")],
                      schemes={"layer_0_key": ("q8_0", True)}))
    # ... but sums past FLT_MAX overflow to Inf, which the engine quantizes as it quantizes any Inf.
    over_rot = np.full([1, 1, 2, 128], 3e38, F32)
    over_rot[0, 0, 1, ::3] = -3e38
    for fmt in ("q4_0", "q8_0", "iq4_nl"):
        cases.append(dict(name=f"{fmt}_rotation_overflow", spec=spec_name(fmt), tensors=[tensor("layer_0_key", over_rot, "F32")],
                          schemes={"layer_0_key": (fmt, True)}))
    # Subnormal blocks, whose reciprocal scale overflows (the C cast of Inf and NaN).
    tiny = (rng.standard_normal(96) * 1e-39).astype(F32)
    for fmt in QUANTIZED:
        cases.append(dict(name=f"{fmt}_subnormal", spec=spec_name(fmt, False), tensors=[tensor("t", tiny, "F32")],
                          schemes={"t": (fmt, False)}))
    # q8_0 ties: x*127/amax on a half rounds to even on x86 (the _ref and gguf: away from zero).
    ties = np.zeros(64, F32)
    ties[0], ties[1:32] = 127, np.arange(31) - 15 + 0.5
    ties[32], ties[33:64] = -63.5, np.arange(31) * 2 - 31 + 1  # amax 63.5: x*2 on odd halves
    cases.append(dict(name="q8_0_ties", spec="llama.cpp:q8_0/norot", tensors=[tensor("t", ties, "F32")], schemes={"t": ("q8_0", False)}))
    # Signed zeros: the C keeps the first of equal extremes (q4_1's min, q4_0's max of a zero block).
    sz = np.zeros(64, F32)
    sz[1], sz[2:32] = -0.0, np.abs(rng.standard_normal(30)).astype(F32)
    sz[32:64] = -0.0
    for fmt in ("q4_0", "q4_1", "q5_0", "q5_1"):
        cases.append(dict(name=f"{fmt}_signed_zeros", spec=spec_name(fmt, False), tensors=[tensor("t", sz, "F32")],
                          schemes={"t": (fmt, False)}))
    # Refusals.
    errs = [
        ("q4_0_hd80_refused", "llama.cpp:q4_0", [1, 2, 2, 80], "llama.cpp refuses q4_0 for head_dim 80"),
        ("q8_0_needs_4d", "llama.cpp:q8_0", [64], "needs a 4-D"),
        ("iq4_nl_nan", "llama.cpp:iq4_nl/norot", [64], "NaN or Inf cannot be quantized"),
        ("f16_inf_input", "llama.cpp:f16", [8], "NaN or Inf cannot be quantized"),
        ("none_nan", "none", [8], "NaN or Inf cannot be quantized"),
    ]
    for name, spec, shape, msg in errs:
        x = rng.standard_normal(shape).astype(F32)
        if "nan" in name or "inf" in name:
            x.reshape(-1)[3] = np.nan if "nan" in name else np.inf
        t = tensor("t", x, "F32")
        cases.append(dict(name=name, spec=spec, tensors=[t], schemes={"t": (None, True)}, error=msg))
    # head_dim 80 is fine for f16, which has no blocks
    t = tensor("layer_0_key", rng.standard_normal([1, 2, 3, 80]).astype(F32), "F16")
    cases.append(dict(name="f16_hd80", spec="llama.cpp:f16", tensors=[t], schemes={"layer_0_key": ("f16", False)}))
    return (cases + _vllm_cases(rng) + _sglang_cases(rng) + _trtllm_cases(rng) + _exllama_cases(rng) + _mx_cases(rng)
            + _nvfp4_cases() + _turboquant_cases())


def _turboquant_cases() -> list[dict]:
    """vLLM's TurboQuant presets (tests/vllm_reference.py; a generator of their own, so the other
    vectors stay as they were): each preset on F32, F16 and BF16 caches with head_dim 64, 128 and 256
    (outlier key channels, an all-zero token-head); the boundary layers stored by none (six layers,
    three, an override of a boundary slot, --kv-cache-dtype-skip-layers as kv2=none); values past
    the range (fp16 norms and zeros past 65504, float32 norms past FLT_MAX, FP8 keys past 448), exact
    zeros of the rotation, V ties, signed zeros; the head_dim refusals and NaN/Inf."""
    rng = np.random.default_rng(20260707)
    cases = []

    def schemes(ts, preset, skipped=()):
        k, v = vr.TURBOQUANT[preset]
        out = {}
        for t in ts:
            layer = int(t["name"].split("_")[1])
            fmt = k if t["name"].endswith("_key") else v
            out[t["name"]] = ("none", False) if layer in skipped else (f"vllm:{fmt}", 1.0)
        return out

    for preset in vr.TURBOQUANT:
        for dtype in ("F32", "F16", "BF16"):
            for hd in (64, 128, 256):
                ts = [tensor(f"layer_0_{r}", kv(rng, [1, 2, 2 if hd < 256 else 1, hd], r), dtype) for r in ("key", "value")]
                cases.append(dict(name=f"vllm_{preset}_{dtype.lower()}_hd{hd}", spec=vr.tq_spec(preset), tensors=ts,
                                  schemes=schemes(ts, preset)))
    # The boundary rule: of six layers, 0, 1, 4 and 5 are stored as they are; of three, 0 and 2.
    for preset, n_layers, dtype in (("turboquant_k3v4_nc", 6, "F16"), ("turboquant_k8v4", 3, "BF16")):
        ts = [tensor(f"layer_{i}_{r}", kv(rng, [1, 2, 2, 64], r), dtype) for i in range(n_layers) for r in ("key", "value")]
        cases.append(dict(name=f"vllm_{preset}_{n_layers}_layers", spec=vr.tq_spec(preset), tensors=ts,
                          schemes=schemes(ts, preset, vr.tq_boundary_layers(n_layers))))
    # --kv-cache-dtype-skip-layers 2 beside the boundary (kv2=none), and a boundary slot set by the user.
    ts = [tensor(f"layer_{i}_{r}", kv(rng, [1, 2, 2, 128], r), "BF16") for i in range(6) for r in ("key", "value")]
    cs = schemes(ts, "turboquant_4bit_nc", vr.tq_boundary_layers(6) + [2])
    cases.append(dict(name="vllm_turboquant_4bit_nc_skip_layer_2", spec=vr.tq_spec("turboquant_4bit_nc") + ",k2=none,v2=none",
                      tensors=ts, schemes=cs))
    ts = [tensor(f"layer_{i}_{r}", kv(rng, [1, 2, 2, 64], r), "F16") for i in range(4) for r in ("key", "value")]
    cs = schemes(ts, "turboquant_3bit_nc", range(4))
    cs["layer_0_value"] = ("vllm:turboquant_v4", 1.0)
    cases.append(dict(name="vllm_turboquant_3bit_nc_boundary_override", spec=vr.tq_spec("turboquant_3bit_nc") + ",v0=vllm:turboquant_v4",
                      tensors=ts, schemes=cs))
    # Past the range and edges, one token-head each: norms past fp16 (Inf and NaN read back) and past
    # FLT_MAX (x / Inf = 0), keys past 448, V zeros past fp16, a V range past FLT_MAX (NaN codes: 0),
    # a rotation with exact zeros (ties to the upper centroid), V on its rounding ties, signed zeros.
    base = rng.standard_normal((8, 64)).astype(F32)
    edge = base.copy()
    edge[0] *= F32(2e4)  # ||k|| ~ 1.6e5: fp16 Inf
    edge[1] = F32(3e38) * np.sign(base[1])  # squares past FLT_MAX: norm Inf
    edge[2] = F32(0)
    edge[2, :2] = F32(1)  # PiT x has exact zeros
    edge[3] = np.r_[F32(0), F32(15), (np.arange(62) % 15 + F32(0.5)).astype(F32)]  # V scale 1: every half
    edge[4] = np.r_[F32(-0.0), F32(0.0), np.abs(base[4, 2:])].astype(F32)  # min is a signed zero
    edge[5] = np.r_[F32(600), F32(-448.5), F32(448), F32(464), base[5, 4:]].astype(F32)  # FP8 past 448
    edge[6] = np.r_[F32(-1e5), F32(7e4), base[6, 2:]].astype(F32)  # V scale and zero past fp16
    edge[7] = (base[7] * F32(1e-30)).astype(F32)  # tiny: the 1e-8 floor and the 1e-8 in the norm
    x = edge.reshape(1, 1, 8, 64)
    for preset in vr.TURBOQUANT:
        ts = [tensor(f"layer_0_{r}", x, "F32") for r in ("key", "value")]
        cases.append(dict(name=f"vllm_{preset}_past_the_range", spec=vr.tq_spec(preset), tensors=ts, schemes=schemes(ts, preset)))
    # FP8 keys and 4-bit values take head_dim 96; the MSE keys, a power of two (16 to 512).
    ts = [tensor(f"layer_0_{r}", kv(rng, [1, 2, 3, 96], r), "BF16") for r in ("key", "value")]
    cases.append(dict(name="vllm_turboquant_k8v4_hd96", spec=vr.tq_spec("turboquant_k8v4"), tensors=ts,
                      schemes=schemes(ts, "turboquant_k8v4")))
    errs = [("vllm_turboquant_4bit_nc_hd96_refused", vr.tq_spec("turboquant_4bit_nc"), [1, 2, 2, 96],
             "vLLM refuses turboquant_k4_nc for head_dim 96"),
            ("vllm_turboquant_k3v4_nc_hd8_refused", vr.tq_spec("turboquant_k3v4_nc"), [1, 1, 2, 8],
             "kvlib refuses vLLM's turboquant_k3_nc for head_dim 8"),
            ("vllm_turboquant_v3_hd20_refused", "k=vllm:turboquant_k8,v=vllm:turboquant_v3", [1, 1, 2, 20],
             "vLLM refuses turboquant_v3 for head_dim 20"),
            ("vllm_turboquant_v4_hd5_refused", "k=vllm:turboquant_k8,v=vllm:turboquant_v4", [1, 1, 2, 5],
             "kvlib refuses vLLM's turboquant_v4 for head_dim 5"),
            ("vllm_turboquant_inf", vr.tq_spec("turboquant_4bit_nc"), [1, 1, 2, 64], "NaN or Inf cannot be quantized")]
    for name, spec, shape, msg in errs:
        x = rng.standard_normal(shape).astype(F32)
        if name.endswith("_inf"):
            x.reshape(-1)[3] = np.inf
        role = "key" if "hd96" in name or "hd8" in name or name.endswith("_inf") else "value"
        cases.append(dict(name=name, spec=spec, tensors=[tensor(f"layer_0_{role}", x, "F32")], schemes={f"layer_0_{role}": (None, True)},
                          error=msg))
    return cases


NVFP4_FORMATS = [("vllm", f) for f in vr.NVFP4] + [("trtllm", "nvfp4")]


def _nvfp4_cases() -> list[dict]:
    """The NVFP4 formats (tests/nvfp4_reference.py; a generator of their own, so the other engines'
    vectors stay as they were): F32, F16 and BF16 caches with head_dim 64, 128 and 256 (outlier key
    channels, an all-zero token-head) at scale 1; a calibrated scale per role (amax / 2688) and a
    checkpoint-like one on an F16 cache; values past the range (block scales past 448, Inf-sized
    values, E2M1 ties, 4over6 ties, blocks whose scale rounds to E4M3 zero, subnormals); the
    head_dim % 16 and NaN/Inf refusals."""
    rng = np.random.default_rng(20260611)
    cases = []
    for engine, fmt in NVFP4_FORMATS:
        for dtype in ("F32", "F16", "BF16"):
            for hd in (64, 128, 256):
                cases.append(grid_case(rng, engine, fmt, dtype, hd))
        x = {r: kv(rng, [1, 2, 3, 128], r) * F32(20) for r in ("key", "value")}
        ts = [tensor(f"layer_0_{r}", x[r], "BF16") for r in ("key", "value")]
        ks, vs = (F32(np.max(np.abs(decode(t["raw"], "BF16"))) / F32(vr.nr.SCALE_MAX)) for t in ts)  # the cache's amax
        spec = f"k={engine}:{fmt}/scale{ks!r},v={engine}:{fmt}/scale{vs!r}".replace("np.float32(", "").replace(")", "")
        cases.append(dict(name=f"{engine}_{fmt}_calibrated", spec=spec, tensors=ts,
                          schemes={"layer_0_key": (f"{engine}:{fmt}", float(ks)), "layer_0_value": (f"{engine}:{fmt}", float(vs))}))
        x = kv(rng, [1, 2, 3, 64], "key") * F32(100)
        cases.append(dict(name=f"{engine}_{fmt}_f16_scale", spec=f"{engine}:{fmt}/scale37", tensors=[tensor("layer_0_key", x, "F16")],
                          schemes={"layer_0_key": (f"{engine}:{fmt}", 37.0)}))
    ties = np.array([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, -6], F32)
    edges = [ties, ties * F32(2.0 ** -6), ties * F32(2.0 ** 7),
             np.r_[F32(6000), F32(-3000), F32(2700), F32(2688), np.linspace(-100, 100, 12, dtype=F32)].astype(F32),  # scale past 448
             np.r_[F32(1e5), F32(-1e5), F32(7e4), F32(3.3e38), np.ones(12, F32)].astype(F32),
             np.r_[F32(6), F32(3), np.zeros(14, F32)].astype(F32),  # /6 and /4 both exact: 4over6 keeps /6
             np.full(16, 4, F32),  # /4 exact, /6 not: 4over6 takes /4
             np.r_[F32(1e-3), F32(-1e-3), F32(5e-4), np.zeros(13, F32)].astype(F32),  # SF rounds to E4M3 zero
             np.r_[F32(-0.0), F32(6e-3), F32(-2e-3), np.zeros(13, F32)].astype(F32),  # just above it
             np.r_[F32(1e-39), F32(-3e-42), np.zeros(14, F32)].astype(F32),  # subnormal
             (rng.standard_normal(16) * 1e-20).astype(F32), (rng.standard_normal(16) * 3e3).astype(F32),
             np.r_[np.nextafter(F32(6), F32(7)), F32(1.2500001), F32(0.74999994), np.ones(13, F32) * F32(-0.3)].astype(F32),
             np.zeros(16, F32), np.full(16, -0.0, F32), np.linspace(-1, 1, 16, dtype=F32)]
    edge = np.concatenate(edges).reshape(1, 1, len(edges) // 2, 32)
    for engine, fmt in NVFP4_FORMATS:
        cases.append(dict(name=f"{engine}_{fmt}_past_the_range", spec=f"{engine}:{fmt}", tensors=[tensor("layer_0_key", edge, "F32")],
                          schemes={"layer_0_key": (f"{engine}:{fmt}", 1.0)}))
    errs = [("vllm_nvfp4_hd40_refused", "vllm:nvfp4", [1, 2, 2, 40], "vLLM refuses nvfp4 for head_dim 40"),
            ("vllm_nvfp4_4over6_hd24_refused", "vllm:nvfp4_4over6", [1, 1, 2, 24], "vLLM refuses nvfp4_4over6 for head_dim 24"),
            ("trtllm_nvfp4_hd40_refused", "trtllm:nvfp4", [1, 2, 2, 40], "kvlib refuses TensorRT-LLM's nvfp4 for head_dim 40"),
            ("vllm_nvfp4_inf", "vllm:nvfp4_4over6", [1, 1, 2, 64], "NaN or Inf cannot be quantized"),
            ("trtllm_nvfp4_nan", "trtllm:nvfp4", [1, 1, 2, 64], "NaN or Inf cannot be quantized")]
    for name, spec, shape, msg in errs:
        x = rng.standard_normal(shape).astype(F32)
        if name.endswith(("_nan", "_inf")):
            x.reshape(-1)[3] = np.nan if name.endswith("_nan") else np.inf
        cases.append(dict(name=name, spec=spec, tensors=[tensor("t", x, "F32")], schemes={"t": (None, True)}, error=msg))
    return cases


def _sglang_cases(rng) -> list[dict]:
    """SGLang 0.5.10.post1's FP8 formats (tests/sglang_reference.py): every format on F32, F16 and
    BF16 caches with head_dim 64, 128 and 256; a checkpoint scale (the division in the cache's dtype);
    values past the range (NaN for e4m3, Inf for e5m2, as torch's cast gives)."""
    cases = []
    for fmt in sr.FP8_FORMATS:
        for dtype in ("F32", "F16", "BF16"):
            for hd in (64, 128, 256):
                cases.append(grid_case(rng, "sglang", fmt, dtype, hd))
            x = kv(rng, [1, 2, 3, 64], "key") * F32(30)
            ts = [tensor("layer_0_key", x, dtype)]
            cases.append(dict(name=f"sglang_{fmt}_{dtype.lower()}_scale", spec=f"sglang:{fmt}/scale0.37", tensors=ts,
                              schemes={"layer_0_key": (f"sglang:{fmt}", 0.37)}))
        edge = np.array([1e5, -1e5, 448, 464, 465, -470, 480, 57344, 61439, 61440, 7e4, 3.3e38, 2.0 ** -9, 2.0 ** -10,
                         2.0 ** -16, 2.0 ** -17, -0.0, 0.0, 1.0625, 17, 19, 0.3, -0.7, 500] * 4 + [0.0] * 32, F32)
        cases.append(dict(name=f"sglang_{fmt}_past_the_range", spec=f"sglang:{fmt}",
                          tensors=[tensor("layer_0_key", edge.reshape(1, 1, 2, 64), "F32")],
                          schemes={"layer_0_key": (f"sglang:{fmt}", 1.0)}))
    return cases + _sglang_fp4_cases(rng)


def _sglang_fp4_cases(rng) -> list[dict]:
    """sglang:fp4_e2m1: F32, F16 and BF16 caches with head_dim 64, 128 and 256 (outlier key channels,
    an all-zero token-head); blocks on the E2M1 bounds (ties away from zero), block maxima at and just
    past 6 * 2**k, tiny and huge blocks, negative values that round to 0; head_dim 40 refused."""
    fmt, cases = "sglang:fp4_e2m1", []
    for dtype in ("F32", "F16", "BF16"):
        for hd in (64, 128, 256):
            cases.append(grid_case(rng, "sglang", "fp4_e2m1", dtype, hd))
    ties = np.array([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -1.25, -2.5, -5, -0.1, 0.2499, 4.99, -0.0], F32)
    edges = [ties, ties * F32(2.0 ** -7), ties * F32(2.0 ** 9),
             np.r_[F32(48.25), np.linspace(-40, 40, 15, dtype=F32)].astype(F32),  # just past 6 * 2**3
             np.r_[np.nextafter(F32(24), F32(30)), np.ones(15, F32)].astype(F32),  # 1 ulp past 6 * 2**2
             np.r_[F32(6e-10), -F32(1e-12), np.zeros(14, F32)].astype(F32),  # the 1e-10 floor
             np.r_[F32(3.4e38), -F32(3.4e38), np.ones(14, F32)].astype(F32),  # the largest scale byte: Inf read back
             np.r_[F32(-0.5), F32(-1e-20), np.zeros(14, F32)].astype(F32),
             np.r_[F32(12), -F32(1.4e-45), F32(6e30), -F32(1e-30), np.zeros(12, F32)].astype(F32),  # underflow: -0, sign 0
             np.r_[F32(1e38), -F32(1e-10), -F32(3e-8), np.ones(13, F32)].astype(F32)]
    x = np.concatenate(edges + [np.zeros(32, F32)]).reshape(1, 1, 3, 64)
    cases.append(dict(name="sglang_fp4_e2m1_edges", spec=fmt, tensors=[tensor("layer_0_key", x, "F32")],
                      schemes={"layer_0_key": (fmt, 1.0)}))
    x = rng.standard_normal([1, 2, 3, 40]).astype(F32)
    cases.append(dict(name="sglang_fp4_e2m1_hd40_refused", spec=fmt, tensors=[tensor("t", x, "F32")],
                      schemes={"t": (None, True)}, error="kvlib refuses SGLang's fp4_e2m1 for head_dim 40"))
    x = rng.standard_normal([1, 1, 2, 64]).astype(F32)
    x[0, 0, 1, 3] = np.inf
    cases.append(dict(name="sglang_fp4_e2m1_inf", spec=fmt, tensors=[tensor("t", x, "F32")],
                      schemes={"t": (None, True)}, error="NaN or Inf cannot be quantized"))
    return cases


def _trtllm_cases(rng) -> list[dict]:
    """TensorRT-LLM's fp8 and int8 (tests/trtllm_reference.py): F32, F16 and BF16 caches with head_dim
    64, 128 and 256 at scale 1 (fp8: the PyTorch backend) and a checkpoint scale (the engine backend:
    the multiplier rounded to the cache's dtype for fp8); values past the range; int8's ties to even
    and -128."""
    cases = []
    for fmt in tr.EIGHT_BIT:
        for dtype in ("F32", "F16", "BF16"):
            for hd in (64, 128, 256):
                cases.append(grid_case(rng, "trtllm", fmt, dtype, hd, 1.0 if fmt == "fp8" else 0.05))
            x = kv(rng, [1, 2, 3, 64], "key") * F32(30)
            cases.append(dict(name=f"trtllm_{fmt}_{dtype.lower()}_scale", spec=f"trtllm:{fmt}/scale0.37",
                              tensors=[tensor("layer_0_key", x, dtype)], schemes={"layer_0_key": (f"trtllm:{fmt}", 0.37)}))
    edge = np.array([1e5, -1e5, 448, 464, 465, -480, 127.5, -127.5, -128.5, 2.5, 3.5, -2.5, 126.5, 7e4, 3.3e38, 2.0 ** -9,
                     2.0 ** -10, 2.0 ** -16, 1e-30, -0.0, 0.0, 1.0625, 17, 0.3] * 4 + [0.0] * 32, F32)
    for fmt in tr.EIGHT_BIT:
        cases.append(dict(name=f"trtllm_{fmt}_past_the_range", spec=f"trtllm:{fmt}", tensors=[tensor("layer_0_key", edge.reshape(1, 1, 2, 64), "F32")],
                          schemes={"layer_0_key": (f"trtllm:{fmt}", 1.0)}))
    return cases


def _mx_cases(rng) -> list[dict]:
    """The OCP MX formats (tests/mx_reference.py): F32, F16 and BF16 caches with head_dim 64, 128 and
    256; ties of each element format, maxima just under and at powers of two (V / X up to 2**(emax+1):
    saturated), an all-zero block (scale 2**-127), tiny and huge blocks; head_dim 48 refused."""
    cases = []
    for fmt in mr.FORMATS:
        for dtype in ("F32", "F16", "BF16"):
            for hd in (64, 128, 256):
                cases.append(grid_case(rng, "ocp", fmt, dtype, hd))
        ties = np.r_[F32([7.9, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -5, -0.1, 6, 7, 4.5, 0.0625, 0.09375, 0.03125]),
                     np.linspace(-2, 2, 16, dtype=F32)].astype(F32)
        edge = np.r_[ties, ties * F32(2.0 ** 20), np.zeros(32, F32), np.nextafter(F32(512), F32(0)), np.ones(31, F32),
                     F32(3e38), np.ones(31, F32) * F32(1e30), F32(1e-30), np.zeros(31, F32), F32(1e-44), np.zeros(31, F32),
                     F32([448, -449, 6, -6.5]), np.ones(28, F32)].astype(F32)
        cases.append(dict(name=f"ocp_{fmt}_edges", spec=f"ocp:{fmt}", tensors=[tensor("layer_0_key", edge.reshape(1, 1, 4, 64), "F32")],
                          schemes={"layer_0_key": (f"ocp:{fmt}", 1.0)}))
    x = rng.standard_normal([1, 2, 2, 48]).astype(F32)
    cases.append(dict(name="ocp_mxfp4_hd48_refused", spec="ocp:mxfp4", tensors=[tensor("t", x, "F32")],
                      schemes={"t": (None, True)}, error="kvlib refuses mxfp4 for head_dim 48"))
    return cases


def _exllama_cases(rng) -> list[dict]:
    """ExLlamaV2 0.3.2's caches (tests/exllama_reference.py): every format on F32, F16 and BF16 caches
    with head_dim 64, 128 and 256; Q6 (K q8, V q4); an all-zero group; values past fp16's range (Inf
    and NaN after the fp16 butterfly, as the engine stores them); fp16 subnormals and ties of the
    truncation; head_dim 96 refused."""
    cases = []
    for fmt in xr.FORMATS:
        for dtype in ("F32", "F16", "BF16"):
            for hd in (64, 128, 256):
                cases.append(grid_case(rng, "exllamav2", fmt, dtype, hd))
    ts = [tensor(f"layer_0_{r}", kv(rng, [1, 3, 4, 64], r), "BF16") for r in ("key", "value")]
    cases.append(dict(name="exllamav2_q6", spec="k=exllamav2:q8,v=exllamav2:q4", tensors=ts,  # what exllamav2:q6 names
                      schemes={"layer_0_key": ("exllamav2:q8", 1.0), "layer_0_value": ("exllamav2:q4", 1.0)}))
    edge = np.r_[np.zeros(32, F32), rng.standard_normal(32).astype(F32),  # an all-zero scale group
                 F32([7e4, -7e4, 65504, 65519, 65520, 3e-5, 6e-8, 2.9e-8, -1e-9, 1.5, -1.5, 0.999]),
                 (rng.standard_normal(52) * 3000).astype(F32)].astype(F32)  # fp16 sums past 65504
    for fmt in xr.FORMATS:
        cases.append(dict(name=f"exllamav2_{fmt}_edges", spec=f"exllamav2:{fmt}", tensors=[tensor("layer_0_key", edge.reshape(1, 1, 2, 64), "F32")],
                          schemes={"layer_0_key": (f"exllamav2:{fmt}", 1.0)}))
    # ExLlamaV3: every width on F32, F16 and BF16 caches with head_dim 64, 128 and 256; K and V widths
    # apart (-cq 4,8); the edges; head_dim 48 refused.
    for bits in xr.V3_BITS:
        for dtype in ("F32", "F16", "BF16"):
            for hd in (64, 128, 256):
                cases.append(grid_case(rng, "exllamav3", bits, dtype, hd))
        cases.append(dict(name=f"exllamav3_{bits}_edges", spec=f"exllamav3:{bits}", tensors=[tensor("layer_0_key", edge.reshape(1, 1, 2, 64), "F32")],
                          schemes={"layer_0_key": (f"exllamav3:{bits}", 1.0)}))
    ts = [tensor(f"layer_0_{r}", kv(rng, [1, 3, 4, 64], r), "BF16") for r in ("key", "value")]
    cases.append(dict(name="exllamav3_k4_v8", spec="k=exllamav3:4,v=exllamav3:8", tensors=ts,
                      schemes={"layer_0_key": ("exllamav3:4", 1.0), "layer_0_value": ("exllamav3:8", 1.0)}))
    x = rng.standard_normal([1, 2, 2, 48]).astype(F32)
    cases.append(dict(name="exllamav3_4_hd48_refused", spec="exllamav3:4", tensors=[tensor("t", x, "F32")],
                      schemes={"t": (None, True)}, error="kvlib refuses ExLlamaV3's 4-bit cache for head_dim 48"))
    x = rng.standard_normal([1, 2, 2, 96]).astype(F32)
    cases.append(dict(name="exllamav2_q4_hd96_refused", spec="exllamav2:q4", tensors=[tensor("t", x, "F32")],
                      schemes={"t": (None, True)}, error="kvlib refuses ExLlamaV2's q4 for head_dim 96"))
    return cases


def _vllm_cases(rng) -> list[dict]:
    """vLLM 0.33.0's formats (tests/vllm_reference.py): every format on F32, F16 and BF16 caches with
    head_dim 64, 128 and 256 (outlier key channels, an all-zero token-head), scale 1 and a calibrated
    scale, values past the range, K and V set apart, layers skipped, and the refusals."""
    cases = []

    def both_roles(name, spec, fmts, dtype, shape, xs=None):
        ts = [tensor(f"layer_0_{r}", kv(rng, shape, r) if xs is None else xs[r], dtype) for r in ("key", "value")]
        cases.append(dict(name=name, spec=spec, tensors=ts, schemes=dict(zip((t["name"] for t in ts), fmts))))

    for fmt in vr.PER_TENSOR + vr.PER_HEAD:
        for dtype in ("F32", "F16", "BF16"):
            for hd in (64, 128, 256):
                both_roles(f"vllm_{fmt}_{dtype.lower()}_hd{hd}", f"vllm:{fmt}", [(f"vllm:{fmt}", 1.0)] * 2, dtype,
                           [1, 2, 2 if hd < 256 else 1, hd])
    # A calibrated per-tensor scale (amax / 448 of the keys, as a float32), K and V apart.
    for fmt in vr.PER_TENSOR:
        x = {r: kv(rng, [1, 2, 3, 128], r) * F32(20) for r in ("key", "value")}
        ks, vs = (float(F32(np.max(np.abs(x[r])) / F32(vr.FP8[fmt][1]))) for r in ("key", "value"))
        spec = f"k=vllm:{fmt}/scale{F32(ks)!r},v=vllm:{fmt}/scale{F32(vs)!r}".replace("np.float32(", "").replace(")", "")
        both_roles(f"vllm_{fmt}_calibrated", spec, [(f"vllm:{fmt}", ks), (f"vllm:{fmt}", vs)], "F32", [1, 2, 3, 128], x)
    # Past the range with scale 1 (keys beyond +-448 saturate; fp8_e5m2 holds them), subnormals, ties.
    edge = np.array([1e5, -1e5, 448, 464, 465, -480, 57344, 61440, 7e4, 3.3e38, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11,
                     2.0 ** -16, 2.0 ** -17, 1e-30, -0.0, 0.0, 1.0625, 1.1875, 17, 19, 0.3, -0.7] * 4 + [0.0] * 32, F32)
    for fmt in vr.PER_TENSOR + vr.PER_HEAD:
        x = edge.reshape(1, 1, 2, 64)
        if fmt == "int4_per_token_head":  # no range of its own; its float32 rotation of 3.3e38 overflows to NaN
            x = np.where(np.abs(x) > 1e35, np.sign(x) * F32(1e35), x).astype(F32)
        cases.append(dict(name=f"vllm_{fmt}_past_the_range", spec=f"vllm:{fmt}", tensors=[tensor("layer_0_key", x, "F32")],
                          schemes={"layer_0_key": (f"vllm:{fmt}", 1.0)}))
    # int4_per_token_head on head_dim 96 and 80: the RHT block-diagonal in blocks of 32 and 16.
    for hd in (96, 80):
        both_roles(f"vllm_int4_per_token_head_hd{hd}", "vllm:int4_per_token_head", [("vllm:int4_per_token_head", 1.0)] * 2,
                   "BF16", [1, 2, 3, hd])
    # K and V formats apart, and layers skipped (--kv-cache-dtype-skip-layers 0 is kv0=none).
    both_roles("vllm_per_role", "k=vllm:fp8_e4m3,v=vllm:int8_per_token_head", [("vllm:fp8_e4m3", 1.0), ("vllm:int8_per_token_head", 1.0)],
               "BF16", [1, 2, 3, 128])
    ts = [tensor(f"layer_{i}_{r}", kv(rng, [1, 2, 2, 64], r), "F16") for i in range(3) for r in ("key", "value")]
    cases.append(dict(name="vllm_skip_layer_0", spec="vllm:fp8_per_token_head,k0=none,v0=none", tensors=ts,
                      schemes={t["name"]: ("none", False) if t["name"][6] == "0" else ("vllm:fp8_per_token_head", 1.0) for t in ts}))
    errs = [
        ("vllm_per_head_needs_4d", "vllm:int8_per_token_head", [64], "needs a 4-D"),
        ("vllm_fp8_nan", "vllm:fp8_e4m3", [8], "NaN or Inf cannot be quantized"),
        ("vllm_per_head_inf", "vllm:fp8_per_token_head", [1, 1, 2, 64], "NaN or Inf cannot be quantized"),
        ("vllm_int4_odd_head_dim", "vllm:int4_per_token_head", [1, 2, 2, 5], "refuses head_dim 5"),
    ]
    for name, spec, shape, msg in errs:
        x = rng.standard_normal(shape).astype(F32)
        if "nan" in name or "inf" in name:
            x.reshape(-1)[3] = np.nan if "nan" in name else np.inf
        cases.append(dict(name=name, spec=spec, tensors=[tensor("t", x, "F32")], schemes={"t": (None, True)}, error=msg))
    return cases


def _block_inputs() -> list[tuple[str, np.ndarray]]:
    """Single blocks (and f16 runs) of special float32 bits for the block API."""
    rng = np.random.default_rng(7)
    bits = lambda *v: np.array(v, np.uint32).view(F32)  # noqa: E731
    nan_payload = bits(0x7FA12345, 0xFFC00000, 0x7FC00001)
    sp = rng.standard_normal(32).astype(F32)
    sp[[0, 9, 17]] = np.inf, -np.inf, np.nan
    nanfirst = rng.standard_normal(32).astype(F32)
    nanfirst[[0, 5]] = nan_payload[:2]
    nanlast = rng.standard_normal(32).astype(F32)
    nanlast[[24, 31]] = nan_payload[[0, 2]]
    ties = np.r_[F32(127), np.arange(31, dtype=F32) - 15 + F32(0.5)].astype(F32)
    out = [
        ("gaussian", rng.standard_normal(32).astype(F32) * 3),
        ("zeros", np.zeros(32, F32)),
        ("negative_zero_first", np.r_[F32(-0.0), np.zeros(31, F32)].astype(F32)),
        ("tiny_1e-16", np.tile(F32([1e-16, -3e-16, 0, 2e-16]), 8)),
        ("subnormal", (rng.standard_normal(32) * 1e-40).astype(F32)),
        ("smallest_subnormal", np.r_[bits(1), np.zeros(31, F32)].astype(F32)),
        ("huge", (rng.standard_normal(32) * 1e37).astype(F32)),
        ("flt_max", np.r_[F32(3.4028235e38), F32(-3.4028235e38), np.ones(30, F32)].astype(F32)),
        ("inf_nan", sp),
        ("nan_first_lanes", nanfirst),
        ("nan_last_lanes", nanlast),
        ("all_nan", np.full(32, np.nan, F32)),
        ("q8_0_ties", ties),
        ("constant_negative", np.full(32, -2.5, F32)),
        ("linspace", np.linspace(-1, 1, 32, dtype=F32)),
        ("f16_edges", np.r_[F32([65504, 65519.99, 65520, -65520, 6e-8, 2.9e-8, 3e-8, 1e-45]), np.zeros(24, F32)].astype(F32)),
    ]
    return out


def _blocks() -> list[dict]:
    out = []
    for name, x in _block_inputs():
        for fmt in er.FORMATS + ("q8_0_ref",):
            with np.errstate(all="ignore"):
                if fmt == "q8_0_ref":
                    raw = er.quantize_q8_0_ref(x.reshape(-1, 32)).tobytes()
                    y = er.dequantize("q8_0", raw)
                else:
                    raw = er.QUANTIZE[fmt](x if fmt == "f16" else x.reshape(-1, 32)).tobytes()
                    y = er.dequantize(fmt, raw)
            out.append(dict(name=f"{fmt}_{name}", format=fmt, input_hex=x.astype("<f4").tobytes().hex(), codes_hex=raw.hex(),
                            restored_hex=y.astype("<f4").tobytes().hex()))
    return out


def _rotations() -> list[dict]:
    rng = np.random.default_rng(11)
    out = []
    for n in (64, 128, 256, 512):
        x = (rng.standard_normal(2 * n) * 3).astype(F32)
        x[:3] = (1e-42, 3e38, -3e38)
        out.append(dict(n=n, input_hex=x.astype("<f4").tobytes().hex(), output_hex=er.hadamard_rows(x, n).astype("<f4").tobytes().hex()))
    return out


def build() -> dict:
    return {"format": "kvq", "engine": "llama.cpp",
            "engine_version": "llama.cpp 0c1e57098 (ggml 0.25.3) via llama-cpp-python 0.3.36", "vllm_version": vr.VERSION, "sglang_version": sr.VERSION,
            "cases": [run_case(c) for c in _cases()], "blocks": _blocks(), "rotations": _rotations()}


def render() -> str:
    return json.dumps(build(), indent=1) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")

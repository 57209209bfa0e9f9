"""Generate tests/vectors/lmcache_vectors.json: kv-compress's LMCache 0.5.6 formats (lmcache:fp8,
lmcache:kivi, lmcache:cachegen) from the NumPy reference in tests/lmcache_reference.py, which
tests/test_lmcache_formats.py checks against LMCache's own code (tests/lmcache_harness.py).

`python tests/make_lmcache_vectors.py` rewrites it; tests/test_lmcache_formats.py checks the committed
file equals this output and that the CLI reproduces it bit for bit; go test checks the Go package
against the same file (lmcache_test.go).

Cases: every format on F32, F16 and BF16 caches with head_dim 64, 128 and 256 (keys with outlier
channels, values past +-448, an all-zero token-head and an all-zero token); CacheGen's bins over 12
layers (32 and 16); two batch rows of 260 tokens (a full chunk and a partial one); the quantizer's
edges (ties at the +MAX offset, a maximum whose factor overflows, values near FLT_MAX); the refusals.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import lmcache_reference as lr
from kvq_reference import decode, encode, to_bf16_bits

OUT = Path(__file__).parent / "vectors" / "lmcache_vectors.json"
F32 = np.float32


def kv(rng, shape, role: str) -> np.ndarray:
    """Cache-like values (as tests/make_engine_vectors.py makes them): Gaussian, keys with two large
    channels and one larger still; an all-zero token-head (head 1, token 0)."""
    x = rng.standard_normal(shape).astype(F32)
    if role == "key":
        x[..., :2] *= F32(8)
        x[..., 5] *= F32(40)
    x[:, 1, 0, :] = 0
    return x


def tensor(name: str, x: np.ndarray, dtype: str) -> dict:
    return dict(name=name, dtype=dtype, shape=list(x.shape), raw=encode(np.asarray(x, F32).reshape(-1), dtype))


def restored_bytes(y: np.ndarray, dtype: str) -> bytes:
    """A reconstruction (finite here) written in the source dtype, rounded to nearest even."""
    y = np.asarray(y, F32)
    if dtype == "F32":
        return y.astype("<f4").tobytes()
    if dtype == "F16":
        return y.astype("<f2").tobytes()
    return to_bf16_bits(y).astype("<u2").tobytes()


def run_case(c: dict) -> dict:
    """Every tensor of a case as kv-compress stores it: its bytes, reconstruction, saturated count and
    (cachegen) bins, the layer count being the cache's."""
    entry = dict(name=c["name"], spec=c["spec"], tensors=[])
    layers = 1 + max((int(t["name"].split("_")[1]) for t in c["tensors"] if t["name"].startswith("layer_")), default=-1)
    for t in c["tensors"]:
        out = dict(name=t["name"], dtype=t["dtype"], shape=t["shape"], input_hex=t["raw"].hex())
        entry["tensors"].append(out)
        if "error" in c:
            continue
        x = decode(t["raw"], t["dtype"])
        fmt = c["spec"].split(":")[1]
        if fmt == "fp8":
            raw, y, sat = lr.fp8(x)
            out.update(parts={".codes": raw.hex()}, restored_hex=restored_bytes(y, t["dtype"]).hex(), saturated=sat)
        elif fmt == "kivi":
            out.update(parts={".codes": t["raw"].hex()}, restored_hex=t["raw"].hex(), saturated=0)
        else:
            _, layer, role = t["name"].split("_")
            nb = lr.bins(int(layer), role, layers)
            raw, y = lr.cachegen(x.reshape(t["shape"]), t["dtype"], nb)
            out.update(parts={".codes": raw.hex()}, restored_hex=restored_bytes(y.reshape(-1), t["dtype"]).hex(), saturated=0, bins=nb)
    if "error" in c:
        entry["error"] = c["error"]
    return entry


def _cases() -> list[dict]:
    rng = np.random.default_rng(20261125)
    cases = []

    def cache(shape, layers=1, big=True, zero_token=None):
        xs = []
        for layer in range(layers):
            for r in ("key", "value"):
                x = kv(rng, shape, r)  # outlier key channels, head 1 token 0 all zero
                if big and r == "key":
                    x[..., 7] *= F32(600)  # past +-448
                if zero_token is not None:
                    x[:, :, zero_token, :] = 0  # every head: the token's maximum is 0
                xs.append((f"layer_{layer}_{r}", x))
        return xs

    for fmt in lr.FORMATS:
        for dtype in ("F32", "F16", "BF16"):
            for hd in (64, 128, 256):
                xs = cache([1, 2, 3 if hd < 256 else 2, hd], zero_token=1)
                cases.append(dict(name=f"lmcache_{fmt}_{dtype.lower()}_hd{hd}", spec=f"lmcache:{fmt}",
                                  tensors=[tensor(n, x, dtype) for n, x in xs]))
    # CacheGen's bins: 12 layers, keys 32 in layers 0-9, values in layers 0-1, 16 after (head_dim 32: small).
    cases.append(dict(name="lmcache_cachegen_bins_12_layers", spec="lmcache:cachegen",
                      tensors=[tensor(n, x, "BF16") for n, x in cache([1, 2, 1, 32], layers=12)]))
    # Two batch rows of 260 tokens: per row a chunk of 256 and one of 4 (save_unfull_chunk).
    x = rng.standard_normal([2, 1, 260, 64]).astype(F32)
    x[..., 3] *= F32(30)
    cases.append(dict(name="lmcache_cachegen_two_chunks", spec="lmcache:cachegen", tensors=[tensor("layer_0_key", x, "F16")]))
    # The quantizer's edges: ties at the +MAX offset (maximum 30: factor 1/2), a maximum whose factor
    # overflows (symbol 0 throughout), values near FLT_MAX, and the all-zero token (-0 back).
    e = np.zeros([1, 2, 5, 64], F32)
    e[0, :, 0] = 0
    e[0, 0, 1, :8] = [30, 1, 3, -1, -3, 5, -5, 29]  # 15.5 -> 16, 16.5 -> 16, 14.5 -> 14, ...
    e[0, 1, 1, :4] = [0.5, 1.5, -0.5, 2.5]
    e[0, :, 2] = rng.standard_normal([2, 64]).astype(F32) * F32(1e-39)  # 15 / max overflows float32
    e[0, 0, 3, :3] = [3e38, -3.3e38, 1e38]
    e[0, 1, 3] = rng.standard_normal(64).astype(F32) * F32(1e37)
    e[0, :, 4] = np.linspace(-500, 500, 128, dtype=F32).reshape(2, 64)
    for dtype in ("F32", "BF16"):
        cases.append(dict(name=f"lmcache_cachegen_edges_{dtype.lower()}", spec="lmcache:cachegen",
                          tensors=[tensor("layer_0_key", e, dtype), tensor("layer_0_value", -e, dtype)]))
    edge = np.array([1e5, -1e5, 448, 464, 465, -470, 480, 500, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -16, 1e-30,
                     -0.0, 0.0, 1.0625, 1.1875, 17, 19, 0.3, -0.7, 3.3e38] * 4 + [0.0] * 40, F32)
    cases.append(dict(name="lmcache_fp8_past_the_range", spec="lmcache:fp8", tensors=[tensor("layer_0_key", edge.reshape(1, 1, 2, 64), "F32")]))
    # Refusals.
    errs = [
        ("lmcache_cachegen_nan", "lmcache:cachegen", "layer_0_key", [1, 1, 2, 64], "NaN or Inf cannot be quantized"),
        ("lmcache_cachegen_unnamed", "lmcache:cachegen", "t", [1, 1, 2, 64], "needs tensors named layer_{i}_key and layer_{i}_value"),
        ("lmcache_cachegen_needs_4d", "lmcache:cachegen", "layer_0_key", [2, 64], "needs a 4-D"),
        ("lmcache_fp8_inf", "lmcache:fp8", "layer_0_key", [1, 1, 2, 64], "NaN or Inf cannot be quantized"),
    ]
    for name, spec, tname, shape, msg in errs:
        x = rng.standard_normal(shape).astype(F32)
        if "nan" in name or "inf" in name:
            x.reshape(-1)[70] = np.nan if "nan" in name else np.inf
        cases.append(dict(name=name, spec=spec, tensors=[tensor(tname, x, "F32")], error=msg))
    return cases


def build() -> dict:
    return {"format": "kvq", "engine": "lmcache", "engine_version": lr.VERSION, "cases": [run_case(c) for c in _cases()]}


def render() -> str:
    return json.dumps(build(), indent=1) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")

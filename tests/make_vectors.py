"""Generate tests/vectors/kvq_vectors.json from the NumPy reference.

Run `python tests/make_vectors.py` to rewrite it; tests/test_vectors.py checks
the committed file still equals this output, and go test checks the Go codec
against the same file, so both sides agree to the bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kvq_reference import ScaleOverflow, decode, encode, pack, quantize

OUT = Path(__file__).parent / "vectors" / "kvq_vectors.json"


def _cases() -> list[dict]:
    rng = np.random.default_rng(20261122)
    f32 = np.float32
    ties = np.array([0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, -3.5, 7.0, -7.0, 4.5, -5.5], dtype=f32)
    quarter = np.array([3.5, 0.25, 0.75, -0.25, -0.75, 1.25, -1.25, 2.75], dtype=f32)  # scale 0.5
    return [
        dict(name="ties_half_to_even", bits=4, group_size=12, dtype="F32", x=ties, shape=[12]),
        dict(name="ties_scale_half", bits=4, group_size=8, dtype="F32", x=quarter, shape=[8]),
        dict(name="zero_group", bits=4, group_size=4, dtype="F32", x=np.array([0, 0, 0, 0, 1, -2, 3, -4], f32), shape=[2, 4]),
        dict(name="short_last_group", bits=4, group_size=64, dtype="F32", x=(rng.standard_normal(100) * 2).astype(f32), shape=[1, 1, 100]),
        dict(name="tiny_subnormal_scale_clamps", bits=4, group_size=8,
             dtype="F32", x=np.array([1e-6, -1e-6, 5e-7, -3e-7, 1e-7, 0, -1e-6, 2e-7], f32), shape=[8]),
        dict(name="kv_layout_g64", bits=4, group_size=64, dtype="F32",
             x=(rng.standard_normal(2 * 3 * 5 * 64) * np.repeat(rng.uniform(0.1, 8, 64)[None], 30, 0).reshape(-1)).astype(f32),
             shape=[2, 3, 5, 64]),
        dict(name="g32", bits=4, group_size=32, dtype="F32", x=(rng.standard_normal(200) * 0.3).astype(f32), shape=[200]),
        dict(name="g128", bits=4, group_size=128, dtype="F32", x=rng.laplace(size=300).astype(f32), shape=[3, 100]),
        dict(name="f16_input", bits=4, group_size=64, dtype="F16", x=(rng.standard_normal(130) * 3).astype(np.float16).astype(f32), shape=[130]),
        dict(name="bf16_input", bits=4, group_size=64, dtype="BF16", x=decode(encode(rng.standard_normal(130).astype(f32) * 5, "BF16"), "BF16"), shape=[130]),
        dict(name="bits2", bits=2, group_size=6, dtype="F32", x=rng.standard_normal(23).astype(f32), shape=[23]),
        dict(name="bits3", bits=3, group_size=10, dtype="F32", x=rng.standard_normal(37).astype(f32), shape=[37]),
        dict(name="bits5", bits=5, group_size=8, dtype="F32", x=rng.standard_normal(29).astype(f32), shape=[29]),
        dict(name="bits8", bits=8, group_size=16, dtype="F32", x=rng.standard_normal(40).astype(f32), shape=[40]),
        dict(name="scale_overflow", bits=4, group_size=4, dtype="F32", x=np.array([1, 2, 1e6, 3], f32), shape=[4]),
    ]


def build() -> dict:
    cases = []
    for c in _cases():
        raw = encode(c["x"], c["dtype"])
        x = decode(raw, c["dtype"])
        entry = dict(name=c["name"], bits=c["bits"], group_size=c["group_size"], dtype=c["dtype"],
                     shape=c["shape"], input_hex=raw.hex())
        try:
            codes, scales, recon = quantize(x, c["bits"], c["group_size"])
        except ScaleOverflow:
            entry["error"] = "overflows FP16"
            cases.append(entry)
            continue
        entry.update(
            codes=codes.tolist(),
            scales_f16=scales.tolist(),
            packed_hex=pack(codes, c["bits"]).hex(),
            restored_hex=encode(recon, c["dtype"]),
        )
        entry["restored_hex"] = entry["restored_hex"].hex()
        cases.append(entry)
    return {"format": "kvq", "format_version": 1, "cases": cases}


def render() -> str:
    return json.dumps(build(), indent=1) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")

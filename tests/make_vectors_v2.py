"""Generate tests/vectors/kvq_v2_vectors.json: every kvq v2 scheme, from the
NumPy reference (kvq_reference.compress_tensor; ggml blocks from the gguf
package's own quantizer, the oracle of llama.cpp's cache types).

`python tests/make_vectors_v2.py` rewrites it; tests/test_vectors.py checks the
committed file equals this output and that the CLI reproduces it bit for bit;
go test checks the Go package against the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kvq_reference import ScaleOverflow, compress_tensor, decode, encode

OUT = Path(__file__).parent / "vectors" / "kvq_v2_vectors.json"
F32 = np.float32


def scheme(method: str, bits: int = 4, group: int = 64, axis: str = "token", rotate: bool = False,
           outliers: float = 0.0, residual: int = 0, sparsity: float = 0.0) -> dict:
    if method.startswith("q"):
        bits, group = {"q4_0": 4, "q4_1": 4, "q5_0": 5, "q5_1": 5, "q8_0": 8}[method], 32
    return dict(method=method, bits=bits, group=group, axis=axis, rotate=rotate, outliers=outliers,
                residual=residual, sparsity=sparsity)


def spec_of(sc: dict) -> str:
    """The canonical spec string (Go's Scheme.String)."""
    s = sc["method"] if sc["method"].startswith("q") else f"{sc['method']}{sc['bits']}/g{sc['group']}"
    if sc["axis"] == "channel":
        s += "/channel"
    if sc["rotate"]:
        s += "/rot"
    if sc["outliers"]:
        s += f"/out{sc['outliers']:g}"
    if sc["residual"]:
        s += f"/res{sc['residual']}"
    if sc["sparsity"]:
        s += f"/sp{sc['sparsity']:g}"
    return s


def kv(rng, shape, outlier_channels=True) -> np.ndarray:
    """Cache-like data: Gaussian, with a few large channels as post-RoPE keys have."""
    x = rng.standard_normal(shape).astype(F32)
    if outlier_channels:
        x[..., :2] *= F32(8)
    return x


def _cases() -> list[dict]:
    rng = np.random.default_rng(20261123)
    t = lambda name, x, shape, dtype="F32": dict(name=name, x=np.asarray(x, F32).reshape(-1), shape=shape, dtype=dtype)  # noqa: E731
    ties = np.array([0, 1, 2, 3, 4, 5, 6, 7.5, 0.25, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5], F32)  # asym4: s = 0.5
    cases = [
        # asym
        dict(name="asym4_ties", spec=scheme("asym", 4, 16), tensors=[t("t", ties, [16])]),
        dict(name="asym4_zero_and_constant_groups", spec=scheme("asym", 4, 4),
             tensors=[t("t", [0, 0, 0, 0, -3, -3, -3, -3, 1, 2, 3, 4], [12])]),
        dict(name="asym_bits2_short_last", spec=scheme("asym", 2, 6), tensors=[t("t", rng.standard_normal(23), [23])]),
        dict(name="asym_bits3", spec=scheme("asym", 3, 10), tensors=[t("t", rng.standard_normal(37), [37])]),
        dict(name="asym_bits8", spec=scheme("asym", 8, 16), tensors=[t("t", rng.standard_normal(40) * 4, [40])]),
        dict(name="asym4_f16", spec=scheme("asym", 4, 64),
             tensors=[t("t", (rng.standard_normal(130) * 3).astype(np.float16), [130], "F16")]),
        dict(name="asym4_bf16", spec=scheme("asym", 4, 64),
             tensors=[t("t", decode(encode(rng.standard_normal(130).astype(F32) * 5, "BF16"), "BF16"), [130], "BF16")]),
        dict(name="asym_overflow", spec=scheme("asym", 4, 4), tensors=[t("t", [-1e6, 0, 1, 2], [4])], error="overflows FP16"),
        # channel axis, sym and asym, short last groups along tokens
        dict(name="sym4_channel_short", spec=scheme("sym", 4, 4, "channel"), tensors=[t("t", kv(rng, [1, 2, 10, 8]), [1, 2, 10, 8])]),
        dict(name="asym4_channel_g64", spec=scheme("asym", 4, 64, "channel"), tensors=[t("t", kv(rng, [1, 3, 70, 16]), [1, 3, 70, 16])]),
        dict(name="channel_needs_4d", spec=scheme("asym", 4, 4, "channel"), tensors=[t("t", rng.standard_normal(24), [4, 6])],
             error="needs a 4-D"),
        # rotation
        dict(name="rot_sym4", spec=scheme("sym", 4, 64, rotate=True), tensors=[t("t", kv(rng, [1, 2, 9, 64]), [1, 2, 9, 64])]),
        dict(name="rot_asym3_g16", spec=scheme("asym", 3, 16, rotate=True), tensors=[t("t", kv(rng, [2, 1, 5, 32]), [2, 1, 5, 32])]),
        dict(name="rot_f16", spec=scheme("sym", 4, 32, rotate=True),
             tensors=[t("t", kv(rng, [1, 1, 6, 16]).astype(np.float16), [1, 1, 6, 16], "F16")]),
        dict(name="rot_needs_pow2", spec=scheme("sym", 4, 64, rotate=True), tensors=[t("t", rng.standard_normal(48), [1, 1, 1, 48])],
             error="power-of-two head_dim"),
        # outliers (ties: equal magnitudes, lower index first)
        dict(name="outliers_ties", spec=scheme("sym", 4, 8, outliers=0.25),
             tensors=[t("t", [1, -9, 2, 9, 3, -9, 4, 0.5, 9, 1, 1, 1, 2, 2, 2, 2], [16])]),
        dict(name="outliers_kv", spec=scheme("asym", 4, 64, outliers=0.01), tensors=[t("t", kv(rng, [1, 2, 40, 64]), [1, 2, 40, 64])]),
        # residual tokens
        dict(name="residual_token", spec=scheme("sym", 4, 64, residual=3), tensors=[t("t", kv(rng, [1, 2, 11, 64]), [1, 2, 11, 64])]),
        dict(name="residual_channel_bf16", spec=scheme("asym", 2, 4, "channel", residual=2),
             tensors=[t("t", decode(encode(kv(rng, [1, 2, 9, 8]).reshape(-1), "BF16"), "BF16"), [1, 2, 9, 8], "BF16")]),
        dict(name="residual_covers_all", spec=scheme("sym", 4, 64, residual=20), tensors=[t("t", kv(rng, [1, 1, 4, 8]), [1, 1, 4, 8])]),
        dict(name="residual_outliers_rot", spec=scheme("sym", 4, 32, rotate=True, outliers=0.02, residual=2),
             tensors=[t("t", kv(rng, [1, 2, 12, 32]), [1, 2, 12, 32])]),
        dict(name="sparsity_residual", spec=scheme("sym", 4, 64, residual=1, sparsity=0.3),
             tensors=[t("t", kv(rng, [1, 1, 5, 64]), [1, 1, 5, 64])]),
        # F16 at its limits: the reconstruction saturates, never Inf
        dict(name="f16_max_saturates", spec=scheme("sym", 4, 8),
             tensors=[t("t", [65504, -65504, 65504, 1000, -65504, 0, 7, 65504], [8], "F16")]),
        dict(name="f16_max_asym3", spec=scheme("asym", 3, 8),
             tensors=[t("t", [65504, -65504, 65504, 1000, -65504, 0, 7, 65504], [8], "F16")]),
    ]
    # ggml block types: gguf.quants makes the bytes.
    for m in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0"):
        x = kv(rng, [1, 2, 3, 64])
        x[0, 0, 0, :32] = 0  # a zero block
        x[0, 0, 1, :32] = np.linspace(-1, 1, 32, dtype=F32)  # exact halves
        x[0, 0, 2, :32] = -2.5  # a constant block (max |x| negative)
        cases.append(dict(name=f"{m}_blocks", spec=scheme(m), tensors=[t("t", x, [1, 2, 3, 64])]))
    cases.append(dict(name="q8_0_f16", spec=scheme("q8_0"),
                      tensors=[t("t", (rng.standard_normal(64) * 2).astype(np.float16), [64], "F16")]))
    cases.append(dict(name="q4_0_not_multiple_of_32", spec=scheme("q4_0"), tensors=[t("t", rng.standard_normal(40), [40])],
                      error="multiple of 32"))
    # per role: keys and values with different schemes
    cases.append(dict(name="per_role_kivi_q8", spec={"key": scheme("asym", 4, 8, "channel"), "value": scheme("q8_0")},
                      tensors=[t("layer_0_key", kv(rng, [1, 2, 12, 32]), [1, 2, 12, 32]),
                               t("layer_0_value", kv(rng, [1, 2, 12, 32], False), [1, 2, 12, 32])]))
    # full-range symmetric: the signed extreme takes code -2^(b-1); ties at half steps
    cases += [
        dict(name="symf3_negative_extreme", spec=scheme("symf", 3, 8),
             tensors=[t("t", [-4, 1, 2, 3, 0.5, -1.5, 4, 2.5, 3.5, -3.5, 0, 0, 0, 0, 0, 0.25], [16])]),
        dict(name="symf4_positive_extreme_ties", spec=scheme("symf", 4, 16), tensors=[t("t", ties * np.tile(np.array([1, -1], F32), 8), [16])]),
        dict(name="symf_bits2_short_last", spec=scheme("symf", 2, 6), tensors=[t("t", rng.standard_normal(23), [23])]),
        dict(name="symf8", spec=scheme("symf", 8, 16), tensors=[t("t", rng.standard_normal(40) * 4, [40])]),
        dict(name="symf3_rot_kv", spec=scheme("symf", 3, 64, rotate=True), tensors=[t("t", kv(rng, [1, 2, 9, 64]), [1, 2, 9, 64])]),
        dict(name="symf4_f16_zero_group", spec=scheme("symf", 4, 8),
             tensors=[t("t", np.r_[np.zeros(8), rng.standard_normal(8) * 3].astype(np.float16), [16], "F16")]),
        dict(name="symf_overflow", spec=scheme("symf", 2, 4), tensors=[t("t", [-1e6, 0, 1, 2], [4])], error="overflows FP16"),
    ]
    # Lloyd-Max codebooks after rotation, and the scale search
    tiny = (rng.standard_normal(16) * 1e-9).astype(F32)  # some candidate scales underflow FP16
    cases += [
        dict(name="lm2_rot_kv", spec=scheme("lm", 2, 64, rotate=True), tensors=[t("t", kv(rng, [1, 2, 8, 64]), [1, 2, 8, 64])]),
        dict(name="lm3_rot_kv", spec=scheme("lm", 3, 64, rotate=True), tensors=[t("t", kv(rng, [1, 3, 9, 64]), [1, 3, 9, 64])]),
        dict(name="lm4_rot_kv", spec=scheme("lm", 4, 64, rotate=True), tensors=[t("t", kv(rng, [2, 1, 7, 64]), [2, 1, 7, 64])]),
        dict(name="lm3_short_last_g20", spec=scheme("lm", 3, 20), tensors=[t("t", rng.standard_normal(53), [53])]),
        dict(name="lm3_channel_residual", spec=scheme("lm", 3, 8, "channel", residual=2),
             tensors=[t("t", kv(rng, [1, 2, 13, 8]), [1, 2, 13, 8])]),
        dict(name="lm3_zero_and_tiny_groups", spec=scheme("lm", 3, 16),
             tensors=[t("t", np.r_[np.zeros(16), tiny, np.linspace(-1, 1, 16)], [48])]),
        dict(name="lm4_f16", spec=scheme("lm", 4, 32, rotate=True),
             tensors=[t("t", kv(rng, [1, 1, 6, 32]).astype(np.float16), [1, 1, 6, 32], "F16")]),
        dict(name="lm2_bf16", spec=scheme("lm", 2, 64),
             tensors=[t("t", decode(encode(rng.standard_normal(130).astype(F32) * 5, "BF16"), "BF16"), [130], "BF16")]),
        dict(name="lm_overflow", spec=scheme("lm", 3, 4), tensors=[t("t", [-1e6, 0, 1, 2], [4])], error="overflows FP16"),
    ]
    # per layer: defaults with overrides (keys of layer 0, values of layer 1)
    layered = [t(f"layer_{i}_{r}", kv(rng, [1, 2, 5, 32], r == "key"), [1, 2, 5, 32]) for i in range(2) for r in ("key", "value")]
    cases.append(dict(name="per_layer_overrides", text="lm3/g64/rot,k0=symf4/g32,v1=q8_0",
                      spec={"key": scheme("lm", 3, 64, rotate=True), "value": scheme("lm", 3, 64, rotate=True)},
                      layers={"layer_0_key": scheme("symf", 4, 32), "layer_1_value": scheme("q8_0")}, tensors=layered))
    return cases


def build() -> dict:
    out = []
    for c in _cases():
        spec = c["spec"] if "key" in c["spec"] else {"key": c["spec"], "value": c["spec"]}
        text = spec_of(spec["key"]) if spec["key"] == spec["value"] else f"k={spec_of(spec['key'])},v={spec_of(spec['value'])}"
        text = c.get("text", text)
        entry = dict(name=c["name"], spec=text, tensors=[])
        try:
            for tn in c["tensors"]:
                raw = encode(tn["x"], tn["dtype"])
                sc = spec["key"] if tn["name"].endswith("_key") else spec["value"]
                sc = c.get("layers", {}).get(tn["name"], sc)
                parts, restored, n_out = compress_tensor(raw, tn["dtype"], tn["shape"], sc)
                entry["tensors"].append(dict(name=tn["name"], dtype=tn["dtype"], shape=tn["shape"], input_hex=raw.hex(),
                                             outliers=n_out, parts={k: v.hex() for k, v in parts.items()},
                                             restored_hex=restored.hex()))
        except (ScaleOverflow, ValueError) as e:
            assert "error" in c, f"{c['name']}: {e}"
            entry["error"] = c["error"]
            entry["tensors"] = [dict(name=tn["name"], dtype=tn["dtype"], shape=tn["shape"],
                                     input_hex=encode(tn["x"], tn["dtype"]).hex()) for tn in c["tensors"]]
        else:
            assert "error" not in c, f"{c['name']}: expected an error"
        out.append(entry)
    return {"format": "kvq", "format_version": 2, "cases": out}


def render() -> str:
    return json.dumps(build(), indent=1) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")

"""vLLM 0.33.0's KV-cache formats (kv-compress's vllm:* schemes): the NumPy reference
(tests/vllm_reference.py, written from the engine's source) pins the Go codec through the shared
vectors (tests/vectors/engine_vectors.json, checked by tests/test_engine_formats.py and go test);
here, the reference's float8 casts are torch's own, the vectors cover what the issue asks, and
the CLI lists the formats with their release, flags and evidence."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch

import make_engine_vectors
import vllm_reference as vr

VECTORS = json.loads(make_engine_vectors.OUT.read_text())
VLLM = [c for c in VECTORS["cases"] if c["name"].startswith("vllm_")]
F32 = np.float32


def _float32_sample() -> np.ndarray:
    """Every bfloat16 bit pattern (as float32), random float32 bits, and the formats' edges and ties."""
    rng = np.random.default_rng(3)
    bf16 = (np.arange(1 << 16, dtype=np.uint32) << 16).view(F32)
    rand = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(F32)
    edges = F32([448, 464, 464.00003, 480, 57344, 61440, 61439.996, 2.0 ** -9, 2.0 ** -10, 2.0 ** -16, 2.0 ** -17,
                 3 * 2.0 ** -17, 1.0625, 1.1875, -0.0, np.inf, -np.inf, 3.4028235e38])
    x = np.concatenate([bf16, rand, edges, -edges])
    return x[~np.isnan(x)]


@pytest.mark.parametrize("fmt, dtype, top", [("fp8_e4m3", torch.float8_e4m3fn, 448.0), ("fp8_e5m2", torch.float8_e5m2, 57344.0)])
def test_reference_float8_casts_are_torchs(fmt, dtype, top):
    """The reference's satfinite conversion is torch's float8 cast after the clamp (what vLLM's own
    QuantFP8.forward_native does: clamp to the range, then .to(fp8)), on every bfloat16 value and
    random float32 bits; its decode is torch's."""
    x = _float32_sample()
    ours = vr.fp8_codes(x, fmt)
    theirs = torch.from_numpy(np.clip(x, -top, top)).to(dtype).view(torch.uint8).numpy()
    assert np.array_equal(ours, theirs)
    codes = np.arange(256, dtype=np.uint8)
    back = torch.from_numpy(codes).view(dtype).to(torch.float32).numpy()
    assert np.array_equal(vr.fp8_values(codes, fmt), back, equal_nan=True)


def test_per_head_reference_is_torchs_arithmetic():
    """The per-token-head reference, step for step in torch float32 (the Triton kernel's order)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, 128)) * 3).astype(F32)
    x[1] = 0  # an all-zero head: scale 1e-6, codes 0
    for fmt, qmax in (("int8_per_token_head", 127.0), ("fp8_per_token_head", 448.0)):
        raw, y = vr.quantize_per_head(x, fmt)
        t = torch.from_numpy(x)
        scale = torch.clamp(t.abs().amax(dim=1) / qmax, min=1e-6)
        v = t * (1.0 / scale)[:, None]
        if fmt.startswith("int8"):
            v = torch.where(v >= 0, v + 0.5, v - 0.5)
            codes = torch.clamp(v, -128, 127).to(torch.int8)  # truncation toward zero
            vals = codes.to(torch.float32)
            code_bytes = codes.view(torch.uint8)
        else:
            codes = torch.clamp(v, -448, 448).to(torch.float8_e4m3fn)
            vals, code_bytes = codes.to(torch.float32), codes.view(torch.uint8)
        blocks = np.frombuffer(raw, np.uint8).reshape(6, 132)
        assert np.array_equal(blocks[:, :128], code_bytes.numpy())
        assert np.array_equal(blocks[:, 128:].copy().view("<f4")[:, 0], scale.numpy())
        assert np.array_equal(y, (vals * scale[:, None]).numpy())
        assert np.all(blocks[1, :128] == 0) and blocks[1, 128:].copy().view("<f4")[0] == F32(1e-6)


def test_vllm_vectors_cover_the_issue():
    names = {c["name"] for c in VLLM}
    for fmt in vr.FORMATS:
        for dtype in ("f32", "f16", "bf16"):
            for hd in (64, 128, 256):
                assert f"vllm_{fmt}_{dtype}_hd{hd}" in names
        assert f"vllm_{fmt}_past_the_range" in names
    for fmt in vr.STATIC_SCALE:
        assert f"vllm_{fmt}_calibrated" in names
    sat = {c["name"]: sum(t.get("saturated", 0) for t in c["tensors"]) for c in VLLM if "error" not in c}
    assert sat["vllm_fp8_e4m3_past_the_range"] > 0 and sat["vllm_fp8_e5m2_past_the_range"] > 0
    assert sat["vllm_fp8_e4m3_calibrated"] == 0  # a calibrated scale (amax / 448) saturates nothing
    for fmt in vr.NVFP4:  # block scales past 448 clamp; amax / 2688 clamps nothing
        assert sat[f"vllm_{fmt}_past_the_range"] > 0 and sat[f"vllm_{fmt}_calibrated"] == 0
        assert f"vllm_{fmt}_f16_scale" in names and any(n.startswith(f"vllm_{fmt}_hd") and n.endswith("_refused") for n in names)
    assert sum("error" in c for c in VLLM) >= 3 and VECTORS["vllm_version"] == vr.VERSION


def test_scale_one_saturates_keys_past_448_and_calibrated_does_not(cli, tmp_path):
    """What scale=1 costs: the CLI's report counts the keys it clamps to 448, per tensor."""
    case = next(c for c in VLLM if c["name"] == "vllm_fp8_e4m3_past_the_range")
    x = np.frombuffer(bytes.fromhex(case["tensors"][0]["input_hex"]), "<f4")
    src = tmp_path / "in.safetensors"
    make_engine_vectors_tensors = [dict(case["tensors"][0])]
    from vector_files import write_inputs

    write_inputs(src, make_engine_vectors_tensors)
    for spec, want in (("vllm:fp8_e4m3", int(np.sum(np.abs(x) > 448))), (f"vllm:fp8_e4m3/scale{float(np.max(np.abs(x[np.isfinite(x)])) / 448)}", 0)):
        proc = subprocess.run([cli, "metrics", "-input", str(src), "-scheme", spec], capture_output=True, text=True)
        assert proc.returncode in (0, 1), proc.stderr
        assert json.loads(proc.stdout)["tensors"][0].get("saturated", 0) == want > 0 or want == 0


def test_schemes_lists_vllm(cli):
    rows = json.loads(subprocess.run([cli, "schemes", "-engine", "vllm"], capture_output=True, text=True, check=True).stdout)
    assert [r["format"] for r in rows] == list(vr.FORMATS)
    for r in rows:
        # TurboQuant's MSE presets: vLLM's own store and read ran on the vectors (test_turboquant_* below);
        # int8 and int4 per token-head: vLLM's own writers (test_per_token_head_* below); fp8_per_token_head's
        # codes take torch's e4m3 cast there, not the interpreter's: read, as turboquant_k8v4's keys
        executed = (r["format"] in vr.TURBOQUANT_PRESETS and r["format"] != "turboquant_k8v4") or r["format"] in (
            "int8_per_token_head", "int4_per_token_head")
        assert r["engine_version"] == vr.VERSION and r["flags"] == f"--kv-cache-dtype {r['format']}"
        assert r["evidence"] == ("executed" if executed else "read"), r
        assert r["source"] and "Triton" in r["evidence_detail"]
    for preset, (k, v) in vr.TURBOQUANT.items():  # a K format and a V format, named as the preset
        row = rows[vr.FORMATS.index(preset)]
        assert row["name"] == f"vllm:{preset}" and row["scheme"] == vr.tq_spec(preset), row
        assert row["key_scheme"]["method"] == f"vllm:{k}" and row["value_scheme"]["method"] == f"vllm:{v}"
    bits = {r["format"]: r["key_bits_per_element"] for r in rows}
    assert bits["fp8_e4m3"] == 8 and bits["int8_per_token_head"] == 8.25  # 8 + a float32 scale per 128
    assert bits["nvfp4"] == bits["nvfp4_4over6"] == 4.5  # 4 + an 8-bit scale per 16
    # at head_dim 128 (config.py:128-175): K 128 FP8 bytes, or 64 / 48 code bytes + an fp16 norm;
    # V 64 / 48 code bytes + fp16 scale and zero: 196, 134, 118 and 102 bytes per token and head
    vbits = {r["format"]: r["value_bits_per_element"] for r in rows}
    slot = {p: (bits[p] + vbits[p]) * 128 / 8 for p in vr.TURBOQUANT_PRESETS}
    assert slot == {"turboquant_k8v4": 196, "turboquant_4bit_nc": 134, "turboquant_k3v4_nc": 118, "turboquant_3bit_nc": 102}
    tops = {r["format"]: r.get("scale_max") for r in rows}
    assert tops["nvfp4"] == tops["nvfp4_4over6"] == 6 * 448 and tops["fp8_e4m3"] == 448
    every = json.loads(subprocess.run([cli, "schemes", "-engine", "all"], capture_output=True, text=True, check=True).stdout)
    assert [r["engine"] for r in every].count("vllm") == len(vr.FORMATS)


def test_int4_rotation_is_vllms_own_code():
    """int4_per_token_head's randomised Hadamard is vLLM's own Python (tests/third_party, verbatim from
    the 0.33.0 wheel: the pure-torch path it runs without CUDA): on every int4 vector case its
    rotation, rounded to the cache's dtype, is the reference's, so are its signs, and its inverse of
    the stored values (divided by the block, as attention does) is what kv-compress restores."""
    import hashlib
    import importlib.util
    from pathlib import Path

    import torch

    from kvq_reference import decode
    from test_engine_formats import CASES

    path = Path(__file__).parent / "third_party" / "vllm_int4_rht.py"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == "9883ea18ef7016e44d2fba770ab4f14b609de51b3d20eece1403fda6df9e6d58"
    spec = importlib.util.spec_from_file_location("vllm_int4_rht", path)
    rht = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rht)
    torch_dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    assert np.array_equal(rht._get_rht_signs(256, 0, "cpu").numpy(), vr.rht_signs(256))
    cases = [c for c in CASES if c["spec"] == "vllm:int4_per_token_head" and "error" not in c]
    assert len(cases) >= 12
    for c in cases:
        for t in c["tensors"]:
            x = decode(bytes.fromhex(t["input_hex"]), t["dtype"]).reshape(t["shape"])
            d = x.shape[-1]
            b = d & -d
            dt = torch_dtype[t["dtype"]]
            # reshape_and_cache_int4 (int4_per_token_head.py:867): single_rht(key.float()).to(key.dtype)
            rotated = rht.single_rht(torch.from_numpy(x).to(dt).float()).to(dt).float().numpy().reshape(-1, d)
            raw = np.frombuffer(bytes.fromhex(t["parts"][".codes"]), np.uint8).reshape(-1, d // 2 + 4)
            q = np.stack([raw[:, : d // 2] & 0xF, raw[:, : d // 2] >> 4], axis=-1).reshape(-1, d).astype(np.float32)
            bits = raw[:, d // 2:].copy().view("<u4")[:, 0]
            zp, scale = (bits & 0xF).astype(np.float32), (bits & np.uint32(0xFFFFFFF0)).view(np.float32)
            lo, hi = rotated.min(axis=1), rotated.max(axis=1)
            want_scale = np.maximum(((hi - lo) / np.float32(15)).astype(np.float32), np.float32(1e-6))
            assert np.array_equal(scale.view(np.uint32), want_scale.view(np.uint32) & np.uint32(0xFFFFFFF0)), c["name"]
            deq = torch.from_numpy(((q - zp[:, None]) * scale[:, None]).astype(np.float32))
            back = (rht.single_rht(deq, inverse=True) / b).numpy().reshape(-1)
            got = np.frombuffer(bytes.fromhex(t["restored_hex"]), "<f4") if t["dtype"] == "F32" else None
            if got is not None:
                assert np.array_equal(back.view(np.uint32), got.view(np.uint32)), c["name"]


def _bf16_sample() -> np.ndarray:
    x = (np.arange(1 << 16, dtype=np.uint32) << 16).view(F32)
    return x[~np.isnan(x)]


def test_nvfp4_casts_are_round_to_nearest_even_and_saturating():
    """The NVFP4 reference's E2M1 codes are the nearest grid value (ties to the even code, past 6
    saturated, the sign kept on zeros) by brute force, on every bfloat16 value and the grid's
    midpoints; its E4M3 scale byte is torch's cast after the clamp to 448."""
    import nvfp4_reference as nr

    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)
    mids = (grid[1:] + grid[:-1]) / 2
    x = np.concatenate([_bf16_sample(), mids.astype(F32), -mids.astype(F32), np.nextafter(mids.astype(F32), F32(0))])
    a = np.abs(x.astype(np.float64))
    d = np.abs(a[:, None] - grid[None, :])
    best = np.argmin(np.where(d == d.min(axis=1, keepdims=True), np.arange(8) % 2, 2) * 1e300 + d, axis=1)  # ties: even
    want = np.where(a >= 6, 7, best).astype(np.uint8) | (np.signbit(x).astype(np.uint8) << 3)
    assert np.array_equal(nr.e2m1_codes(x), want)
    assert nr.e2m1_codes(np.array([np.nan], F32))[0] == 0x7
    y = np.abs(_bf16_sample())
    theirs = torch.from_numpy(np.clip(y, 0, 448)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(nr.e4m3_codes(y), theirs)


def test_nvfp4_exact_arithmetic_rounds_once():
    """The reference's rational-to-float32 rounding is numpy's float64-to-float32 conversion on values
    float64 holds (one rounding each), subnormals included; its fma agrees with float64 where the
    float64 result is exact, and differs from rounding twice on a float32 tie nudged below float64's
    resolution."""
    from fractions import Fraction

    import nvfp4_reference as nr

    rng = np.random.default_rng(9)
    v = np.concatenate([rng.standard_normal(3000) * np.exp2(rng.integers(-160, 120, 3000)),
                        (np.arange(1, 200) + 0.5) * 2.0 ** -149, [3.4028235677973366e38, 3.4028235e38 * 1.0000001]])
    for t in v:
        with np.errstate(over="ignore"):
            assert nr.to_float32(Fraction(float(t))).view(np.uint32) == F32(t).view(np.uint32), t
    for a, b, c in rng.integers(-2000, 2000, (500, 3)):
        assert nr.fma32(F32(a), F32(b), F32(c)) == F32(float(a) * float(b) + float(c))
    a = F32(1 + 2.0 ** -12)  # a * a = 1 + 2**-11 + 2**-24: halfway between two float32 values
    for c, up in ((F32(2.0 ** -80), True), (F32(-2.0 ** -80), False)):
        twice = F32(np.float64(a) * np.float64(a) + np.float64(c))
        once = nr.fma32(a, a, c)
        assert once == (np.nextafter(F32(1 + 2.0 ** -11), F32(2)) if up else F32(1 + 2.0 ** -11))
        assert (once != twice) == up  # float64 keeps the tie and rounds it to even (down)


def test_nvfp4_vectors_hold_the_engines_choices():
    """In the past-the-range case: nvfp4_4over6 keeps /6 on a tie (a block of 6 and 3, exact either
    way) and takes /4 for a block of 4s (exact at scale 1.0, not at 4/6's E4M3 scale); plain nvfp4
    stores that block with the E4M3 byte torch gives 4 * float32(1/6), and a block whose scale rounds
    to E4M3 zero as zero codes (vLLM's guard on the converted scale)."""
    cases = {c["name"]: c for c in VLLM}
    x = np.frombuffer(bytes.fromhex(cases["vllm_nvfp4_past_the_range"]["tensors"][0]["input_hex"]), "<f4").reshape(-1, 16)
    blocks = {name: np.frombuffer(bytes.fromhex(cases[f"vllm_{name}_past_the_range"]["tensors"][0]["parts"][".codes"]),
                                  np.uint8).reshape(-1, 9) for name in vr.NVFP4}
    six_three = int(np.flatnonzero((x[:, 0] == 6) & (x[:, 1] == 3) & np.all(x[:, 2:] == 0, axis=1))[0])
    fours = int(np.flatnonzero(np.all(x == 4, axis=1))[0])
    tiny = int(np.flatnonzero(x[:, 0] == F32(1e-3))[0])
    one = torch.tensor([1.0]).to(torch.float8_e4m3fn).view(torch.uint8).item()
    four_sixths = torch.tensor([F32(4) * (F32(1) / F32(6))]).to(torch.float8_e4m3fn).view(torch.uint8).item()
    assert blocks["nvfp4_4over6"][six_three, 8] == one and blocks["nvfp4_4over6"][fours, 8] == one
    assert np.all(blocks["nvfp4_4over6"][fours, :8] == 0x66)  # 4 at scale 1: code 6
    assert blocks["nvfp4"][fours, 8] == four_sixths != one
    assert blocks["nvfp4"][tiny, 8] == 0 and np.all(blocks["nvfp4"][tiny, :8] & 0x77 == 0)


# --- TurboQuant: vLLM's own code ----------------------------------------------------------------------

THIRD = make_engine_vectors.OUT.parent.parent / "third_party"
TQ_ENGINE = json.loads((make_engine_vectors.OUT.parent / "vllm_turboquant_engine.json").read_text())
TQ_FILES = {  # tests/third_party/README.md
    "vllm_turboquant_centroids.py": "c91906fe27c0a1b2f76811935336978d929e6a11d0b4aa71a3472d9c14744a05",
    "vllm_turboquant_config.py": "203190625cdec38a551b0f40ddfedb5fd053cc38f50c0c2c47816a777c030f6c",
    "vllm_turboquant_attn.py": "36e831db1e9eb6bdf90aa66bb7e22f20e42ef6eb50b1d2c2f8bd02e9a6ca073e",
    "vllm_turboquant_store.py": "4d186dbac269a47e8e4c3ab468b1cb3d145eb0d7dbb097b99168f3454e52813a",
    "vllm_turboquant_dequant.py": "ec69d2d6e6e1e14a63a5e1e8fe1fc8633d31b51ec517c88d5b88dc0b78609f9b",
}
TQ_CASES = [c for c in VLLM if c["name"].startswith("vllm_turboquant_")]


def _third_party(name: str):
    import hashlib
    import importlib.util
    import sys

    path = THIRD / f"{name}.py"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == TQ_FILES[path.name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # config.py's dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def _dense(num_layers: int):
    from types import SimpleNamespace

    return SimpleNamespace(is_hybrid=False, hf_text_config=SimpleNamespace(num_hidden_layers=num_layers))


def test_turboquant_vectors_cover_the_issue():
    names = {c["name"] for c in TQ_CASES}
    for preset in vr.TURBOQUANT:
        for dtype in ("f32", "f16", "bf16"):
            for hd in (64, 128, 256):
                assert f"vllm_{preset}_{dtype}_hd{hd}" in names
        past = next(c for c in TQ_CASES if c["name"] == f"vllm_{preset}_past_the_range")
        assert sum(t["non_finite"] for t in past["tensors"]) > 0  # fp16 norms and zeros past 65504: Inf, NaN
    past = next(c for c in TQ_CASES if c["name"] == "vllm_turboquant_k8v4_past_the_range")
    x = np.frombuffer(bytes.fromhex(past["tensors"][0]["input_hex"]), "<f4")
    assert past["tensors"][0]["saturated"] == int(np.sum(np.abs(x) > 448)) > 64  # FP8 keys with no scale clamp at 448
    assert sum("error" in c for c in TQ_CASES) >= 5
    skipped = {c["name"]: sorted({t["name"] for t in c["tensors"] if "format" not in t}) for c in TQ_CASES if "error" not in c}
    assert skipped["vllm_turboquant_k3v4_nc_6_layers"] == [f"layer_{i}_{r}" for i in (0, 1, 4, 5) for r in ("key", "value")]
    assert skipped["vllm_turboquant_k8v4_3_layers"] == [f"layer_{i}_{r}" for i in (0, 2) for r in ("key", "value")]
    assert "layer_0_value" not in skipped["vllm_turboquant_3bit_nc_boundary_override"]


def test_turboquant_config_and_boundary_are_vllms():
    """vLLM's own config.py (verbatim): the presets' formats and slot sizes are kv-compress's, and its
    get_boundary_skip_layers gives the layers the vectors and the CLI store with none."""
    config = _third_party("vllm_turboquant_config")
    for preset, (k, v) in vr.TURBOQUANT.items():
        for d in (64, 128, 256):
            cfg = config.TurboQuantConfig.from_cache_dtype(preset, d)
            assert cfg.key_fp8 == (k == "turboquant_k8") and cfg.norm_correction == (k != "turboquant_k8")
            assert cfg.key_mse_bits == vr.TQ_BITS.get(k, 0) and cfg.value_quant_bits == vr.TQ_BITS[v]
            case = next(c for c in TQ_CASES if c["name"] == f"vllm_{preset}_bf16_hd{d}")
            rows = {t["name"]: len(bytes.fromhex(t["parts"][".codes"])) // int(np.prod(t["shape"][:3])) for t in case["tensors"]}
            assert (rows["layer_0_key"], rows["layer_0_value"]) == (cfg.key_packed_size, cfg.value_packed_size)
            assert cfg.slot_size_aligned == cfg.slot_size  # no padding byte at these head sizes
    with pytest.raises(ValueError, match="Unknown TurboQuant cache dtype"):
        config.TurboQuantConfig.from_cache_dtype("ultraquant_4bit", 128)
    for n in range(1, 70):
        want = [int(i) for i in config.TurboQuantConfig.get_boundary_skip_layers(_dense(n))]
        assert vr.tq_boundary_layers(n) == want
        if str(n) in TQ_ENGINE["boundary_layers"]:
            assert TQ_ENGINE["boundary_layers"][str(n)] == want


def test_turboquant_centroids_are_vllms_solver():
    """vLLM computes its Lloyd-Max centroids at run time (centroids.py, float64 CPython); its solver,
    run here verbatim, gives the tables recorded beside the engine's output, which go test compares
    with the ones kv-compress embeds."""
    centroids = _third_party("vllm_turboquant_centroids")
    assert len(TQ_ENGINE["centroids"]) == 12
    for key, want in TQ_ENGINE["centroids"].items():
        d, b = map(int, key.split("/"))
        got = centroids.solve_lloyd_max(d, b)[0].numpy().view(np.uint32)
        assert [f"{u:08x}" for u in got] == want, key


def test_turboquant_rotation_is_vllms_up_to_the_order_of_its_sums():
    """vLLM's store rotates with torch: ||k||, x / (||k|| + 1e-8), x_hat @ PiT (triton_turboquant_store.py:
    414-417, PiT from _build_hadamard_cached, verbatim). Run here on the CPU on every MSE vector, with the
    kernel's index (the count of midpoints <= y, its binary search) and fp16 norm: kv-compress's bytes,
    whose sums run in another order (float32 butterfly, in-order squares)."""
    import torch

    attn = _third_party("vllm_turboquant_attn")
    from kvq_reference import decode

    n = 0
    for c in TQ_CASES:
        if "error" in c:
            continue
        for t in c["tensors"]:
            fmt = t.get("format", "").removeprefix("vllm:")
            if fmt not in ("turboquant_k4_nc", "turboquant_k3_nc"):
                continue
            b, d = vr.TQ_BITS[fmt], t["shape"][-1]
            pit = attn._build_hadamard_cached(d, "cpu")
            assert np.array_equal(np.abs(pit.numpy()), np.full((d, d), vr.tq_hadamard_entry(d)))
            k = torch.from_numpy(decode(bytes.fromhex(t["input_hex"]), t["dtype"]).reshape(-1, d))
            norms = k.norm(dim=1, keepdim=True)
            y = ((k / (norms + 1e-8)) @ pit).numpy()
            cents = torch.from_numpy(vr.tq_centroids(d, b))
            c_sorted, _ = cents.sort()
            mids = ((c_sorted[:-1] + c_sorted[1:]) / 2).numpy()  # turboquant_attn.py:470-472
            idx = np.sum(y[:, :, None] >= mids[None, None, :], axis=-1)
            nb = (d * b + 7) // 8
            ours = np.frombuffer(bytes.fromhex(t["parts"][".codes"]), np.uint8).reshape(-1, nb + 2)
            assert np.array_equal(vr._unpack(ours[:, :nb], b, d), idx), (c["name"], t["name"])
            with np.errstate(over="ignore"):
                assert np.array_equal(ours[:, nb:].copy().view("<u2")[:, 0], norms[:, 0].numpy().astype(np.float16).view(np.uint16))
            n += 1
    assert n == 27 + 2 + 1 + 3  # the grid, the six-layer cache, skip_layer_2, past_the_range


def _read_ours(t: dict, fmt: str, d: int) -> np.ndarray:
    """kv-compress's stored head vectors read as vLLM's _tq_full_dequant_kv does (fp16; MSE keys in the
    rotated basis, norm times the renormalised centroids)."""
    raw = np.frombuffer(bytes.fromhex(t["parts"][".codes"]), np.uint8)
    with np.errstate(all="ignore"):
        if fmt == "turboquant_k8":
            return vr.fp8_values(raw, "fp8_e4m3").astype(np.float16).reshape(-1, d)
        b = vr.TQ_BITS[fmt]
        nb = (d * b + 7) // 8
        if fmt.startswith("turboquant_v"):
            return vr.tq_value_read(raw.reshape(-1, nb + 4), b, d).astype(np.float16)
        rows = raw.reshape(-1, nb + 2)
        c = vr.tq_centroids(d, b)[vr._unpack(rows[:, :nb], b, d)]
        inv = (np.float32(1) / np.sqrt((vr._sum_squares_in_order(c) + np.float32(1e-16)).astype(np.float32))).astype(np.float32)
        return (vr._f16_read(rows[:, nb:nb + 2])[:, None] * (c * inv[:, None]).astype(np.float32)).astype(np.float16)


def test_turboquant_bytes_and_reads_are_vllms():
    """vLLM's own store and read (tests/vllm_turboquant_harness.py: the launcher with torch on the CPU,
    the Triton kernels in Triton's interpreter; FP8 keys as SM90+'s satfinite cast) on every vector
    layer TurboQuant quantizes: kv-compress's K and V bytes are the engine's, and so are the reads."""
    cases = {c["name"]: c for c in TQ_CASES}
    quantized = {(c["name"], t["name"].rsplit("_", 1)[0]) for c in TQ_CASES if "error" not in c for t in c["tensors"]
                 if t.get("format") in tuple(f"vllm:{f}" for f in vr.TURBOQUANT[next(p for p in vr.TURBOQUANT if c["spec"].startswith(vr.tq_spec(p)))])}
    assert {(e["case"], e["layer"]) for e in TQ_ENGINE["layers"]} <= quantized and len(TQ_ENGINE["layers"]) == 45
    assert TQ_ENGINE["vllm_version"] == vr.VERSION
    for e in TQ_ENGINE["layers"]:
        ts = {t["name"]: t for t in cases[e["case"]]["tensors"]}
        for role, fmt in zip(("key", "value"), vr.TURBOQUANT[e["preset"]]):
            t = ts[f"{e['layer']}_{role}"]
            assert t["parts"][".codes"] == e[f"{role}_hex"], (e["case"], role)
            theirs = np.frombuffer(bytes.fromhex(e[f"{role}_read_hex"]), "<f2")
            ours = _read_ours(t, fmt, t["shape"][-1]).reshape(-1)
            assert np.array_equal(ours, theirs, equal_nan=True), (e["case"], role)


def test_turboquant_harness_reruns(monkeypatch):
    """Where triton is installed, vLLM's kernels run again (in Triton's interpreter) and give the
    recorded output."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # before triton is imported: it reads it then
    pytest.importorskip("triton")
    import vllm_turboquant_harness as h

    picked = [c for c in TQ_CASES if c["name"] in ("vllm_turboquant_k3v4_nc_bf16_hd128", "vllm_turboquant_3bit_nc_past_the_range",
                                                    "vllm_turboquant_k8v4_f16_hd64", "vllm_turboquant_4bit_nc_skip_layer_2")]
    got = h.build(picked)["layers"]
    recorded = [e for e in TQ_ENGINE["layers"] if e["case"] in {c["name"] for c in picked}]
    assert got == recorded and len(got) == 4


def test_turboquant_halves_take_their_role(cli):
    for spec, msg in (("vllm:turboquant_v4", "is the value half of vllm's TurboQuant presets"),
                      ("vllm:turboquant_k3v4_nc,v1=vllm:turboquant_k8", "layer 1 value scheme: vllm:turboquant_k8 is the key half")):
        proc = subprocess.run([cli, "check", "-scheme", spec], capture_output=True, text=True)
        assert proc.returncode != 0 and msg in proc.stderr and proc.stderr.count("\n") == 1
    proc = subprocess.run([cli, "check", "-scheme", "vllm:ultraquant_4bit"], capture_output=True, text=True)
    assert proc.returncode != 0 and "ROCm only" in proc.stderr and "log2" in proc.stderr


def test_turboquant_leaves_the_query_exact():
    """TURBOQUANT never quantizes Q (supports_quant_query_input = False, turboquant_attn.py:308); its MSE
    decode rotates Q by PiT in float32 (triton_turboquant_decode.py:519-528), which the cache's read in
    the model's basis stands for; the FP8-key decode multiplies Q as it is (:522-523)."""
    from kvlib.codec.spec import resolve_codec
    from kvlib.transforms.engine import query_codec

    for preset in vr.TURBOQUANT:
        assert query_codec(resolve_codec(f"vllm:{preset}").key) is None


# --- Per-token-head: vLLM's own writers -------------------------------------------------------------

PTH_ENGINE = json.loads((make_engine_vectors.OUT.parent / "vllm_per_token_head_engine.json").read_text())
PTH_FILES = {  # tests/third_party/README.md
    "vllm_per_token_head.py": "0b8ae4dfd46d05849fdc272bbdb6e5392eca78b2cfc774bd60c79e02eeb004f9",
    "vllm_int4_store.py": "28f2430eb11322c34736973ccca2ceee42d60ad67432d91ae6eade53132cd6d3",
    "vllm_int4_rht.py": "9883ea18ef7016e44d2fba770ab4f14b609de51b3d20eece1403fda6df9e6d58",
    "vllm_reshape_and_cache_flash.py": "73630a68521c5e5bda6612a2bc89f5f241c0c8a3f1d9f66788d999281102bacc",
}
PTH = ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")


def _pth_tensors() -> dict[tuple[str, str], tuple[dict, str]]:
    """Every vector tensor a per-token-head format quantizes: (case, tensor) -> (tensor, format)."""
    return {(c["name"], t["name"]): (t, t["format"].removeprefix("vllm:")) for c in VLLM if "error" not in c
            for t in c["tensors"] if t.get("format", "").removeprefix("vllm:") in PTH}


def test_per_token_head_engine_covers_the_vectors():
    """The recorded engine output holds every per-token-head tensor of the vectors once: F32, F16 and
    BF16 on head_dim 64, 128 and 256, outlier key channels, an all-zero token-head, values past the
    range, a role alone in its format, skipped layers, int4's head_dim 96 and 80."""
    import hashlib

    for name, sha in PTH_FILES.items():
        assert hashlib.sha256((THIRD / name).read_bytes()).hexdigest() == sha, name
    ours = _pth_tensors()
    theirs = [(e["case"], e["tensor"]) for e in PTH_ENGINE["tensors"]]
    assert sorted(theirs) == sorted(ours) and len(set(theirs)) == len(theirs) == 66
    assert all(ours[(e["case"], e["tensor"])][1] == e["format"] for e in PTH_ENGINE["tensors"])
    assert PTH_ENGINE["vllm_version"] == vr.VERSION and PTH_ENGINE["triton_version"] == "3.8.0"
    got = {(t["dtype"], t["shape"][-1], f) for t, f in ours.values()}
    assert all((dt, hd, f) in got for dt in ("F32", "F16", "BF16") for hd in (64, 128, 256) for f in PTH)
    for f in PTH:
        assert (f"vllm_{f}_past_the_range", "layer_0_key") in ours
    assert ("vllm_per_role", "layer_0_value") in ours and ("vllm_per_role", "layer_0_key") not in ours
    assert ("vllm_skip_layer_0", "layer_2_value") in ours and ("vllm_skip_layer_0", "layer_0_key") not in ours
    # the interpreter's own fp32 -> float8e4nv cast is not the GPU's (tests/vllm_triton_harness.py)
    assert PTH_ENGINE["fp8_codes_the_interpreters_own_cast_changes"] == {"bytes": 149, "of": 8832}


def _int4_code(v: np.float32) -> int:
    """The kernel's where(v >= 0, int(v + 0.5), int(v - 0.5)) clamped to [0, 15], in float32."""
    q = np.trunc(v + F32(0.5)) if v >= 0 else np.trunc(v - F32(0.5))
    return int(min(max(q, 0), 15))


def test_per_token_head_bytes_are_vllms():
    """vLLM's own writers (tests/vllm_triton_harness.py: the launchers and Triton kernels, verbatim, in
    Triton's interpreter) on every per-token-head vector tensor: kv-compress's bytes are the engine's,
    codes and float32 scales. fp8_per_token_head's codes are converted to e4m3 as the GPU does (torch's
    cast after the clamp to 448; the interpreter's own cast is not that). int4_per_token_head: its
    scale words everywhere, and its codes but where the interpreter's unfused x * (1/scale) + zp
    rounds onto a tie that the GPU's fused multiply-add (Triton's default fp fusion, kv-compress's
    arithmetic) does not reach; each such code is recomputed both ways from vLLM's own rotation."""
    import importlib.util

    import nvfp4_reference as nr
    from kvq_reference import decode

    spec = importlib.util.spec_from_file_location("vllm_int4_rht", THIRD / "vllm_int4_rht.py")
    rht = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rht)
    tensors = _pth_tensors()
    fused = []
    for e in PTH_ENGINE["tensors"]:
        t, fmt = tensors[(e["case"], e["tensor"])]
        if fmt != "int4_per_token_head":
            assert t["parts"][".codes"] == e["hex"], (e["case"], e["tensor"])
            continue
        d = t["shape"][-1]
        ours = np.frombuffer(bytes.fromhex(t["parts"][".codes"]), np.uint8).reshape(-1, d // 2 + 4)
        theirs = np.frombuffer(bytes.fromhex(e["hex"]), np.uint8).reshape(-1, d // 2 + 4)
        assert ours.shape == theirs.shape and np.array_equal(ours[:, d // 2:], theirs[:, d // 2:]), (e["case"], e["tensor"])
        nib = lambda raw: np.stack([raw[:, : d // 2] & 0xF, raw[:, : d // 2] >> 4], axis=-1).reshape(-1, d)  # noqa: E731
        for row, i in zip(*np.nonzero(nib(ours) != nib(theirs))):
            dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[t["dtype"]]
            x = torch.from_numpy(decode(bytes.fromhex(t["input_hex"]), t["dtype"]).reshape(-1, d)).to(dt)
            y = rht.single_rht(x.float()).to(dt).float().numpy()[row]  # reshape_and_cache_int4 (:867)
            lo, hi = y.min(), y.max()
            scale = max(F32((hi - lo) / F32(15)), F32(1e-6))
            zp = F32(_int4_code(F32(-lo / scale)))
            inv = F32(F32(1) / scale)
            unfused, one = F32(F32(y[i] * inv) + zp), nr.fma32(y[i], inv, zp)
            assert (nib(theirs)[row, i], nib(ours)[row, i]) == (_int4_code(unfused), _int4_code(one)) and unfused % 1 == 0.5
            fused.append((e["case"], e["tensor"], int(row), int(i)))
    assert fused == [("vllm_int4_per_token_head_hd96", "layer_0_key", 1, 1), ("vllm_int4_per_token_head_hd80", "layer_0_value", 4, 68)]


def test_per_tensor_triton_write_is_kv_compress_for_e4m3():
    """The Triton backend's per-tensor write (triton_reshape_and_cache_flash, verbatim, in Triton's
    interpreter; its fp32 -> e4m3 conversion as the GPU's, torch's cast after the clamp) on every
    per-tensor vector tensor, with its static scale: fp8 and fp8_e4m3 give kv-compress's bytes.
    fp8_e5m2: that backend views its cache as current_platform.fp8_dtype(), float8_e4m3fn, and
    writes the e4m3 codes of x / scale, not the e5m2 codes of FlashInfer's CUDA writer, which
    kv-compress's vllm:fp8_e5m2 follows (its source says so); both are vLLM's, on two backends."""
    from kvq_reference import decode

    ts = {(c["name"], t["name"]): t for c in VLLM if "error" not in c for t in c["tensors"]
          if t.get("format", "").removeprefix("vllm:") in vr.PER_TENSOR}
    got = PTH_ENGINE["per_tensor"]
    assert sorted((e["case"], e["tensor"]) for e in got) == sorted(ts) and len(got) == 64
    assert PTH_ENGINE["per_tensor_codes_the_interpreters_own_cast_changes"] == {"bytes": 1887, "of": 28800}
    calibrated = 0
    for e in got:
        t = ts[(e["case"], e["tensor"])]
        assert t["format"] == f"vllm:{e['format']}"
        calibrated += e["scale"] != 1.0
        if e["format"] != "fp8_e5m2":
            assert t["parts"][".codes"] == e["hex"], (e["case"], e["tensor"])
            continue
        x = decode(bytes.fromhex(t["input_hex"]), t["dtype"])
        with np.errstate(over="ignore"):
            e4m3 = vr.fp8_codes(x / F32(e["scale"]), "fp8_e4m3").tobytes().hex()
        assert e["hex"] == e4m3 != t["parts"][".codes"], (e["case"], e["tensor"])
    assert calibrated == 6  # the three formats' calibrated cases, K and V


def test_per_token_head_harness_reruns(monkeypatch):
    """Where triton is installed, vLLM's writers run again (in Triton's interpreter) and give the
    recorded output."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # before triton is imported: it reads it then
    pytest.importorskip("triton")
    import vllm_triton_harness as h

    picked = [c for c in VLLM if c["name"] in ("vllm_int8_per_token_head_bf16_hd128", "vllm_fp8_per_token_head_past_the_range",
                                                "vllm_per_role", "vllm_int4_per_token_head_hd96", "vllm_int4_per_token_head_f16_hd256",
                                                "vllm_fp8_e4m3_calibrated", "vllm_fp8_e5m2_bf16_hd64")]
    got = h.build(picked)
    names = {c["name"] for c in picked}
    recorded = [e for e in PTH_ENGINE["tensors"] if e["case"] in names]
    assert got["tensors"] == recorded and len(recorded) == 8
    recorded = [e for e in PTH_ENGINE["per_tensor"] if e["case"] in names]
    assert got["per_tensor"] == recorded and len(recorded) == 5
    assert got["fp8_codes_the_interpreters_own_cast_changes"]["bytes"] > 0

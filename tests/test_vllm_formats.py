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
    from test_engine_formats import _write

    _write(src, make_engine_vectors_tensors)
    for spec, want in (("vllm:fp8_e4m3", int(np.sum(np.abs(x) > 448))), (f"vllm:fp8_e4m3/scale{float(np.max(np.abs(x[np.isfinite(x)])) / 448)}", 0)):
        proc = subprocess.run([cli, "metrics", "-input", str(src), "-scheme", spec], capture_output=True, text=True)
        assert proc.returncode in (0, 1), proc.stderr
        assert json.loads(proc.stdout)["tensors"][0].get("saturated", 0) == want > 0 or want == 0


def test_schemes_lists_vllm(cli):
    rows = json.loads(subprocess.run([cli, "schemes", "-engine", "vllm"], capture_output=True, text=True, check=True).stdout)
    assert [r["format"] for r in rows] == list(vr.FORMATS)
    for r in rows:
        assert r["engine_version"] == vr.VERSION and r["evidence"] == "read" and r["flags"] == f"--kv-cache-dtype {r['format']}"
        assert r["source"] and "Triton" in r["evidence_detail"]
    bits = {r["format"]: r["key_bits_per_element"] for r in rows}
    assert bits["fp8_e4m3"] == 8 and bits["int8_per_token_head"] == 8.25  # 8 + a float32 scale per 128
    assert bits["nvfp4"] == bits["nvfp4_4over6"] == 4.5  # 4 + an 8-bit scale per 16
    tops = {r["format"]: r.get("scale_max") for r in rows}
    assert tops["nvfp4"] == tops["nvfp4_4over6"] == 6 * 448 and tops["fp8_e4m3"] == 448
    every = json.loads(subprocess.run([cli, "schemes", "-engine", "all"], capture_output=True, text=True, check=True).stdout)
    assert [r["engine"] for r in every].count("vllm") == len(vr.FORMATS)


def test_kvq_headers_of_engine_formats_follow_the_schema(cli, tmp_path):
    """docs/kv-compress/kvq-header.schema.json describes what kv-compress writes for the engine formats:
    the header, and the records inside kvq.tensors (a JSON string the schema names with contentSchema)."""
    import jsonschema

    from test_engine_formats import _read, _write

    schema = json.loads((make_engine_vectors.OUT.parent.parent.parent / "docs" / "kv-compress" / "kvq-header.schema.json").read_text())
    header_ok = jsonschema.Draft202012Validator(schema)
    records_ok = jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/TensorRecords"})
    wanted = ("vllm_fp8_e4m3_calibrated", "vllm_int8_per_token_head_bf16_hd128", "vllm_skip_layer_0", "vllm_per_role",
              "q4_0_f16_hd64", "per_role_q8_0_q4_0")
    for case in (c for c in VECTORS["cases"] if c["name"] in wanted):
        src, kvq = tmp_path / f"{case['name']}.safetensors", tmp_path / f"{case['name']}.kvq"
        _write(src, case["tensors"])
        subprocess.run([cli, "compress", "-input", str(src), "-output", str(kvq), "-scheme", case["spec"]], capture_output=True,
                       check=False)
        header, _ = _read(kvq)
        header_ok.validate(header)
        records = json.loads(header["__metadata__"]["kvq.tensors"])
        records_ok.validate(records)
        # and a schema that would let anything through fails on a wrong record
        bad = [dict(r, scheme=dict(r["scheme"], scale=-1.0)) for r in records]
        assert not records_ok.is_valid(bad) or not any(r["scheme"]["method"].startswith("vllm:fp8") for r in records)


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

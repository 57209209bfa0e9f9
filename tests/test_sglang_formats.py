"""SGLang 0.5.10.post1's FP8 KV-cache formats (kv-compress's sglang:fp8_e4m3, sglang:fp8_e5m2):
SGLang's write is torch's arithmetic (MHATokenToKVPool.set_kv_buffer: a division in the cache's
dtype when the checkpoint has a scale, then .to(float8)), so torch runs it here on the same caches
and the CLI's bytes must be its bytes. One exception, measured: this CPU build of torch (2.13)
saturates an e4m3 value past 464 to 448, where the CUDA cast SGLang runs (c10's
fp8e4m3fn_from_fp32_value, torch 2.9.1) gives NaN; kv-compress follows the CUDA cast, and those
elements are checked against it. The NumPy reference (tests/sglang_reference.py) that makes the
shared vectors is checked against torch too."""

from __future__ import annotations

import json
from pathlib import Path
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import sglang_reference as sr
from test_engine_formats import _read

TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def _cache(dtype: str, hd: int, seed: int) -> torch.Tensor:
    """Keys with outlier channels, some past each format's range, and an all-zero token-head."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 2, 5, hd, generator=g)
    x[..., 3] *= 300  # past 464 now and then: NaN for e4m3
    x[..., 7] *= 1e5  # past 61440 now and then: Inf for e5m2
    x[:, 1, 0] = 0
    if dtype == "F16":  # a half cache holds at most 65504: past e5m2's 61440 still
        x = x.clamp(-65000, 65000)
    return x.to(TORCH[dtype])


def _sglang_write(k: torch.Tensor, fmt: str, scale: float) -> torch.Tensor:
    """set_kv_buffer's arithmetic, run by torch: the scale a tensor of the cache's dtype (as the CUDA
    kernel casts a 0-dim fp32 parameter), the division in that dtype, then the cast."""
    if scale != 1:
        k = (k.float() / torch.tensor(scale, dtype=torch.float32).to(k.dtype).float()).to(k.dtype)
    return k.to(FP8[fmt]).view(torch.uint8)


@pytest.mark.parametrize("fmt", sr.FP8_FORMATS)
@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_cli_is_torchs_cast(fmt, dtype, cli, tmp_path):
    for hd, scale in ((64, 1.0), (128, 1.0), (256, 1.0), (128, 0.37)):
        k = _cache(dtype, hd, hd)
        src, kvq = tmp_path / "in.safetensors", tmp_path / "in.kvq"
        save_file({"layer_0_key": k.contiguous()}, str(src))
        spec = f"sglang:{fmt}" + ("" if scale == 1 else f"/scale{scale}")
        proc = subprocess.run([cli, "compress", "-input", str(src), "-output", str(kvq), "-scheme", spec],
                              capture_output=True, text=True)
        assert proc.returncode in (0, 1), proc.stderr
        _, parts = _read(kvq)
        got = np.frombuffer(parts["layer_0_key.codes"], np.uint8)
        want = _sglang_write(k, fmt, scale).numpy().reshape(-1).copy()
        y = k.float().numpy().reshape(-1) / (1 if scale == 1 else np.float32(torch.tensor(scale).to(k.dtype).item()))
        past = np.abs(y) > 464 if fmt == "fp8_e4m3" else np.zeros(y.shape, bool)
        assert np.all(want[past] & 0x7F == 0x7E)  # this CPU torch saturates there ...
        want[past] = (want[past] & 0x80) | 0x7F  # ... the CUDA cast gives NaN
        assert np.array_equal(got, want), (hd, scale)
        ref, _ = sr.compress_tensor(k.float().numpy(), fmt, dtype, scale)
        assert ref == got.tobytes()
        back = got
        bad = int(np.sum(~np.isfinite(torch.from_numpy(back.copy()).view(FP8[fmt]).float().numpy())))
        assert json.loads(proc.stdout)["tensors"][0].get("non_finite", 0) == bad
        if scale == 1 and hd == 128:
            assert bad > 0  # keys past the range: NaN (e4m3) or Inf (e5m2), as the engine stores them


def test_reference_cast_is_torchs_on_every_bfloat16():
    """In range, and for e5m2 everywhere, the reference is this torch's cast; past e4m3's range it is
    the CUDA cast's NaN (this CPU build saturates instead)."""
    x = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    for fmt, dtype in FP8.items():
        want = torch.from_numpy(x.copy()).to(dtype).view(torch.uint8).numpy()
        got = sr.torch_cast_codes(x, fmt)
        nan = np.isnan(x)
        past = np.abs(x) > 464 if fmt == "fp8_e4m3" else np.zeros(x.shape, bool)
        assert np.array_equal(got[~nan & ~past], want[~nan & ~past])
        assert np.all(got[past & ~nan] & 0x7F == 0x7F) and np.all(want[past & ~nan] & 0x7F == 0x7E)
        assert np.all(torch.from_numpy(got[nan].copy()).view(dtype).float().isnan().numpy())


def test_sglang_is_listed_and_spelled(cli):
    rows = json.loads(subprocess.run([cli, "schemes", "-engine", "sglang"], capture_output=True, text=True, check=True).stdout)
    assert [r["format"] for r in rows] == list(sr.FORMATS)
    assert all(r["engine_version"] == sr.VERSION for r in rows)
    assert [r["evidence"] for r in rows] == ["read", "read", "executed"]  # fp4_e2m1: SGLang's own file runs here
    assert rows[2]["key_bits_per_element"] == 4.5 and rows[2]["flags"] == "--kv-cache-dtype fp4_e2m1"
    assert rows[0]["flags"] == "--kv-cache-dtype fp8_e4m3"
    from kvlib.codec.spec import resolve_codec
    from kvlib.transforms.engine import query_codec

    assert resolve_codec("sglang:fp8_e5m2/scale0.5").spec == "sglang:fp8_e5m2/scale0.5"
    assert query_codec(resolve_codec("sglang:fp8_e4m3").key).spec == "k=sglang:fp8_e4m3,v=none"
    assert query_codec(resolve_codec("sglang:fp8_e5m2").key) is None


THIRD_PARTY = Path(__file__).parent / "third_party"


@pytest.fixture(scope="module")
def kvfp4():
    """SGLang's own KVFP4QuantizeUtil (tests/third_party, verbatim from the 0.5.10.post1 wheel), run
    eagerly: SGLang compiles it with torch.compile, whose float32 arithmetic agrees with the eager
    run on float32 input; eager on bfloat16 input rounds intermediates to bfloat16 (checked below)."""
    import hashlib
    import importlib.util

    path = THIRD_PARTY / "sglang_kvfp4_tensor.py"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == "4689ccf1f50de293dab08c5027c5119cab6769822f43845323db68d550bd04f7"
    spec = importlib.util.spec_from_file_location("sglang_kvfp4_tensor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch._dynamo.config, "disable", True)
        yield module.KVFP4QuantizeUtil


def _sglang_fp4(util, x: np.ndarray) -> tuple[bytes, np.ndarray]:
    """SGLang's write and read of a [1, heads, tokens, head_dim] cache, as kv-compress lays out its
    bytes (per token-head, 8 nibble bytes then the scale byte of each block of 16)."""
    t = torch.from_numpy(np.ascontiguousarray(x[0].transpose(1, 0, 2)))  # [tokens, heads, head_dim]
    packed, scales = util.batched_quantize(t)
    n, h, d = t.shape
    blocks = packed.reshape(n, h, d // 16, 8).numpy()
    sf = scales.reshape(n, h, d // 16, 1).numpy()
    raw = np.concatenate([blocks, sf], axis=-1).transpose(1, 0, 2, 3)  # back to [heads, tokens, ...]
    back = util.batched_dequantize(packed, scales, torch.float32).numpy().transpose(1, 0, 2)
    return np.ascontiguousarray(raw).tobytes(), back.reshape(-1)


def _fp4_cases() -> list[dict]:
    from test_engine_formats import CASES

    return [c for c in CASES if c["spec"] == "sglang:fp4_e2m1" and "error" not in c]


def test_fp4_vectors_are_sglangs_own_bytes(kvfp4):
    """Every sglang:fp4_e2m1 vector (which the CLI and go test reproduce) is what SGLang's own code
    writes and reads on the same values: F32, F16 and BF16 caches, head_dim 64-256, ties, floors, Inf."""
    from kvq_reference import decode

    cases = _fp4_cases()
    assert len(cases) >= 10
    for c in cases:
        for t in c["tensors"]:
            x = decode(bytes.fromhex(t["input_hex"]), t["dtype"]).reshape(t["shape"])
            raw, back = _sglang_fp4(kvfp4, x)
            assert raw.hex() == t["parts"][".codes"], (c["name"], t["name"])
            ref_raw, ref_back = sr.fp4_compress(x)
            assert ref_raw == raw and np.array_equal(ref_back, back, equal_nan=True), (c["name"], t["name"])


def test_fp4_eager_bfloat16_rounding_is_where_it_differs(kvfp4):
    """On bfloat16 input, SGLang's eager run rounds amax/6 and its log2 to bfloat16; compiled (as SGLang
    runs it) keeps float32, as kv-compress does. Over every bfloat16 block maximum in [2**-8, 2**12) the
    two differ only where eager's log2 rounds k + a little down to k: measured, not assumed."""
    amax = (np.arange(0x3B80, 0x4580, dtype=np.uint32) << 16).view(np.float32)  # bf16 values 2**-8 .. 2**12
    x = np.zeros((1, 1, amax.size, 16), np.float32)
    x[0, 0, :, 0] = amax
    t = torch.from_numpy(x[0].transpose(1, 0, 2).copy()).to(torch.bfloat16)
    _, eager = kvfp4.batched_quantize(t)
    eager = eager.reshape(-1).numpy().astype(int) - 127
    exact = sr.fp4_exponent(amax)
    differ = eager != exact
    assert np.all(eager[differ] == exact[differ] - 1)  # one too small: the top value saturates at 6
    assert differ.mean() < 0.2
    f32 = torch.from_numpy(x[0].transpose(1, 0, 2).copy())
    _, e32 = kvfp4.batched_quantize(f32)
    assert np.array_equal(e32.reshape(-1).numpy().astype(int) - 127, exact)  # float32: no difference

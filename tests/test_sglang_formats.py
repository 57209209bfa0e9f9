"""SGLang 0.5.10.post1's KV-cache formats (kv-compress's sglang:fp8_e4m3, sglang:fp8_e5m2,
sglang:fp4_e2m1) against SGLang's own code, copied verbatim from its wheel into tests/third_party/
(sha256 pinned there and here).

fp8_e4m3 and fp8_e5m2: MHATokenToKVPool.set_kv_buffer (srt/mem_cache/memory_pool.py:995-1032: with a
checkpoint scale, cache_k.div_(k_scale) in the cache's dtype, then .to(float8), stored as uint8
through _set_kv_buffer_impl) runs on every vector case and on caches the CLI compresses here, and
writes the CLI's bytes. kv-compress's bytes put in SGLang's pool read back, through the pool's
get_key_buffer and the torch_native backend's decode read (srt/layers/attention/
torch_native_backend.py:117-190), as kv-compress reconstructs them.

SGLang runs this torch code on a GPU under torch 2.9.1 (the wheel requires torch==2.9.1); here it
runs on the CPU under torch 2.13. Two things differ, both torch's, both measured below, and
kv-compress follows SGLang's GPU under torch 2.9.1:
- the e4m3 cast past 464 (and of Inf): torch 2.9.1 gives NaN (0x7f; c10's
  fp8e4m3fn_from_fp32_value, torch/headeronly/util/Float8_e4m3fn.h:205-207 in the 2.9.1 wheel),
  torch 2.12 on saturates to 448 (0x7e; pytorch#178817 changed that host-and-device function: by
  its source, a GPU under torch 2.13 saturates too). e5m2's conversion is the same in both (Inf
  from 61440 on).
- the division by layer.k_scale, a 0-dim float32 Parameter on the GPU: CUDA's div_true kernel loads
  it as the cache's dtype (gpu_kernel_with_scalars -> BinaryFunctor of DivFunctor<scalar_t>,
  ATen/native/cuda/Loops.cuh:195-197 and BinaryInternal.h:21-25 in the 2.9.1 wheel: for a bf16 or
  f16 cache the scale is rounded to it, the quotient computed in float32 and rounded), while the
  CPU kernel divides by its float32 value (BinaryOpsKernel.cpp div_true_kernel,
  original_scalar_value). So SGLang's code here gets the scale as the GPU kernel reads it, a 0-dim
  tensor of the cache's dtype; with the float32 Parameter it gives the quotient by the unrounded
  scale, checked too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
import subprocess
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import sglang_reference as sr
from kvq_reference import decode
from make_engine_vectors import restored_bytes
from test_engine_formats import CASES
from vector_files import read_parts

TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
THIRD_PARTY = Path(__file__).parent / "third_party"
SHA256 = {  # tests/third_party/README.md
    "sglang_kvfp4_tensor.py": "4689ccf1f50de293dab08c5027c5119cab6769822f43845323db68d550bd04f7",
    "sglang_memory_pool.py": "7a4805043a43678512db014febe9ad721b71ce8591849a297d46f9162954afd3",
    "sglang_torch_native_backend.py": "4609d98109aff031527b421fcc41c0060bc3fab28c3c444ab786cbe268caa799",
}


def _load(name: str):
    """A file of tests/third_party as a module, its sha256 checked first."""
    path = THIRD_PARTY / name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256[name], name
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sglang():
    """SGLang's pool methods and torch_native's decode read, with the module that _set_kv_buffer_impl
    imports get_is_capture_mode from (its verbatim copy) in sys.modules while they run."""
    pool, attn = _load("sglang_memory_pool.py"), _load("sglang_torch_native_backend.py")
    names = ("sglang", "sglang.srt", "sglang.srt.model_executor", "sglang.srt.model_executor.cuda_graph_runner")
    with pytest.MonkeyPatch.context() as mp:
        for name in names:
            mp.setitem(sys.modules, name, types.ModuleType(name))
        sys.modules[names[-1]].get_is_capture_mode = pool.get_is_capture_mode
        yield SimpleNamespace(pool=pool, attn=attn)


def _pool(sg, fmt: str, tokens: int, heads: int, head_dim: int):
    """A one-layer MHATokenToKVPool with the attributes its __init__ gives it (memory_pool.py:662-666:
    an fp8 cache stored as uint8; 854-869: [size + page_size, heads, head_dim] a layer, slot 0 the
    padding; 781-796), on the CPU."""
    p = object.__new__(sg.pool.MHATokenToKVPool)
    p.size, p.page_size, p.dtype, p.device = tokens, 1, FP8[fmt], "cpu"
    p.store_dtype = torch.uint8 if p.dtype in (torch.float8_e5m2, torch.float8_e4m3fn) else p.dtype
    p.layer_num, p.start_layer, p.end_layer, p.layer_transfer_counter = 1, 0, 0, None
    p.head_num, p.head_dim, p.v_head_dim = heads, head_dim, head_dim
    p.k_buffer = [torch.zeros((p.size + p.page_size, heads, head_dim), dtype=p.store_dtype)]
    p.v_buffer = [torch.zeros((p.size + p.page_size, heads, head_dim), dtype=p.store_dtype)]
    p.device_module, p.alt_stream = torch.get_device_module(p.device), None
    p.row_dim, p.same_kv_dim = heads * head_dim, True
    return p


def _k_scale(scale: float, dtype: str) -> torch.Tensor | None:
    """layer.k_scale as set_kv_buffer gets it: None for a checkpoint without KV scales (no quant
    method: srt/layers/radix_attention.py:83-84); else the value of the float32 Parameter
    (srt/layers/quantization/kv_cache.py:37-43, 78-79) as the GPU's division reads it, in the
    cache's dtype (see the module docstring)."""
    return None if scale == 1 else torch.tensor(scale, dtype=torch.float32).to(TORCH[dtype])


def _flat(t: torch.Tensor) -> np.ndarray:
    """A [tokens, heads, head_dim] tensor of SGLang's in kv-compress's order ([1, heads, tokens, head_dim])."""
    return np.ascontiguousarray(t.numpy().transpose(1, 0, 2)).reshape(-1)


def _sglang_write(sg, x: np.ndarray, fmt: str, dtype: str, k_scale) -> tuple[np.ndarray, np.ndarray]:
    """SGLang's set_kv_buffer on a [1, heads, tokens, head_dim] cache of dtype, called as the
    flashinfer, fa3 and triton backends call it (k and v, layer.k_scale, layer.v_scale): the bytes
    it stores, and the values it handed to the cast (its in-place division's), in kv-compress's order."""
    _, h, t, d = x.shape
    k = torch.from_numpy(np.ascontiguousarray(x[0].transpose(1, 0, 2))).to(TORCH[dtype])  # [tokens, heads, head_dim]
    pool, loc = _pool(sg, fmt, t, h, d), torch.arange(1, t + 1)
    cache_k, cache_v = k.clone(), k.clone()
    pool.set_kv_buffer(SimpleNamespace(layer_id=0), loc, cache_k, cache_v, k_scale, k_scale)
    codes = pool.k_buffer[0][loc]
    assert torch.equal(codes, pool.v_buffer[0][loc]) and not pool.k_buffer[0][0].any()
    return _flat(codes), _flat(cache_k.float())


def _as_torch_291(fmt: str, codes: np.ndarray, y: np.ndarray) -> np.ndarray:
    """SGLang's bytes from this torch (2.13) as its torch (2.9.1) writes them: an e4m3 value past 464
    or Inf, which 2.13 saturates to 448 (0x7e), is NaN (0x7f), its sign kept; nothing else changes."""
    codes = codes.copy()
    if fmt == "fp8_e4m3":
        past = np.abs(y) > 464
        assert np.all(codes[past] & 0x7F == 0x7E)
        codes[past] |= 1
    return codes


def _fp8_cases() -> list[dict]:
    return [c for c in CASES if c["spec"].startswith(("sglang:fp8_e4m3", "sglang:fp8_e5m2")) and "error" not in c]


def _fmt_scale(spec: str) -> tuple[str, float]:
    fmt, _, scale = spec.removeprefix("sglang:").partition("/scale")
    return fmt, float(scale or 1)


def test_fp8_vectors_are_sglangs_own_bytes(sglang):
    """Every sglang:fp8 vector (the CLI and go test reproduce them) is what SGLang's own set_kv_buffer
    writes on the same values: F32, F16 and BF16 caches, head_dim 64, 128 and 256, outlier key
    channels, an all-zero token-head, a checkpoint scale, values past the range (NaN, Inf)."""
    cases = _fp8_cases()
    assert len(cases) == 26 and sum(len(c["tensors"]) for c in cases) == 44
    seen, past, rounded = set(), {f: 0 for f in sr.FP8_FORMATS}, 0
    for c in cases:
        fmt, scale = _fmt_scale(c["spec"])
        for t in c["tensors"]:
            x = decode(bytes.fromhex(t["input_hex"]), t["dtype"]).reshape(t["shape"])
            want = np.frombuffer(bytes.fromhex(t["parts"][".codes"]), np.uint8)
            got, y = _sglang_write(sglang, x, fmt, t["dtype"], _k_scale(scale, t["dtype"]))
            assert np.array_equal(_as_torch_291(fmt, got, y), want), (c["name"], t["name"])
            past[fmt] += int(np.sum(~np.isfinite(want.view(sr.FP8[fmt]).astype(np.float32))))
            seen.add((t["dtype"], t["shape"][3]))
            if scale == 1:  # a quantized checkpoint without KV scales divides by 1.0 (kv_cache.py:55-59): the same bytes
                assert np.array_equal(_sglang_write(sglang, x, fmt, t["dtype"], torch.tensor(1.0))[0], got)
                assert np.array_equal(y, x.reshape(-1))
                continue
            s = sr.round_to(np.float32(scale), t["dtype"])
            assert np.array_equal(y, sr.round_to(x.reshape(-1) / s, t["dtype"]))
            got32, y32 = _sglang_write(sglang, x, fmt, t["dtype"], torch.tensor(scale, dtype=torch.float32))
            assert np.array_equal(y32, sr.round_to(x.reshape(-1) / np.float32(scale), t["dtype"]))  # CPU: the float32 scale
            rounded += int(np.sum(got32 != got))
    assert seen == {(d, hd) for d in ("F32", "F16", "BF16") for hd in (64, 128, 256)}
    assert past["fp8_e4m3"] > 0 and past["fp8_e5m2"] > 0
    assert rounded > 0  # the bf16/f16 scale cases: the CPU's unrounded scale does change bytes


def test_fp8_vectors_read_back_by_sglang(sglang):
    """kv-compress's bytes, put in SGLang's pool, read back as kv-compress reconstructs them: the
    pool's get_key_buffer (the float8 view every backend reads) times the scale, as the flashinfer,
    fa3 and triton kernels multiply by k_scale_float (those CUDA and Triton kernels did not run);
    and, unscaled, the torch_native backend's own decode read (a cast to the query's dtype, no scale:
    that backend writes without one), through its SDPA over one zero key per request, whose weight 1
    makes the output the value read."""
    n = 0
    for c in _fp8_cases():
        fmt, scale = _fmt_scale(c["spec"])
        for t in c["tensors"]:
            _, h, tok, d = t["shape"]
            pool, loc = _pool(sglang, fmt, tok, h, d), torch.arange(1, tok + 1)
            codes = np.frombuffer(bytes.fromhex(t["parts"][".codes"]), np.uint8).reshape(h, tok, d)
            pool.k_buffer[0][loc] = torch.from_numpy(codes.transpose(1, 0, 2).copy())
            read = pool.get_key_buffer(0)[loc]
            assert read.dtype == FP8[fmt]
            back = decode(restored_bytes(_flat(read.float()) * np.float32(scale), t["dtype"]), t["dtype"])
            restored = decode(bytes.fromhex(t["restored_hex"]), t["dtype"])
            assert np.array_equal(back, restored, equal_nan=True), (c["name"], t["name"])  # a NaN's payload aside
            assert np.array_equal(np.signbit(back), np.signbit(restored))
            if scale != 1:
                continue
            q = torch.ones(tok, h, d, dtype=TORCH[t["dtype"]])
            keys = torch.zeros_like(pool.get_key_buffer(0))
            out = sglang.attn.TorchNativeAttnBackend()._run_sdpa_forward_decode(
                q, torch.empty_like(q), keys, pool.get_key_buffer(0), loc.reshape(tok, 1), torch.arange(tok),
                torch.ones(tok, dtype=torch.int64))
            assert np.array_equal(_flat(out.float()), restored, equal_nan=True), (c["name"], t["name"])  # -0 reads as 0
            n += 1
    assert n == 38


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


def _past(fmt: str, y: np.ndarray) -> np.ndarray:
    """Where torch 2.9.1's cast gives NaN (e4m3, past 464) or Inf (e5m2, from 61440 on)."""
    return np.abs(y) > 464 if fmt == "fp8_e4m3" else np.abs(y) >= 61440


@pytest.mark.parametrize("fmt", sr.FP8_FORMATS)
@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_cli_is_sglangs_write(fmt, dtype, sglang, cli, tmp_path):
    """The CLI's bytes are SGLang's set_kv_buffer's, NaN and Inf included, on caches with outlier
    channels past each format's range and an all-zero token-head, head_dim 64, 128 and 256: unscaled,
    with a checkpoint scale (0.37), and with one (0.004) that pushes values in range past it."""
    pushed, unscaled = 0, 0
    for hd in (64, 128, 256):
        for scale in (1.0, 0.37, 0.004):
            k = _cache(dtype, hd, hd)
            src, kvq = tmp_path / "in.safetensors", tmp_path / "in.kvq"
            save_file({"layer_0_key": k.contiguous()}, str(src))
            spec = f"sglang:{fmt}" + ("" if scale == 1 else f"/scale{scale}")
            proc = subprocess.run([cli, "compress", "-input", str(src), "-output", str(kvq), "-scheme", spec],
                                  capture_output=True, text=True)
            assert proc.returncode in (0, 1), proc.stderr
            got = np.frombuffer(read_parts(kvq)[1]["layer_0_key.codes"], np.uint8)
            x = k.float().numpy()
            codes, y = _sglang_write(sglang, x, fmt, dtype, _k_scale(scale, dtype))
            assert np.array_equal(got, _as_torch_291(fmt, codes, y)), (hd, scale)
            ref, _ = sr.compress_tensor(x, fmt, dtype, scale)
            assert ref == got.tobytes()
            bad = int(np.sum(~np.isfinite(got.view(sr.FP8[fmt]).astype(np.float32))))
            assert json.loads(proc.stdout)["tensors"][0].get("non_finite", 0) == bad
            assert bad == int(np.sum(_past(fmt, y)))  # NaN (e4m3) or Inf (e5m2), as the engine stores them
            unscaled += bad if scale == 1 else 0
            pushed += int(np.sum(~_past(fmt, x.reshape(-1)) & _past(fmt, y)))
    assert unscaled > 0 and pushed > 0


def test_reference_cast_is_torchs_on_every_bfloat16():
    """In range, and for e5m2 everywhere, the reference is this torch's cast; past e4m3's range it is
    torch 2.9.1's NaN, where this torch (2.12 on) saturates to 448."""
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
    assert [r["evidence"] for r in rows] == ["executed", "executed", "executed"]  # SGLang's own files run here
    assert all("set_kv_buffer" in r["evidence_detail"] and "torch 2.9.1" in r["evidence_detail"] for r in rows[:2])
    assert rows[2]["key_bits_per_element"] == 4.5 and rows[2]["flags"] == "--kv-cache-dtype fp4_e2m1"
    assert rows[0]["flags"] == "--kv-cache-dtype fp8_e4m3"
    from kvlib.codec.spec import resolve_codec
    from kvlib.transforms.engine import query_codec

    assert resolve_codec("sglang:fp8_e5m2/scale0.5").spec == "sglang:fp8_e5m2/scale0.5"
    assert query_codec(resolve_codec("sglang:fp8_e4m3").key).spec == "k=sglang:fp8_e4m3,v=none"
    assert query_codec(resolve_codec("sglang:fp8_e5m2").key) is None


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

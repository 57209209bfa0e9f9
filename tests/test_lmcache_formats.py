"""LMCache 0.5.6's serdes (kv-compress's lmcache:fp8, lmcache:kivi, lmcache:cachegen) are bit-exact to
LMCache's own code:

- the shared vectors (tests/vectors/lmcache_vectors.json) are the NumPy reference's output
  (tests/lmcache_reference.py), and the CLI reproduces them byte for byte (go test does too);
- LMCache's own serdes, the wheel's Python run on CPU (tests/lmcache_harness.py: CacheGenSerializer and
  CacheGenDeserializer over its torch quantizer, calculate_cdf and numba coder; the fp8 and kivi serdes),
  write the same bytes on the same caches and read back the same values: every bitstream, stream
  length, CDF and maximum of every (layer, role) of every chunk object, and the stored size is LMCache's
  payload (its pickle, less the framing);
- CacheGen's bins are CacheGenConfig's for every layer count, and the spelling, menu and refusals are
  the CLI's (asym_k16_v8, which LMCache 0.5.6 does not register, is refused in one line).
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch

import lmcache_harness as lh
import lmcache_reference as lr
import make_lmcache_vectors
from kvq_reference import decode
from vector_files import read_parts, write_inputs

VECTORS = json.loads(make_lmcache_vectors.OUT.read_text())
CASES = VECTORS["cases"]
TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def test_vectors_are_current():
    assert make_lmcache_vectors.OUT.read_text() == make_lmcache_vectors.render()


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_cli_reproduces_lmcache_vectors(case, cli, tmp_path):
    src, kvq, out = tmp_path / "in.safetensors", tmp_path / "in.kvq", tmp_path / "out.safetensors"
    write_inputs(src, case["tensors"])
    proc = subprocess.run([cli, "compress", "-input", str(src), "-output", str(kvq), "-scheme", case["spec"]],
                          capture_output=True, text=True)
    if "error" in case:
        assert proc.returncode == 2 and case["error"] in proc.stderr and "tensor " in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and not kvq.exists()
        return
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["scheme"] == case["spec"]
    _, parts = read_parts(kvq)
    for t, tr in zip(case["tensors"], report["tensors"]):
        assert parts[t["name"] + ".codes"].hex() == t["parts"][".codes"], t["name"]
        assert tr["compressed_size_bytes"] == len(parts[t["name"] + ".codes"])
        assert tr.get("saturated", 0) == t["saturated"] and tr.get("bins") == t.get("bins"), tr["name"]
    subprocess.run([cli, "decompress", "-input", str(kvq), "-output", str(out)], check=True, capture_output=True)
    _, restored = read_parts(out)
    for t in case["tensors"]:
        assert restored[t["name"]].hex() == t["restored_hex"], t["name"]


def _tensors(case) -> dict[str, torch.Tensor]:
    return {t["name"]: torch.from_numpy(decode(bytes.fromhex(t["input_hex"]), t["dtype"]).reshape(t["shape"])).to(TORCH[t["dtype"]])
            for t in case["tensors"]}


def lmcache_cachegen(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, bytes], dict[str, torch.Tensor], list[int]]:
    """What LMCache stores and restores for a kvlib cache (layer_{i}_key/_value, [b, h, t, d]): per batch
    row and 256-token chunk the KV_2LTD object [2, L, n, h*d] (layers or roles the cache lacks: zeros,
    which change nothing of the others' bytes) through CacheGenSerializer and CacheGenDeserializer. Per
    tensor, its share of each object (maxima, CDF, lengths, bitstreams: kv-compress's .codes layout) and
    its reconstruction; and each object's pickle framing (its size less those shares)."""
    some = next(iter(tensors.values()))
    b_, h_, t_, d_ = some.shape
    c = h_ * d_
    layers = 1 + max(int(n.split("_")[1]) for n in tensors)
    zero = torch.zeros_like(some)
    full = torch.stack([torch.stack([tensors.get(f"layer_{layer}_{r}", zero) for layer in range(layers)]) for r in ("key", "value")])
    full = full.permute(0, 1, 2, 4, 3, 5).reshape(2, layers, b_, t_, c)  # [2, L, b, t, C], channel h*d_ + d
    codes = {n: b"" for n in tensors}
    back = {n: torch.empty_like(x) for n, x in tensors.items()}
    framing = []
    for b in range(b_):
        for t0 in range(0, t_, 256):
            kv = full[:, :, b, t0:t0 + 256].contiguous()
            raw, obj, restored = lh.cachegen(kv, h_, d_, layers=layers)
            (chunk,) = obj.data_chunks  # one 256-token stream per channel at chunk_size 256
            assert chunk.ntokens == kv.shape[2] and obj.cdf.dtype == torch.int16 and chunk.bytestream_lengths.dtype == torch.int32
            lengths = chunk.bytestream_lengths.numpy()
            ends = np.concatenate([[0], np.cumsum(lengths.reshape(-1))])
            stream = chunk.bytestream.numpy().tobytes()
            payload = 0
            for row in range(2 * layers):
                ri, layer = divmod(row, layers)
                maxima = (obj.max_tensors_key if ri == 0 else obj.max_tensors_value)[layer, :, 0].contiguous()
                share = (maxima.view(torch.uint8).numpy().tobytes() + obj.cdf[row].numpy().tobytes() + lengths[row].astype("<i4").tobytes()
                         + stream[ends[row * c]:ends[(row + 1) * c]])
                payload += len(share)
                name = f"layer_{layer}_{('key', 'value')[ri]}"
                if name in tensors:
                    codes[name] += share
                    back[name][b, :, t0:t0 + 256] = restored[ri, layer].reshape(-1, h_, d_).transpose(0, 1)
            assert payload == sum(x.numel() * x.element_size() for x in (chunk.bytestream, chunk.bytestream_lengths, obj.cdf,
                                                                          obj.max_tensors_key, obj.max_tensors_value))
            framing.append(len(raw) - payload)
    return codes, back, framing


def _bits(x: torch.Tensor) -> bytes:
    return x.contiguous().view(torch.uint8).numpy().tobytes()


CACHEGEN = [c for c in CASES if c["spec"] == "lmcache:cachegen" and "error" not in c]


@pytest.mark.parametrize("case", CACHEGEN, ids=[c["name"] for c in CACHEGEN])
def test_cachegen_vectors_are_lmcaches_own_bytes(case):
    """Every lmcache:cachegen vector (which the CLI and go test reproduce) is what LMCache's own serializer
    stores and its deserializer restores on the same cache: F32, F16 and BF16, head_dim 64-256, outlier
    channels, values past +-448, all-zero tokens (restored as -0), 12 layers of 32 and 16 bins, a partial
    chunk, ties at the +MAX offset, a factor that overflows, values near FLT_MAX."""
    codes, back, framing = lmcache_cachegen(_tensors(case))
    for t in case["tensors"]:
        assert codes[t["name"]].hex() == t["parts"][".codes"], t["name"]
        assert _bits(back[t["name"]]).hex() == t["restored_hex"], t["name"]
    assert all(1700 < f < 2100 for f in framing), framing  # the pickle's own bytes, about 1.8 KB an object


def test_cachegen_reference_is_lmcaches_on_larger_caches():
    """Beyond the vectors: a 3-layer BF16 cache of 2 heads of 128 and 300 tokens (a full and a partial
    chunk), the NumPy reference against LMCache's own code."""
    g = torch.Generator().manual_seed(7)
    tensors = {}
    for layer in range(3):
        for r in ("key", "value"):
            x = torch.randn(1, 2, 300, 128, generator=g)
            x[..., 5] *= 50
            x[:, :, 9] = 0
            tensors[f"layer_{layer}_{r}"] = x.to(torch.bfloat16)
    codes, back, _ = lmcache_cachegen(tensors)
    for name, x in tensors.items():
        raw, y = lr.cachegen(x.float().numpy(), "BF16", 32)
        assert raw == codes[name], name
        assert torch.equal(torch.from_numpy(lr.round_to(y, "BF16")).to(torch.bfloat16).view(torch.int16), back[name].view(torch.int16)), name


@pytest.mark.parametrize("case", [c for c in CASES if c["spec"] in ("lmcache:fp8", "lmcache:kivi") and "error" not in c],
                         ids=lambda c: c["name"])
def test_fp8_and_kivi_vectors_are_lmcaches_own_bytes(case):
    """lmcache:fp8 is the fp8 serde's own cast on this torch (2.13: saturating at 448) and its read back;
    lmcache:kivi is the kivi serde, which hands back the object it was given."""
    for name, x in _tensors(case).items():
        t = next(t for t in case["tensors"] if t["name"] == name)
        if case["spec"] == "lmcache:kivi":
            obj = lh.kivi(x)
            assert obj.tensor is x and _bits(x).hex() == t["parts"][".codes"] == t["restored_hex"]
            continue
        raw, back = lh.fp8(x)
        assert raw.hex() == t["parts"][".codes"], name
        assert _bits(back).hex() == t["restored_hex"], name
        assert t["saturated"] == int((x.float().abs() > 448).sum())


def test_fp8_cast_saturates_on_this_torch():
    """torch 2.13's float8_e4m3fn cast, which the fp8 serde is: past 448 (and Inf) saturates to 448, NaN is
    0x7f with its sign (kv-compress refuses NaN and Inf caches before they reach it)."""
    x = torch.tensor([448, 464, 465, 480, 500, 1e30, float("inf"), -float("inf"), float("nan"), -float("nan")])
    raw, _ = lh.fp8(x)
    assert raw.hex() == "7e7e7e7e7e7e7efe7fff"


def test_known_stream_is_lmcaches():
    """The Go test's known stream (lmcache_test.go, TestCacheGenKnownStream): calculate_cdf and
    _encode_single_channel on 8 symbols."""
    k = lh.modules()["v1/platform/torch_ops/cachegen_kernels.py"]
    syms = np.array([15, 15, 16, 14, 15, 30, 0, 15], np.uint8)
    cdf = k.calculate_cdf(torch.from_numpy(syms.astype(np.int8)).reshape(1, -1, 1), 32)[0, 0].numpy().view(np.uint16)
    buf = np.zeros(256, np.uint8)
    n = k._encode_single_channel(cdf.astype(np.uint32), syms, buf)
    assert buf[:n].tobytes().hex() == "91a800"
    assert cdf.tolist() == lr.cdf(syms).tolist()
    assert cdf.tolist()[14:18] == [8201, 16390, 49143, 57332]


@pytest.mark.parametrize("layers", [1, 2, 9, 10, 11, 32, 40])
def test_bins_are_cachegen_configs(layers, cli, tmp_path):
    """The bins the CLI records per tensor are CacheGenConfig's (LMCache's make_key_bins and
    make_value_bins) for a model of that many layers; the named 7B and 9B entries follow the same rule."""
    m = lh.modules()["v1/storage_backend/naive_serde/cachegen_encoder.py"]
    basics = lh.modules()["v1/storage_backend/naive_serde/cachegen_basics.py"]
    basics.AutoConfig = lh._Namespace(from_pretrained=lambda name: lh._Namespace(num_hidden_layers=layers))
    ser = m.CacheGenSerializer(lh._Namespace(chunk_size=256), lh._Namespace(model_name="kvlib/test", kv_shape=(layers, 2, 256, 1, 2)))
    want = {"key": ser.key_bins.int().tolist(), "value": ser.value_bins.int().tolist()}
    named = {32: "mistralai/Mistral-7B-Instruct-v0.2", 40: "THUDM/glm-4-9b-chat"}.get(layers)
    if named:
        s = m.CacheGenSerializer(lh._Namespace(chunk_size=256), lh._Namespace(model_name=named, kv_shape=(layers, 2, 256, 1, 2)))
        assert s.key_bins.int().tolist() == want["key"] and s.value_bins.int().tolist() == want["value"]
    tensors = [dict(name=f"layer_{i}_{r}", dtype="F32", shape=[1, 1, 1, 2], input_hex=np.array([1, -2], "<f4").tobytes().hex())
               for i in range(layers) for r in ("key", "value")]
    src, kvq = tmp_path / "in.safetensors", tmp_path / "in.kvq"
    write_inputs(src, tensors)
    proc = subprocess.run([cli, "compress", "-input", str(src), "-output", str(kvq), "-scheme", "lmcache:cachegen"],
                          capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr
    got = {t["name"]: t["bins"] for t in json.loads(proc.stdout)["tensors"]}
    for i in range(layers):
        for r in ("key", "value"):
            assert got[f"layer_{i}_{r}"] == want[r][i] == lr.bins(i, r, layers), (i, r)


def test_lmcache_is_listed_and_spelled(cli):
    rows = json.loads(subprocess.run([cli, "schemes", "-engine", "lmcache"], capture_output=True, text=True, check=True).stdout)
    assert [r["format"] for r in rows] == list(lr.FORMATS)
    assert all(r["engine_version"] == lr.VERSION and r["evidence"] == "executed" for r in rows)
    assert rows[0]["flags"].startswith("lmcache server --l2-adapter") and '"serde": {"type": "fp8"}' in rows[0]["flags"]
    assert rows[2]["flags"].startswith("remote_serde: cachegen")
    assert [r["key_bits_per_element"] for r in rows[:2]] == [8, 16]
    for spec, msg in (("lmcache:asym_k16_v8", "lmcache:asym_k16_v8 is not registered in LMCache 0.5.6"),
                      ("lmcache:cachegen+lossless", "it takes no +lossless"),
                      ("lmcache:naive", 'lmcache has no KV-cache format "naive" (its formats: fp8, kivi, cachegen)')):
        proc = subprocess.run([cli, "check", "-scheme", spec], capture_output=True, text=True)
        assert proc.returncode == 2 and msg in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    from kvlib.codec.spec import resolve_codec

    assert resolve_codec("lmcache:cachegen").spec == "lmcache:cachegen"
    assert resolve_codec("k=lmcache:cachegen,v=lmcache:fp8").spec == "k=lmcache:cachegen,v=lmcache:fp8"

"""kvlib.codec.cli: the real CLI, every error path, and exact pooling."""

from __future__ import annotations

import math
import subprocess

import pytest
import torch

from kvlib.codec import metrics as codec_metrics
from kvlib.codec import binary as codec_binary
from kvlib.codec import cli as codec_cli
from kvlib.transforms import codec as transforms_codec
from kvlib.cache.io import save_kv_cache
from kvlib.cache.layout import make_cache


def _cache(seed: int, layers: int = 3, seq: int = 40, scale: float = 0.5):
    g = torch.Generator().manual_seed(seed)
    return make_cache([(torch.randn(1, 4, seq, 64, generator=g) * scale, torch.randn(1, 4, seq, 64, generator=g) * scale)
                       for _ in range(layers)])


@pytest.fixture
def kv_file(tmp_path):
    p = tmp_path / "kv.safetensors"
    save_kv_cache(_cache(0), p)
    return p


def test_compress_decompress_roundtrip_metrics(kv_file, tmp_path, cli):
    m = codec_cli.compress_kv_cache(kv_file, tmp_path / "kv.kvq.safetensors", group_size=64)
    assert m.command == "compress" and m.passed and m.violations == []
    assert m.compression_ratio == pytest.approx(16 / 4.25)
    assert m.original_size_bytes == 2 * 3 * 2 * 4 * 40 * 64
    # The packed file is within 1 % of the theoretical 4 + 16/64 bits per element.
    size = (tmp_path / "kv.kvq.safetensors").stat().st_size
    assert m.compressed_file_bytes == size
    theory = m.num_elements * 4.25 / 8
    assert abs(m.compressed_size_bytes - theory) / theory < 1e-9
    assert len(m.tensors) == 6 and len(m.tensors[0]["head_snr_db"]) == 4
    d = codec_cli.decompress_kv_cache(tmp_path / "kv.kvq.safetensors", tmp_path / "a.safetensors")
    assert d.command == "decompress" and math.isnan(d.rmse)
    r = codec_cli.roundtrip_kv_cache(kv_file, tmp_path / "b.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert r.rmse == m.rmse
    g = codec_cli.get_compression_metrics(kv_file, group_size=32, bits=8)
    assert g.group_size == 32 and g.bits == 8 and g.rmse < m.rmse


def test_from_dict_leaves_the_callers_json_alone():
    d = {"compression_ratio": 1.0, "original_size_bytes": 2, "compressed_size_bytes": 2, "passed": True,
         "violations": [], "rmse": 0, "snr_db": None, "tensors": [{"name": "t", "snr_db": None, "head_snr_db": [None]}]}
    m = codec_metrics.CompressionMetrics.from_dict(d)
    assert m.snr_db == math.inf and m.tensors[0]["head_snr_db"] == [math.inf]
    assert d["tensors"][0]["snr_db"] is None and d["tensors"][0]["head_snr_db"] == [None]


def test_quality_failure_returns_metrics(kv_file, tmp_path):
    m = codec_cli.compress_kv_cache(kv_file, tmp_path / "x.safetensors", bits=2)  # exit 1: gates failed
    assert not m.passed and m.violations and (tmp_path / "x.safetensors").exists()


def test_cli_error_raises_called_process_error_with_stderr(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 3)
    with pytest.raises(subprocess.CalledProcessError) as e:
        codec_cli.compress_kv_cache(bad, tmp_path / "out.safetensors")
    assert e.value.returncode == 2 and "bad.safetensors" in e.value.stderr and "truncated" in e.value.stderr
    assert not (tmp_path / "out.safetensors").exists()


def test_invalid_json_is_value_error(tmp_path, monkeypatch, kv_file):
    fake = tmp_path / "kv-compress"
    fake.write_text("#!/bin/sh\necho 'not json'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("KV_COMPRESS_PATH", str(fake))
    with pytest.raises(ValueError, match="Invalid JSON from CLI"):
        codec_cli.get_compression_metrics(kv_file)
    fake.write_text("#!/bin/sh\necho '{\"rmse\": 1}'\n")
    with pytest.raises(ValueError, match="lacks field"):
        codec_cli.get_compression_metrics(kv_file)


def test_find_cli_binary_order_and_errors(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("KV_COMPRESS_PATH", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="make build-compress"):
        codec_binary.find_cli_binary()
    assert not codec_binary.check_cli_available()
    monkeypatch.delenv("KV_COMPRESS_PATH")
    assert codec_binary.find_cli_binary() == cli
    monkeypatch.setattr(codec_binary, "_REPO_ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="make build-compress"):
        codec_binary.find_cli_binary()
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "kv-compress"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert codec_binary.find_cli_binary() == str(exe)


def test_pool_metrics_is_exact(tmp_path):
    """Pooling two runs equals one run over all their elements."""
    a, b = _cache(1, seq=30), _cache(2, seq=50, scale=2.0)
    save_kv_cache(a, tmp_path / "a.safetensors")
    save_kv_cache(b, tmp_path / "b.safetensors")
    ma = codec_cli.get_compression_metrics(tmp_path / "a.safetensors")
    mb = codec_cli.get_compression_metrics(tmp_path / "b.safetensors")
    # One file holding both caches' tensors: b's layers renumbered after a's.
    from kvlib.cache.layout import cache_layers

    save_kv_cache(make_cache(cache_layers(a) + cache_layers(b)), tmp_path / "ab.safetensors")
    mab = codec_cli.get_compression_metrics(tmp_path / "ab.safetensors")
    pooled = codec_metrics.pool_metrics([ma, mb])
    for k in ("rmse", "snr_db", "cosine_similarity", "max_error"):
        assert getattr(pooled, k) == pytest.approx(getattr(mab, k), rel=1e-12), k
    assert pooled.compressed_size_bytes == mab.compressed_size_bytes and pooled.num_elements == mab.num_elements
    t0 = pooled.tensors[0]
    assert t0["num_elements"] == ma.tensors[0]["num_elements"] + mb.tensors[0]["num_elements"]
    assert sum(t0["error_histogram"]) == t0["num_elements"]
    assert len(t0["head_snr_db"]) == 4
    assert pooled.quality_level == mab.quality_level and pooled.violations == mab.violations


def test_pool_tensors_by_kind(kv_file):
    m = codec_cli.get_compression_metrics(kv_file)
    everything = codec_metrics.pool_tensors(m.tensors, "")
    assert everything["rmse"] == pytest.approx(m.rmse, rel=1e-12) and everything["snr_db"] == pytest.approx(m.snr_db, rel=1e-12)
    keys, values = codec_metrics.pool_tensors(m.tensors, "_key"), codec_metrics.pool_tensors(m.tensors, "_value")
    assert keys["num_elements"] + values["num_elements"] == m.num_elements
    assert min(keys["rmse"], values["rmse"]) <= m.rmse <= max(keys["rmse"], values["rmse"])
    assert codec_metrics.pool_tensors(m.tensors, "_nothing") == {}


def test_cache_roundtrip_transform(tmp_path):
    kv = _cache(3)
    codec = transforms_codec.CLICacheRoundtrip(tmp_path, model_name="t")
    restored, m = codec(kv)
    from kvlib.cache.layout import cache_layers

    k, k2 = cache_layers(kv)[0][0], cache_layers(restored)[0][0]
    assert k2.shape == k.shape and k2.dtype == k.dtype and not torch.equal(k, k2)
    err = torch.cat([(b - a).reshape(-1) for (a, _), (b, _) in zip(cache_layers(kv), cache_layers(restored))])
    assert codec.calls == 1 and all(v > 0 for v in codec.seconds.values()) and m.num_tensors == 6
    assert float((torch.cat([t.reshape(-1) for kv_ in cache_layers(restored) for t in kv_]) -
                  torch.cat([t.reshape(-1) for kv_ in cache_layers(kv) for t in kv_])).pow(2).mean().sqrt()) == pytest.approx(m.rmse, rel=1e-6)
    assert err.abs().max() > 0


def test_print_metrics_report(kv_file, capsys):
    codec_metrics.print_metrics_report(codec_cli.get_compression_metrics(kv_file), "T")
    out = capsys.readouterr().out
    assert "Compression ratio:   3.765x" in out and "Quality gates:       PASSED" in out

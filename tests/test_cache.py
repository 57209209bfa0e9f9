"""kvlib.cache on a tiny random Llama with TinyLlama's KV geometry."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache

from kvlib.cache import layout as cache_layout
from kvlib.cache import io as cache_io


@pytest.fixture(scope="module")
def extracted(tiny_llama, tiny_tokenizer):
    return cache_io.extract_kv_cache(tiny_llama, tiny_tokenizer, "the cat of the house was in a box " * 3, device="cpu")


def test_extract_has_tinyllama_kv_geometry(extracted, tiny_llama):
    kv, meta = extracted
    assert isinstance(kv, DynamicCache)
    assert (meta.num_layers, meta.num_kv_heads, meta.head_dim) == (22, 4, 64)
    assert meta.seq_len == 27 and meta.dtype == "float32"
    k, v = cache_layout.cache_layers(kv)[0]
    assert k.shape == v.shape == (1, 4, 27, 64)  # KV heads (GQA), not the 8 query heads
    ok, errors = cache_io.validate_kv_cache_shape(kv, **cache_io.expected_geometry(tiny_llama.config))
    assert ok, errors
    assert cache_io.validate_kv_cache_shape(kv) == (True, [])  # TinyLlama constants are the defaults


def test_extract_respects_max_length(tiny_llama, tiny_tokenizer):
    _, meta = cache_io.extract_kv_cache(tiny_llama, tiny_tokenizer, "the a of " * 20, max_length=10, device="cpu")
    assert meta.seq_len == 10


def test_extract_rejects_empty_prompt(tiny_llama, tiny_tokenizer):
    with pytest.raises(ValueError, match="zero tokens"):
        cache_io.extract_kv_cache(tiny_llama, tiny_tokenizer, "", device="cpu")


def test_validate_reports_each_problem(extracted):
    kv, _ = extracted
    ok, errors = cache_io.validate_kv_cache_shape(kv, expected_layers=30, expected_kv_heads=32, expected_head_dim=128)
    assert not ok
    assert any("expected 30 layers, got 22" in e for e in errors)
    assert any("4 KV heads, expected 32" in e for e in errors)
    assert any("head_dim 64, expected 128" in e for e in errors)
    mha = cache_layout.make_cache([(torch.zeros(1, 8, 3, 64), torch.zeros(1, 8, 3, 64))] * 22)
    ok, errors = cache_io.validate_kv_cache_shape(mha)
    assert not ok and "query heads instead of KV heads" in errors[0]


def test_save_load_round_trip(extracted, tmp_path):
    kv, meta = extracted
    p = tmp_path / "kv.safetensors"
    saved = cache_io.save_kv_cache(kv, p, model_name="tiny")
    assert saved.model_name == "tiny" and json.loads((tmp_path / "kv.safetensors.metadata.json").read_text())["num_layers"] == 22
    back, meta2 = cache_io.load_kv_cache(p)
    assert meta2 == saved
    for (k, v), (k2, v2) in zip(cache_layout.cache_layers(kv), cache_layout.cache_layers(back)):
        assert torch.equal(k, k2) and torch.equal(v, v2)
    assert [f.name for f in tmp_path.iterdir() if ".tmp-" in f.name] == []


def test_bfloat16_is_saved_as_float32(tmp_path):
    kv = cache_layout.make_cache([(torch.randn(1, 4, 5, 64).bfloat16(), torch.randn(1, 4, 5, 64).bfloat16())])
    meta = cache_io.save_kv_cache(kv, tmp_path / "bf.safetensors")
    back, _ = cache_io.load_kv_cache(tmp_path / "bf.safetensors")
    k = cache_layout.cache_layers(back)[0][0]
    assert meta.dtype == "float32" and k.dtype == torch.float32
    assert torch.equal(k, cache_layout.cache_layers(kv)[0][0].float())


def test_batch_and_empty_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="batch size must be 1"):
        cache_io.save_kv_cache(cache_layout.make_cache([(torch.zeros(2, 4, 3, 64), torch.zeros(2, 4, 3, 64))]), tmp_path / "b.safetensors")
    with pytest.raises(ValueError, match="empty"):
        cache_io.save_kv_cache(DynamicCache(), tmp_path / "e.safetensors")
    assert not (tmp_path / "b.safetensors").exists()


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        cache_io.load_kv_cache(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(ValueError, match="bad.safetensors"):
        cache_io.load_kv_cache(bad)
    from safetensors.torch import save_file

    save_file({"weights": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="no layer_0_key"):
        cache_io.load_kv_cache(tmp_path / "other.safetensors")


def test_stats(extracted):
    kv, _ = extracted
    s = cache_io.compute_kv_cache_stats(kv)
    assert s["total_elements"] == 22 * 2 * 4 * 27 * 64
    assert s["total_bytes"] == 4 * s["total_elements"] and s["value_min"] <= s["value_mean"] <= s["value_max"]
    assert s["num_kv_heads"] == 4 and s["value_std"] > 0


def test_metadata_dict_round_trip():
    m = cache_io.KVCacheMetadata(22, 4, 10, 64, "float32", "x")
    assert cache_io.KVCacheMetadata.from_dict(m.to_dict()) == m

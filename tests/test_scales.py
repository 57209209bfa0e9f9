"""Static scales of the engines' per-tensor formats (kvlib.budget.scales): scale 1 (the flag alone)
beside scales calibrated as amax / format max per layer and role on windows never evaluated; the
amax table is a results-store unit; what each scale source clamps is reported per layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvlib.budget.scales import CALIBRATED, calibrated, kv_amax, takes_scales
from kvlib.cache.layout import cache_layers
from kvlib.codec.spec import resolve_codec
from kvlib.runs.sweep import run_sweep


def test_which_codecs_take_scales():
    assert takes_scales(resolve_codec("vllm:fp8")) and takes_scales(resolve_codec("k=vllm:fp8_e5m2,v=int4"))
    assert not any(takes_scales(resolve_codec(s)) for s in ("int4", "vllm:int8_per_token_head", "llama.cpp:q8_0",
                                                            "vllm:fp8,kv0=none"))


def test_calibrated_scales_are_amax_over_the_format_max(tiny_llama, cli):
    ids = torch.randint(0, 64, (1, 200), generator=torch.Generator().manual_seed(1))
    amax = kv_amax(tiny_llama, ids, [0, 100], 100)
    with torch.no_grad():
        caches = [cache_layers(tiny_llama(input_ids=ids[:, s:s + 100], use_cache=True).past_key_values) for s in (0, 100)]
    want = [(max(float(c[i][0].abs().max()) for c in caches), max(float(c[i][1].abs().max()) for c in caches))
            for i in range(len(caches[0]))]
    assert amax == want
    c = calibrated(resolve_codec("k=vllm:fp8_e4m3,v=vllm:fp8_e5m2"), amax)
    for i, (k, v) in enumerate(amax):
        layer = c.for_layer(i)
        assert layer.key.scale == float(np.float32(np.float32(k) / np.float32(448)))
        assert layer.value.scale == float(np.float32(np.float32(v) / np.float32(57344)))
    assert resolve_codec(c.spec) == c and c.for_layer(0).layers == ()
    # TensorRT-LLM keeps one scale per layer for K and V: the larger amax, for both roles
    t = calibrated(resolve_codec("trtllm:int8"), amax)
    for i, (k, v) in enumerate(amax):
        layer = t.for_layer(i)
        assert layer.key.scale == layer.value.scale == float(np.float32(np.float32(max(k, v)) / np.float32(127)))


def test_a_sweep_validates_both_scale_sources_and_reuses_the_amax(tiny_dir, tmp_path, monkeypatch):
    kw = dict(model=str(tiny_dir / "model"), corpus_name=str(tiny_dir / "corpus.txt"), device="cpu", stride=64,
              max_windows=2, context_length=128, peers=False, verbose=False, results=tmp_path / "store",
              calibration="windows=1", mode="write", calibrate_scales=True)
    first = run_sweep(["vllm:fp8_e4m3", "vllm:int8_per_token_head"], **kw)
    names = {s.name: s for s in first.schemes}
    assert set(names) == {"vllm:fp8_e4m3", "vllm:int8_per_token_head", "vllm:fp8_e4m3" + CALIBRATED}
    cal = names["vllm:fp8_e4m3" + CALIBRATED]
    assert "k0=vllm:fp8_e4m3/scale" in cal.spec and len(cal.layer_key_saturated) == 22
    assert names["vllm:fp8_e4m3"].layer_key_saturated == [0] * 22  # a random tiny model's keys stay within 448
    table = first.engines["vllm"]  # the engine's menu as the engine names it, with the flags to pass
    assert table["mode"] == "write" and [r["option"] for r in table["rows"]] == [s.name for s in first.schemes]
    flags = {r["option"]: r["flags"] for r in table["rows"]}
    assert flags["vllm:int8_per_token_head"] == "--kv-cache-dtype int8_per_token_head"
    assert flags["vllm:fp8_e4m3" + CALIBRATED] == flags["vllm:fp8_e4m3"] == "--kv-cache-dtype fp8_e4m3"
    scales = {r["option"]: r["scales"] for r in table["rows"]}
    assert scales["vllm:fp8_e4m3" + CALIBRATED].startswith("calibrated") and scales["vllm:fp8_e4m3"].startswith("1.0")
    assert scales["vllm:int8_per_token_head"] == ""
    assert table["cheapest"] in flags or table["cheapest"] is None
    from kvlib.models import sources

    monkeypatch.setattr(sources, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("loaded the model"))
    again = run_sweep(["vllm:fp8_e4m3", "vllm:int8_per_token_head"], **kw)  # amax and units from the store
    assert [(s.name, s.context_delta) for s in again.schemes] == [(s.name, s.context_delta) for s in first.schemes]

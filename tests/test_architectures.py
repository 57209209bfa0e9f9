"""Every cache layout transformers gives a decoder-only LM, on tiny random-weight
models built from configs (no download): full attention, sliding-window and mixed
sliding/global layers, MQA, GQA and MHA, attention biases, head_dim 64/128/256.

Each runs the whole path: the context cache cut out of the baseline forward in the
model's own layout, a kv-compress round trip through the real CLI, and the
exact-cache identity (the context/suffix split with the exact cache reproduces the
baseline NLL). Caches that are not key/value tensors fail with one line, before
any window runs."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from kvlib import cli
from kvlib.transforms.codec import CLICacheRoundtrip
from kvlib.cache.io import load_kv_cache, save_kv_cache
from kvlib.cache.layout import cache_layers
from kvlib.scoring.generate import greedy_continue, prefill, prefill_observed, stack_caches
from kvlib.transforms.base import CacheTransform
from kvlib.cache.layout import FULL, cache_like, context_cache, layout_of, model_layout, new_cache
from kvlib.scoring.perplexity import score_windows

WINDOW = 32  # sliding window of the sliding models: far shorter than a context
BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
SLIDING4 = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]

ARCHS = {
    "llama": ("llama", dict(head_dim=64)),  # GQA 2:1, head_dim 64
    "qwen2": ("qwen2", dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1)),  # biases, head_dim 128
    "gemma3": ("gemma3_text", dict(head_dim=256, num_key_value_heads=1, sliding_window=WINDOW,
                                   layer_types=SLIDING4)),  # sliding + global, MQA, head_dim 256
    "mistral": ("mistral", dict(sliding_window=WINDOW)),  # every layer sliding
    "phi3": ("phi3", dict(sliding_window=WINDOW)),
    "gpt2": ("gpt2", dict(hidden_size=256, num_hidden_layers=3, n_positions=512)),  # MHA, fused qkv with biases
    "gpt_bigcode": ("gpt_bigcode", dict(hidden_size=256, num_hidden_layers=3, n_positions=512, multi_query=True)),  # MQA
}


def tiny_model(arch: str):
    model_type, kw = ARCHS[arch]
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **{**BASE, **kw})
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=list(ARCHS))
def tiny(request):
    return request.param, tiny_model(request.param)


def token_ids(n: int = 400, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, BASE["vocab_size"], (1, n), generator=g)


def exact(cache):
    """The identity transform: the same tensors (copied) in the same layout."""
    return cache_like(cache, [(k.clone(), v.clone()) for k, v in cache_layers(cache)]), None


def test_exact_cache_identity(tiny):
    """The context/suffix split with the exact cache reproduces every window's baseline NLL."""
    _, model = tiny
    res = score_windows(model, token_ids(), 160, 64, {"exact": exact}, progress=False)["exact"]
    ctx = [w for w in res.windows if w.compressed]
    assert len(ctx) >= 3 and all(w.context_tokens > WINDOW for w in ctx)
    for w in ctx:
        assert w.compressed_nll == pytest.approx(w.baseline_nll, rel=1e-4)
        assert w.top1_agree == w.num_targets


class ExactQueries(CacheTransform):
    """Write mode through kvlib's own attention (the query path) with nothing converted."""

    name, spec = "exact-queries", "exact-queries"
    converts_queries = True

    def roundtrip_layer(self, layer, key, value):
        return key, value, None

    def query_layer(self, layer, query):
        return query


def test_kvlibs_attention_keeps_the_models_masks(tiny):
    """Write mode's query path and the observed prefill run kvlib's own attention: a sliding layer
    still sees only its window (transformers builds no mask for an attention name its mask table
    lacks; Gemma-3 written through llama.cpp:f16 went from perplexity 27 to 1,455 that way)."""
    _, model = tiny
    r = score_windows(model, token_ids(), 160, 64, {"q": ExactQueries()}, max_windows=3, progress=False,
                      mode="write")["q"]
    for w in r.windows:
        assert w.compressed_nll == pytest.approx(w.baseline_nll, rel=1e-5)
    ids = token_ids(120)[0].tolist()
    observed, queries = prefill_observed(model, ids, 8)
    for (k, v), (ke, ve) in zip(cache_layers(observed), cache_layers(prefill(model, ids))):
        torch.testing.assert_close(k, ke)
        torch.testing.assert_close(v, ve)
    assert len(queries) == model.config.num_hidden_layers and queries[0].shape[2] == 8


def test_context_cache_holds_what_the_model_holds(tiny):
    """Cut out of one recorded pass, the context cache equals the cache of the context run alone."""
    _, model = tiny
    ids, n = token_ids(120), 90
    with torch.no_grad():
        full = model(input_ids=ids, past_key_values=new_cache(model, record_past=True), use_cache=True).past_key_values
        alone = model(input_ids=ids[:, :n], past_key_values=new_cache(model), use_cache=True).past_key_values
    cut = context_cache(full, n)
    assert layout_of(cut) == layout_of(alone)
    for (k, v), (ka, va) in zip(cache_layers(cut), cache_layers(alone)):
        assert k.shape == ka.shape and v.shape == va.shape
        torch.testing.assert_close(k, ka, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v, va, rtol=1e-4, atol=1e-5)


def test_codec_round_trip_through_the_cli(tiny, tmp_path):
    """q8_0 through kv-compress: the codec sees exactly what each layer stores, and barely moves the NLL."""
    arch, model = tiny
    t = CLICacheRoundtrip(tmp_path, "q8_0", arch)
    seen = []

    def through_cli(cache):
        seen.append(layout_of(cache))
        restored, m = t(cache)
        assert layout_of(restored) == layout_of(cache)
        stored = sum(k.numel() + v.numel() for k, v in cache_layers(cache))
        assert m.num_elements == stored  # sliding layers count their window, not the context
        return restored, m

    res = score_windows(model, token_ids(), 160, 64, {"q8_0": through_cli}, progress=False)["q8_0"]
    assert seen and t.calls == len(seen)
    assert abs(res.context_delta) < 0.05 * res.context_baseline_perplexity
    windows = model_layout(model).windows
    if any(w != FULL for w in windows):  # sliding layers stored window - 1 tokens, global ones the whole context
        for lay in seen:
            assert [lay.stored(i) for i in range(len(windows))] == [
                lay.seen if w == FULL else WINDOW - 1 for w in windows]


def test_saved_file_records_the_layout(tiny, tmp_path):
    _, model = tiny
    with torch.no_grad():
        cache = model(input_ids=token_ids(80), past_key_values=new_cache(model), use_cache=True).past_key_values
    meta = save_kv_cache(cache, tmp_path / "c.safetensors", model_name="tiny")
    back, meta2 = load_kv_cache(tmp_path / "c.safetensors")
    assert meta2 == meta and meta.seq_len == 80
    assert layout_of(back) == layout_of(cache)
    for (k, v), (k2, v2) in zip(cache_layers(cache), cache_layers(back)):
        assert torch.equal(k, k2) and torch.equal(v, v2)


def test_decoding_batches_keep_the_layout(tiny):
    """Greedy decoding from a stacked batch of caches longer than the sliding window equals decoding each alone."""
    _, model = tiny
    prompts = [token_ids(70, seed=s)[0].tolist() for s in (3, 4)]
    caches = [prefill(model, p[:-1]) for p in prompts]
    last = torch.tensor([[p[-1]] for p in prompts])
    both = greedy_continue(model, stack_caches(caches), last, 4)
    for i, c in enumerate(caches):
        assert layout_of(stack_caches([c])) == layout_of(c)
        assert both[i].tolist() == greedy_continue(model, stack_caches([c]), last[i:i + 1], 4)[0].tolist()
    roomy = stack_caches(caches, reserve=4)  # full layers append in place, sliding ones keep their window
    assert layout_of(roomy) == layout_of(stack_caches(caches))
    assert torch.equal(greedy_continue(model, roomy, last, 4), both)


@pytest.mark.parametrize("model_type,kw,layer", [
    ("mamba", dict(num_hidden_layers=2, hidden_size=32, state_size=4, vocab_size=64), "LinearAttentionLayer"),
    ("qwen3_next", dict(vocab_size=64, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=64), "LinearAttentionLayer"),
])
def test_caches_that_are_not_key_value_fail_in_one_line(model_type, kw, layer):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kw))
    with pytest.raises(ValueError, match=layer) as e:
        model_layout(model)
    assert "\n" not in str(e.value)


def test_encoder_decoder_fails_in_one_line():
    class T5Like:
        config = AutoConfig.for_model("t5", num_layers=1, d_model=32, d_kv=8, d_ff=32, num_heads=4)

    with pytest.raises(ValueError, match="encoder-decoder"):
        model_layout(T5Like())


def word_corpus(path, n: int, seed: int):
    """A text file of ``n`` random words of the tiny tokenizer's vocabulary (one token each)."""
    words = "the a of and to in is was it for on that with as by at from his her an be this are which".split()
    g = torch.Generator().manual_seed(seed)
    path.write_text(" ".join(words[i] for i in torch.randint(0, len(words), (n,), generator=g).tolist()))
    return path


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory, tiny_tokenizer):
    """A tiny Gemma-3 (sliding + global layers) saved as a Hugging Face directory, with a real tokenizer."""
    d = tmp_path_factory.mktemp("tiny-gemma3")
    model_type, kw = ARCHS["gemma3"]
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **{**BASE, **kw, "vocab_size": len(tiny_tokenizer)})
    AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    tiny_tokenizer.save_pretrained(d)
    return d


def test_kv_validate_on_a_sliding_window_model_directory(gemma_dir, tmp_path, capsys):
    """kv-validate --model DIR on a sliding/global model runs to a verdict through the real CLI."""
    corpus = word_corpus(tmp_path / "corpus.txt", 900, seed=0)
    out = tmp_path / "sweep.json"
    rc = cli.main(["--model", str(gemma_dir), "--schemes", "q8_0,int4", "--corpus", str(corpus), "--max-windows", "3",
                   "--context-length", "160", "--stride", "64", "--no-peers", "--quiet", "--json", str(out)])
    assert rc in (0, 1), capsys.readouterr().err
    r = json.loads(out.read_text())
    assert r["kv_geometry"]["layer_windows"] == [WINDOW, WINDOW, 0, WINDOW]
    assert r["kv_geometry"]["layers"] == "3 sliding (window 32) + 1 full-attention layers"
    by = {s["name"]: s for s in r["schemes"]}
    assert set(by) == {"q8_0", "int4"} and all(math.isfinite(s["context_delta"]) for s in by.values())
    assert abs(by["q8_0"]["context_delta"]) < 0.05 * r["context_baseline_perplexity"]


def test_kv_validate_one_scheme_on_a_sliding_window_model(gemma_dir, tmp_path):
    """The single-scheme path (sample round trip, shape checks against the layout, the verdict)."""
    corpus = word_corpus(tmp_path / "corpus.txt", 700, seed=1)
    out = tmp_path / "one.json"
    rc = cli.main(["--model", str(gemma_dir), "--scheme", "q8_0", "--corpus", str(corpus), "--max-windows", "2",
                   "--context-length", "160", "--stride", "64", "--quiet", "--json", str(out)])
    r = json.loads(out.read_text())
    assert rc == (0 if r["passed"] else 1)
    assert r["kv_geometry"]["layer_windows"] == [WINDOW, WINDOW, 0, WINDOW]
    stored = r["compression"]["num_elements"]
    ctx = [w["context_tokens"] for w in r["window_nlls"] if w["compressed"]]
    g_ = r["kv_geometry"]
    per_token = 2 * g_["num_kv_heads"] * g_["head_dim"]
    assert stored == sum(per_token * (n + 3 * (WINDOW - 1)) for n in ctx)  # 1 global layer, 3 sliding

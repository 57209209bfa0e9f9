"""Sliding windows and the exact/compressed perplexity."""

from __future__ import annotations

import math

import pytest
import torch

from kvlib.cache.layout import cache_layers, make_cache
from kvlib.scoring.perplexity import evaluate_windows, plan_windows


def hf_recipe_windows(n, max_length, stride):
    """The Hugging Face perplexity guide's loop, transcribed: (begin, end, trg_len)."""
    out, prev_end = [], 0
    for begin in range(0, n, stride):
        end = min(begin + max_length, n)
        out.append((begin, end, end - prev_end))
        prev_end = end
        if end == n:
            break
    return out


@pytest.mark.parametrize("n,L,S", [(5000, 2048, 512), (2048, 2048, 512), (100, 2048, 512), (1000, 256, 256), (777, 64, 17)])
def test_plan_matches_hf_recipe(n, L, S):
    plan = plan_windows(n, L, S)
    ref = hf_recipe_windows(n, L, S)
    assert [(w.begin, w.end) for w in plan] == [(b, e) for b, e, _ in ref]
    for w, (_, _, trg) in zip(plan, ref):
        assert w.num_targets == min(trg, w.length - 1)
    # Every token but the first is scored exactly once.
    assert sum(w.num_targets for w in plan) == n - 1 if S < L else True
    assert plan[0].context_tokens == 0


def test_plan_limits_and_errors():
    assert len(plan_windows(10_000, 2048, 512, max_windows=3)) == 3
    with pytest.raises(ValueError):
        plan_windows(100, 64, 128)
    with pytest.raises(ValueError):
        plan_windows(1, 64, 32)


def hf_recipe_ppl(model, ids, L, S):
    """The guide's perplexity via model(labels=...).loss, each window weighted by the targets its loss averages."""
    nll, count = 0.0, 0
    for begin, end, trg in hf_recipe_windows(ids.shape[1], L, S):
        x = ids[:, begin:end]
        labels = x.clone()
        labels[:, :-trg] = -100
        with torch.no_grad():
            loss = model(x, labels=labels).loss
        n = int((labels[:, 1:] != -100).sum())
        nll += float(loss) * n
        count += n
    return math.exp(nll / count)


def test_baseline_equals_hf_recipe_and_identity_split(tiny_llama):
    ids = torch.randint(0, 64, (1, 700), generator=torch.Generator().manual_seed(1))
    res = evaluate_windows(tiny_llama, ids, 256, 128, transform=lambda c: (c, None), progress=False)
    assert res.baseline_perplexity == pytest.approx(hf_recipe_ppl(tiny_llama, ids, 256, 128), rel=1e-5)
    assert res.compressed_perplexity == pytest.approx(res.baseline_perplexity, rel=1e-4)
    assert res.scored_tokens == 699 and res.num_windows == 5
    assert res.windows[0].compressed is False and all(w.compressed for w in res.windows[1:])


def test_a_damaged_cache_changes_perplexity(tiny_llama):
    """The compressed path really attends to the transformed cache."""
    ids = torch.randint(0, 64, (1, 400), generator=torch.Generator().manual_seed(2))

    def scramble(cache):
        return make_cache([(torch.randn_like(k) * 5, torch.randn_like(v) * 5) for k, v in cache_layers(cache)]), None

    res = evaluate_windows(tiny_llama, ids, 128, 64, transform=scramble, progress=False)
    assert abs(res.context_delta) > 1e-3 * res.context_baseline_perplexity


def test_embedded_model_through_the_real_cli(embedded, tmp_path, cli):
    """Integration: SmolLM2 on real WikiText-2 text, 3 windows of 256 at stride 128, every context through
    kv-compress."""
    from kvlib.transforms.codec import CLICacheRoundtrip
    from kvlib.models.corpus import load_corpus, tokenize

    model, tok = embedded
    text = load_corpus("wikitext-2-valid")  # shipped with kvlib: no ../shared needed
    ids = tokenize(tok, text)[:, :500]  # windows [0, 256), [128, 384), [256, 500)
    exact = evaluate_windows(model, ids, 256, 128, transform=lambda c: (c, None), max_windows=3, progress=False)
    # Baseline through the prefix split equals the full-window recipe.
    assert abs(exact.compressed_perplexity - exact.baseline_perplexity) / exact.baseline_perplexity < 1e-4
    codec = CLICacheRoundtrip(tmp_path, model_name="smollm2")
    res = evaluate_windows(model, ids, 256, 128, transform=codec, max_windows=3, progress=False)
    assert res.baseline_perplexity == pytest.approx(exact.baseline_perplexity, rel=1e-9)
    assert codec.calls == 2 and len(res.window_metrics) == 2
    assert res.compression.compression_ratio == pytest.approx(16 / 4.25)
    assert res.compression.num_tensors == 60  # 30 layers x K, V
    assert res.compressed_perplexity != res.baseline_perplexity  # INT4 changes something
    assert math.isfinite(res.context_delta) and res.context_scored_tokens == 128 + (500 - 384)
    assert 3 < res.baseline_perplexity < 200


def test_a_special_tokens_spelling_in_the_text_is_text():
    """WikiText-2 spells rare words ``<unk>``: tokenized as its characters (llama-perplexity's
    parse_special false), not as the tokenizer's unknown-token id."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from kvlib.models.corpus import Corpus, tokenize

    chars = "<unk> a"
    vocab = {"<unk>": 0, "<s>": 1, **{c: i + 2 for i, c in enumerate(dict.fromkeys(chars))}}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>")
    text = "a <unk> a"
    assert 0 in tok(text).input_ids  # a tokenizer's default maps the spelling to the control token
    ids = tokenize(tok, Corpus("t", text))[0].tolist()
    assert 0 not in ids and ids == [vocab[c] for c in text]

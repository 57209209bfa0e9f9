"""Beyond perplexity: pass-key prompts (RULER's niah_single_1) are deterministic and put the
needle at the asked depth; the identity transform reproduces the exact cache's answers
and continuations; the codec path is the real CLI, each context saved once."""

from __future__ import annotations

import json

import pytest
import torch

from kvlib.report import decoding as decoding_report
from kvlib.checks.agreement import AgreementConfig, cut_prompts, first_divergence, run_agreement
from kvlib.transforms.codec import CLICacheRoundtrip
from kvlib.cache.layout import cache_layers, make_cache
from kvlib.codec.spec import resolve_codec
from kvlib.checks.decoding import DecodingChecks
from kvlib.scoring.generate import greedy_answers, greedy_continue, prefill, stack_caches, stack_padded
from kvlib.checks.retrieval import RetrievalConfig, build_haystacks, run_retrieval
from kvlib.checks.ruler.tasks import NOISE, TASKS, Environment, at_depth

# The embedded model finds all 6 pass keys (niah_single_1 at a fixed depth) at these lengths.
TINY_R = RetrievalConfig(lengths=(384, 512), depths=(0.0, 0.5, 1.0))
# One haystack per length: a broken cache never finds the key, so it decodes all 128 of RULER's
# answer tokens (about 9 s a haystack here) where a found key stops early.
TINY_B = RetrievalConfig(lengths=TINY_R.lengths, depths=(0.5,))
TINY_A = AgreementConfig(prompts=3, context_tokens=96, new_tokens=6)


def identity(cache):
    return cache, None


def zeroed(cache):
    """A transform that destroys the context: every key and value 0."""
    return make_cache([(torch.zeros_like(k), torch.zeros_like(v)) for k, v in cache_layers(cache)]), None


@pytest.fixture(scope="module")
def smol(embedded):
    return embedded


def test_haystacks_are_deterministic_and_seeded(smol):
    _, tok = smol
    a, b = build_haystacks(tok, TINY_R), build_haystacks(tok, TINY_R)
    assert [h.sample for h in a] == [h.sample for h in b]
    assert len(a) == 6 and len({h.key for h in a}) == 6 and all(len(h.key) == 7 and h.key.isdigit() for h in a)
    c = build_haystacks(tok, RetrievalConfig(lengths=TINY_R.lengths, depths=TINY_R.depths, seed=1))
    assert [h.key for h in c] != [h.key for h in a]
    assert all(h.sample.task == "niah_single_1" and h.sample.metric == "string_match_all" for h in a)


def test_a_pass_key_is_the_ruler_sample_with_its_needle_placed(smol):
    """Same seed and index: the same key and value as the suite's niah_single_1 sample; only the
    needle's line moves (RULER draws it)."""
    _, tok = smol
    drawn = TASKS["niah_single_1"].sample(tok, 1024, 0, 3, Environment())
    placed = at_depth("niah_single_1", 0.5).sample(tok, 1024, 0, 3, Environment())
    assert placed.references == drawn.references and placed.question == drawn.question
    assert len(placed.context) == len(drawn.context)
    with pytest.raises(ValueError, match="no single needle"):
        at_depth("niah_multikey_1", 0.5)
    with pytest.raises(ValueError, match="depth 1.5"):
        at_depth("niah_single_1", 1.5)


@pytest.mark.parametrize("length", [300, 1000, 4096])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.75, 1.0])
def test_the_key_sits_at_the_asked_depth(smol, length, depth):
    _, tok = smol
    s = build_haystacks(tok, RetrievalConfig(lengths=(length,), depths=(depth,)))[0].sample
    text = tok.decode(s.context)
    lines = [x.strip() for x in text.split("afterwards.\n", 1)[1].split("\n") if x.strip()]
    at = [i for i, x in enumerate(lines) if x.startswith("One of the special magic")]
    noise = len(lines) - 1
    assert len(at) == 1 and all(x == NOISE for i, x in enumerate(lines) if i != at[0])
    assert at[0] == round(depth * noise)  # the needle's line: depth × the noise lines before it
    key = s.references[0]
    assert lines[at[0]].endswith(f": {key}.") and key in tok.decode(s.question) + lines[at[0]]
    assert s.tokens + s.max_new_tokens <= length  # prompt and answer fit the length
    assert length - s.tokens - s.max_new_tokens < 2 * len(tok(NOISE, add_special_tokens=False).input_ids)


def test_bad_grids_fail_with_the_parameter_named(smol):
    _, tok = smol
    with pytest.raises(ValueError, match="at least 256"):
        RetrievalConfig(lengths=(128,))
    for kw, msg in ((dict(depths=(0.5, 1.5)), "depths"), (dict(lengths=(512, 512)), "lengths"),
                    (dict(keys=0), "keys"), (dict(lengths=()), "lengths")):
        with pytest.raises(ValueError, match=msg):
            RetrievalConfig(**kw)
    with pytest.raises(ValueError, match="lengths '1k'"):
        RetrievalConfig.parse("1k")
    assert RetrievalConfig.parse("512,1024", "0,1", 2) == RetrievalConfig(lengths=(512, 1024), depths=(0, 1), keys=2)
    assert DecodingChecks.from_parameters() == DecodingChecks(None, None)
    assert DecodingChecks.from_parameters(generation_prompts=3).agreement == AgreementConfig(prompts=3)


@pytest.fixture(scope="module")
def identity_and_zeroed(smol, tmp_path_factory):
    """One retrieval run over TINY_B: the exact cache, the identity and a zeroed cache (two tests read it)."""
    lm, tok = smol
    return run_retrieval(lm, tok, [], tmp_path_factory.mktemp("retrieval"), TINY_B,
                         transforms={"identity": identity, "zeroed": zeroed})


def test_identity_reproduces_the_exact_answers_and_a_broken_cache_does_not(identity_and_zeroed):
    r = identity_and_zeroed
    exact, same, broken = r.exact, r.scheme("identity"), r.scheme("zeroed")
    assert exact.found == exact.total == 2  # the embedded model finds every key at these lengths
    assert [a.answer for a in same.answers] == [a.answer for a in exact.answers] and same.dropped == 0
    assert broken.found < exact.found and broken.dropped == exact.found - broken.found + broken.gained
    assert r.summary().startswith("retrieval: 2/2 exact, 2/2 identity, ")


def test_lengths_beyond_the_model_context_are_left_out(smol, tmp_path):
    lm, tok = smol
    r = run_retrieval(lm, tok, [], tmp_path, RetrievalConfig(lengths=(384, 100_000), depths=(0.5,)),
                      transforms={"identity": identity})
    assert r.lengths == [384] and r.skipped_lengths == [100_000] and r.exact.total == 1
    assert r.summary().endswith("(lengths 100000 left out: beyond the model's context)")


def test_a_huge_length_is_capped_before_anything_is_built(smol):
    """A length far past the model's context is never tokenized into a haystack (10^12 tokens would not fit in
    memory): the early check builds only what will run, and fails at once when nothing fits."""
    lm, tok = smol
    DecodingChecks(RetrievalConfig(lengths=(384, 10**12), depths=(0.5,))).check_inputs(lm, tok, 10**6, "c")
    with pytest.raises(ValueError, match="exceeds the model's context"):
        DecodingChecks(RetrievalConfig(lengths=(10**12,))).check_inputs(lm, tok, 10**6, "c")
    with pytest.raises(ValueError, match="too short for 2 agreement prompts"):
        DecodingChecks(agreement=AgreementConfig(prompts=2, context_tokens=10**12)).check_inputs(lm, tok, 10**6, "c")


def test_retrieval_goes_through_the_real_cli_once_per_haystack(smol, tmp_path, cli, monkeypatch):
    lm, tok = smol
    import kvlib.transforms.codec as codec_mod

    monkeypatch.setenv("KVLIB_CODEC", "cli")  # the file path, whose context writes this counts
    saves, save = [], codec_mod.save_kv_cache
    monkeypatch.setattr(codec_mod, "save_kv_cache", lambda *a, **k: saves.append(1) or save(*a, **k))
    # two codecs that find every key (one that misses decodes 128 tokens a haystack)
    r = run_retrieval(lm, tok, [resolve_codec("int8"), resolve_codec("int4")], tmp_path, TINY_R, "smol")
    assert [s.name for s in r.schemes] == ["int8", "int4"]
    assert r.scheme("int8").found == 6  # 8-bit keeps every key
    # One prompt at a time: its cache written once for both codecs, into the one context file.
    assert len(saves) == 6 and len(list(tmp_path.glob("context*.safetensors"))) == 1
    d = r.to_dict()
    json.dumps(d)
    assert d["exact"]["found"] == 6 and d["summary"] == r.summary()


@pytest.mark.parametrize("backend", ["server", "cli"])
def test_cli_roundtrip_context_is_saved_once_for_all_codecs(smol, tmp_path, cli, backend, monkeypatch):
    lm, tok = smol
    from kvlib.transforms.codec import ServerCacheRoundtrip
    from kvlib.transforms.codec import cache_transforms

    monkeypatch.setenv("KVLIB_CODEC", backend)
    ts, missing = cache_transforms([resolve_codec("int4"), resolve_codec("q8_0")], tmp_path, "smol", slots=2)
    kind = ServerCacheRoundtrip if backend == "server" else CLICacheRoundtrip
    assert missing is None and all(isinstance(t, kind) for t in ts.values())
    a, b = prefill(lm, [1, 2, 3, 4]), prefill(lm, [5, 6, 7, 8])
    for t in ts.values():
        for c in (a, b):
            t(c)
    assert ts["int4"].context.writes == 2 and ts["int4"].context is ts["q8_0"].context


def test_prompts_are_evenly_spaced_and_do_not_overlap():
    ids = torch.arange(1000)[None]
    ps = cut_prompts(ids, AgreementConfig(prompts=4, context_tokens=250))
    assert [p[0] for p in ps] == [0, 250, 500, 750] and all(len(p) == 250 for p in ps)
    ps = cut_prompts(ids, AgreementConfig(prompts=3, context_tokens=100))
    assert [p[0] for p in ps] == [0, 450, 900]
    with pytest.raises(ValueError, match="too short for 5 agreement prompts of 250"):
        cut_prompts(ids, AgreementConfig(prompts=5, context_tokens=250))
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2 and first_divergence([1, 2], [1, 2]) == 2
    assert first_divergence([5], [6]) == 0


def test_identity_agrees_fully_and_a_broken_cache_diverges(smol, tmp_path):
    lm, tok = smol
    from kvlib.models import corpus

    ids = corpus.tokenize(tok, corpus.load_corpus("embedded"))
    r = run_agreement(lm, tok, ids, [], tmp_path, TINY_A, transforms={"identity": identity, "zeroed": zeroed})
    same, broken = r.scheme("identity"), r.scheme("zeroed")
    assert same.tokens == r.exact.tokens and same.agreement == 100.0
    assert same.divergence == [6, 6, 6] and same.identical == 3 and same.mean_divergence == 6
    assert broken.agreement < 100 and broken.identical < 3
    i = broken.sample
    assert broken.divergence[i] == first_divergence(r.exact.tokens[i], broken.tokens[i])
    t = broken.sample_text
    assert t["common"] + t["exact"] == tok.decode(r.exact.tokens[i], skip_special_tokens=True)
    html = decoding_report.agreement_samples(r.to_dict()).data
    assert "<mark" in html and "zeroed" in html and r.summary().startswith("generation agreement")


def test_batched_rows_decode_as_they_would_alone(smol):
    """Stacking equally long caches does not change what each row generates."""
    lm, _ = smol
    prompts = [list(range(100, 140)), list(range(300, 340))]
    caches = [prefill(lm, p[:-1]) for p in prompts]
    last = torch.tensor([[p[-1]] for p in prompts])
    both = greedy_continue(lm, stack_caches(caches), last, 5)
    alone = [greedy_continue(lm, stack_caches([c]), last[i:i + 1], 5)[0] for i, c in enumerate(caches)]
    assert both[0].tolist() == alone[0].tolist() and both[1].tolist() == alone[1].tolist()
    assert cache_layers(caches[0])[0][0].shape[2] == 39  # the inputs were not grown by decoding
    with pytest.raises(ValueError, match="different lengths"):
        stack_caches([caches[0], prefill(lm, [1, 2])])


def _logits(lm, cache, question, steps):
    """Every step's logits of a greedy decode (what in-place appending must not change)."""
    x, out = question, []
    with torch.no_grad():
        for _ in range(steps):
            logits = lm(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            out.append(logits)
            x = logits.argmax(-1, keepdim=True)
    return torch.stack(out)


def test_appending_in_place_decodes_as_concatenating(tiny_llama):
    """A batch with room appends into its buffers (no copy of the cache per token) and yields the
    very logits of DynamicLayer's concatenation; running out of room regrows it."""
    ids = torch.randint(3, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    caches = [prefill(tiny_llama, row.tolist()) for row in ids]
    q = torch.tensor([[5, 6, 7], [8, 9, 10]])
    plain = _logits(tiny_llama, stack_caches(caches), q, 6)
    roomy = stack_caches(caches, reserve=8)
    assert type(roomy.layers[0]).__name__ == "AppendLayer"
    where = roomy.layers[0].keys.data_ptr()
    assert torch.equal(_logits(tiny_llama, roomy, q, 6), plain)
    assert roomy.layers[0].keys.data_ptr() == where and roomy.get_seq_length() == 40 + 3 + 5
    tight = stack_caches(caches, reserve=2)  # too little room: the buffers are made again, same numbers
    assert torch.equal(_logits(tiny_llama, tight, q, 6), plain)


def test_rows_leave_the_batch_in_place(tiny_llama):
    """Keeping some rows of an appending batch moves them to the front of the same buffers."""
    caches = [prefill(tiny_llama, list(range(3 + i, 33 + i))) for i in range(3)]
    batch = stack_caches(caches, reserve=4)
    layer = batch.layers[2]
    before, where = layer.keys.clone(), layer.keys.data_ptr()
    batch.batch_select_indices(torch.tensor([0, 2]))
    assert layer.keys.data_ptr() == where and torch.equal(layer.keys, before[[0, 2]])
    batch.batch_select_indices(torch.tensor([1, 0]))  # not increasing: copied as DynamicLayer does
    assert torch.equal(layer.keys, before[[2, 0]])


def test_a_cache_never_writes_into_tensors_it_was_given(tiny_llama):
    """make_cache with room appends into buffers of its own unless told the tensors are its own
    (room_for): a caller's tensor, even a prefix view of a larger one, is never written to."""
    from kvlib.cache.layout import make_cache

    full = prefill(tiny_llama, list(range(3, 43)))
    big = [(k.clone(), v.clone()) for k, v in cache_layers(full)]
    before = [k.clone() for k, _ in big]
    c = make_cache([(k[:, :, :30], v[:, :, :30]) for k, v in big], reserve=20)  # views with room behind them
    _logits(tiny_llama, c, torch.tensor([[5]]), 3)
    c.batch_select_indices(torch.tensor([0]))
    assert all(torch.equal(k, b) for (k, _), b in zip(big, before))


def test_padded_rows_answer_as_each_alone(tiny_llama):
    """Caches of different lengths (an eviction's beside the exact one) decode as one left-padded
    batch, each row over its own tokens; rows that end leave the batch, the others go on as alone."""
    ids = torch.randint(3, 64, (50,), generator=torch.Generator().manual_seed(2)).tolist()
    full = prefill(tiny_llama, ids)
    short = make_cache([(k[:, :, -20:].clone(), v[:, :, -20:].clone()) for k, v in cache_layers(full)])
    q = [11, 12, 13]
    alone = [greedy_answers(tiny_llama, stack_caches([c]), q, 8, len(ids)) for c in (full, short, full)]
    batch, mask = stack_padded([full, short, full], reserve=11)
    assert mask.sum(1).tolist() == [50, 20, 50] and mask[1, :30].sum() == 0
    assert greedy_answers(tiny_llama, batch, q, 8, len(ids), mask=mask) == [a[0] for a in alone]
    # A row that ends early (its second token is a stop token) leaves; the rest answer as alone.
    stop = (alone[1][0][1],)
    want = [greedy_answers(tiny_llama, stack_caches([c]), q, 8, len(ids), stop)[0] for c in (full, short)]
    batch, mask = stack_padded([full, short], reserve=11)
    assert greedy_answers(tiny_llama, batch, q, 8, len(ids), stop, mask=mask) == want
    assert len(want[1]) <= 2
    with pytest.raises(ValueError, match="layer or head counts"):
        stack_padded([full, make_cache(cache_layers(short)[:3])])


def test_report_figures_state_their_numbers(identity_and_zeroed):
    r = identity_and_zeroed.to_dict()
    zero = r["schemes"][1]
    assert [s["name"] for s in r["schemes"]] == ["identity", "zeroed"]
    fig = decoding_report.plot_retrieval(r)
    assert fig.alt.endswith(f"exact 2/2; identity 2/2; zeroed {zero['found']}/2") and fig.png[:4] == b"\x89PNG"
    rows = decoding_report.retrieval_rows(r)
    assert rows[0][:3] == ["exact", "2/2", "100 %"] and rows[0][3:5] == ["1/1", "1/1"]
    assert rows[2][0] == "zeroed" and rows[2][-2] == str(zero["dropped"])


@pytest.mark.parametrize("args,msg", [
    (["--retrieval-depths", "0,2"], "depths"),
    (["--retrieval-lengths", "abc"], "lengths 'abc'"),
    (["--generation-prompts", "0"], "prompts 0"),
    (["--generation-tokens", "0"], "new_tokens 0"),
    (["--quick-test", "--retrieval"], "need a model"),
])
def test_cli_rejects_bad_checks_before_loading(args, msg, cli, capsys, monkeypatch):
    """kv-validate's entry point in this process (tests/test_cli.py runs ``python -m kvlib`` itself),
    with the model forbidden to load: exit 2, one line naming the parameter."""
    from kvlib.cli import main
    from kvlib.models import sources

    monkeypatch.setattr(sources, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("loaded the model"))
    try:
        rc = main(args)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_decoding_units_are_stored_and_reused(smol, tmp_path, cli, monkeypatch):
    """Each batch's answers and continuations per scheme go to the results store; a second run
    reads them all back (nothing prefilled or decoded) and reports the same numbers."""
    import kvlib.checks.agreement
    import kvlib.checks.ruler.run
    from kvlib.models.corpus import load_corpus, tokenize
    from kvlib.scoring.provenance import RunIdentity
    from kvlib.scoring.store import ResultsStore
    from kvlib.scoring.units import CheckUnits

    lm, tok = smol
    ident = RunIdentity("m", "float32", "cpu", "tok", "ids", "code", "versions", 2048, 512)
    store = ResultsStore.open(tmp_path / "store")
    ids = tokenize(tok, load_corpus("embedded"))
    codecs = [resolve_codec("int8")]

    grid = TINY_B

    def both():
        r = run_retrieval(lm, tok, codecs, tmp_path / "r", grid, "smol", units=CheckUnits(store, ident, "retrieval"))
        a = run_agreement(lm, tok, ids, codecs, tmp_path / "a", TINY_A, "smol",
                          units=CheckUnits(store, ident, "agreement"))
        return r.to_dict(), a.to_dict()

    def numbers(d):
        return {k: v for k, v in d.items() if k != "timing"}

    first = both()
    assert len(store) == 2 * 2 + 2  # retrieval: 2 lengths x (exact, int8); agreement: exact, int8
    for mod, name in ((kvlib.checks.ruler.run, "prefill_observed"), (kvlib.checks.agreement, "prefill")):
        monkeypatch.setattr(mod, name, lambda *a, **k: pytest.fail("prefilled a stored unit"))
    again = both()
    assert [numbers(d) for d in again] == [numbers(d) for d in first]

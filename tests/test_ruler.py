"""The RULER-style suite: prompts fit their length and hold their answers as RULER's templates put
them, samples are functions of their seed, scoring is RULER's, and the protocol answers from the
exact, a codec's and a press's cache with units kept in the store."""

from __future__ import annotations

import collections
import math
import re

import pytest
import torch

from kvlib.checks.ruler import score as S
from kvlib.checks.ruler.run import EXACT, RulerConfig, run_ruler, stop_tokens
from kvlib.checks.ruler.tasks import TASKS, Environment, sample_seed, singular
from kvlib.checks.ruler.words import DEPTHS, NOISE, common_words, key_words, sentences
from kvlib.cache.layout import cache_layers, make_cache
from kvlib.scoring.generate import greedy_answers, prefill, prefill_observed, stack_caches
from kvlib.scoring.store import ResultsStore
from kvlib.scoring.units import CheckUnits

SYNTHETIC = [t for t in TASKS if not t.startswith("qa_")]
TEXT = " ".join(f"Sentence number {i} tells of the river and the old mill . It was built in {1800 + i} ."
                for i in range(3000))
ENV = Environment(TEXT, "test prose")


@pytest.fixture(scope="module")
def tok(embedded):
    return embedded[1]


def test_word_lists_are_wonderwords_2_2_0():
    adjs, nouns = key_words()
    assert (len(adjs), len(nouns), len(common_words())) == (910, 6786, 8169)  # RULER's counts
    assert DEPTHS[:5] == (0, 3, 5, 8, 10) and DEPTHS[-1] == 100 and len(DEPTHS) == 40


@pytest.mark.parametrize("task", SYNTHETIC)
def test_every_task_fills_its_length_and_holds_its_answers(tok, task):
    t = TASKS[task]
    s = t.sample(tok, 2048, 42, 0, ENV)
    used = s.tokens + s.max_new_tokens
    assert 0.9 * 2048 <= used <= 2048, used
    context = tok.decode(s.context)
    assert s.references and all(isinstance(r, str) and r for r in s.references)
    if t.family in ("niah", "variable_tracking", "common_words_extraction", "freq_words_extraction"):
        for r in s.references:  # every answer is in the context, not in the question
            assert r in context, r
    assert s.max_new_tokens == {"niah": 128, "variable_tracking": 30, "common_words_extraction": 120,
                                "freq_words_extraction": 50}[t.family]


def test_samples_are_functions_of_their_seed(tok):
    t = TASKS["niah_multikey_2"]
    a, b = t.sample(tok, 1024, 42, 3, ENV), t.sample(tok, 1024, 42, 3, ENV)
    assert a == b
    assert t.sample(tok, 1024, 42, 4, ENV).references != a.references
    assert t.sample(tok, 1024, 7, 3, ENV).references != a.references
    assert sample_seed(42, "vt", 4096, 0) != sample_seed(42, "vt", 4096, 1)


def test_niah_single_reads_as_rulers_singular_prompt(tok):
    s = TASKS["niah_single_1"].sample(tok, 1024, 42, 0, ENV)
    text = tok.decode(s.context) + tok.decode(s.question)
    assert "A special magic number is hidden within the following text." in text
    key = re.search(r"One of the special magic numbers for (\S+) is: (\d{7})\.", text)
    assert key and key.group(2) == s.references[0]  # the needle keeps RULER's plural
    assert text.endswith(f" The special magic number for {key.group(1)} mentioned in the provided text is")
    assert f"What is the special magic number for {key.group(1)} mentioned in the provided text?" in text
    assert text.count(NOISE) > 10
    assert singular("What are all the special magic answers") == "What is the special magic answer"


def test_multiquery_asks_four_keys_and_multivalue_four_values(tok):
    q = TASKS["niah_multiquery"].sample(tok, 2048, 42, 0, ENV)
    question = tok.decode(q.question)
    assert len(q.references) == 4 and question.count(", ") >= 3 and ", and " in question
    assert "What are all the special magic numbers for" in question
    v = TASKS["niah_multivalue"].sample(tok, 2048, 42, 0, ENV)
    assert len(v.references) == 4 and len(set(v.references)) == 4


def test_essay_needles_sit_between_sentences(tok):
    s = TASKS["niah_multikey_1"].sample(tok, 2048, 42, 1, ENV)
    text = tok.decode(s.context)
    needles = re.findall(r"One of the special magic numbers for \S+ is: \d{7}\.", text)
    assert len(needles) == 4
    for n in needles:  # each needle follows a sentence end (or opens the haystack)
        before = text[:text.index(n)].rstrip()
        assert before.endswith((".", "text.")) or before.endswith("following text.")


def test_cwe_and_fwe_answers_are_the_frequent_words(tok):
    s = TASKS["cwe"].sample(tok, 4096, 42, 0, ENV)
    body = tok.decode(s.context).rsplit("Memorize the ones that appear most often.\n", 1)[1]
    counts = collections.Counter(re.findall(r"\d+\. (\S+(?: \S+)?)", body))
    assert all(body.count(f". {w} ") + body.endswith(f". {w}") >= 25 for w in s.references)
    f = TASKS["fwe"].sample(tok, 4096, 42, 0, ENV)
    words = collections.Counter(tok.decode(f.context).split())
    ranked = [w for w, _ in words.most_common(5) if re.fullmatch(r"[a-z]{6}", w)]
    assert list(f.references) == ranked[:3]
    assert counts  # the numbered list parsed


def test_vt_chain_is_in_order_and_the_one_shot_comes_first(tok):
    s = TASKS["vt"].sample(tok, 2048, 42, 0, ENV)
    text = tok.decode(s.context)
    value = re.search(r"assigned the value (\d{5}) in the text above\.", tok.decode(s.question)).group(1)
    names = list(s.references)
    assert f"VAR {names[0]} = {value}" in text
    for a, b in zip(names, names[1:]):
        assert text.index(f"VAR {b} = VAR {a} ") > text.index(f"VAR {a} ")
    assert text.index("Answer: According to the chain(s)") < text.rindex("Memorize and track")  # one-shot first
    assert len(names) == 5 and all(len(n) == 5 for n in names)


def test_too_short_a_length_says_so(tok):
    with pytest.raises(ValueError, match="length 300 is too short"):
        TASKS["cwe"].sample(tok, 300, 42, 0, ENV)


def test_qa_is_skipped_with_one_line_when_its_dataset_cannot_load(monkeypatch):
    import socket

    def refuse(*a, **k):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", refuse)
    why = TASKS["qa_1"].unavailable(ENV)
    assert why.startswith("qa_1 (squad) skipped: its dataset needs the Hub") and "\n" not in why


def test_scoring_is_rulers():
    assert S.string_match_all("The keys: 1234 and ABC", ["1234", "abc", "zz"]) == pytest.approx(2 / 3)
    assert S.string_match_part("Paris, France", ["London", "paris"]) == 1.0
    assert S.score("string_match_all", "  x\x07 123 \n", ["123"]) == 1.0
    assert S.postprocess(" a\tb\x00c ") == "a\nb\nc"
    mean, lo, hi = S.accuracy([1, 0, 1, 1])
    assert mean == 75.0 and 0 <= lo <= mean <= hi <= 100
    assert math.isnan(S.accuracy([1])[1])
    avg, lo, hi = S.average([[1, 1, 1, 1], [0, 0, 0, 0]])
    assert avg == 50.0 and lo == hi == 50.0  # constant tasks: nothing to resample


def test_config_parses_and_names_what_is_wrong():
    c = RulerConfig.parse("vt,cwe", "4096,8192", 5, "knorm", "embedded")
    assert (c.tasks, c.lengths, c.samples, c.presses) == (("vt", "cwe"), (4096, 8192), 5, ("knorm",))
    assert RulerConfig.parse(tasks="all").tasks == tuple(TASKS)
    assert RulerConfig.parse(presses="none").presses == ()
    with pytest.raises(ValueError, match="RULER tasks niah_9"):
        RulerConfig.parse("niah_9")
    with pytest.raises(ValueError, match="RULER lengths"):
        RulerConfig.parse(lengths="4k")
    with pytest.raises(ValueError, match="RULER presses h2o"):
        RulerConfig.parse(presses="h2o")
    assert hash(c) == hash(RulerConfig.parse("vt,cwe", "4096,8192", 5, "knorm", "embedded"))


def test_observed_queries_are_the_attentions_own(embedded):
    lm, tok = embedded
    ids = tok("The quick brown fox jumps over the lazy dog. " * 8).input_ids
    cache, queries = prefill_observed(lm, ids, 8)
    plain = prefill(lm, ids)
    for (k1, v1), (k2, v2) in zip(cache_layers(cache), cache_layers(plain)):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
    assert len(queries) == lm.config.num_hidden_layers
    assert queries[0].shape == (1, lm.config.num_attention_heads, 8, lm.config.head_dim)


def test_answers_continue_at_the_contexts_positions(embedded):
    """An evicted cache decodes with the original positions: keeping every token answers as the
    exact cache does; the batch of two rows answers as each alone."""
    from kvlib.transforms.evict import make_press

    lm, tok = embedded
    ids = tok("Remember: the code is 4417. " + "The sky is blue. " * 40).input_ids
    q = tok(" What is the code? The code is", add_special_tokens=False).input_ids
    cache = prefill(lm, ids)
    exact = greedy_answers(lm, stack_caches([cache], 1), q, 6, len(ids))
    kept, _ = make_press("knorm", 0.0)(cache)  # ratio 0: every token, in order
    assert greedy_answers(lm, kept.cache, q, 6, kept.seen) == exact
    two = greedy_answers(lm, stack_caches([cache, cache], 2), q, 6, len(ids))
    assert two == exact * 2
    assert greedy_answers(lm, stack_caches([cache], 1), q, 6, len(ids), finished=lambda t: True) == [exact[0][:1]]


def identity(cache):
    return stack_caches([cache], 1), None


def zeroed(cache):
    return make_cache([(torch.zeros_like(k), torch.zeros_like(v)) for k, v in cache_layers(cache)]), None


def test_protocol_scores_exact_codecs_and_presses_and_reuses_units(embedded, tmp_path):
    lm, tok = embedded
    cfg = RulerConfig(tasks=("niah_single_1",), lengths=(512,), samples=2, presses=("streaming_llm",))
    store = ResultsStore.open(tmp_path / "store")
    from kvlib.scoring.provenance import RunIdentity

    ident = RunIdentity(model="m", dtype="float32", device="cpu", tokenizer="t", tokens="c", code="x", versions="v",
                        context_length=0, stride=0)
    units = CheckUnits(store, ident, "ruler")
    r = run_ruler(lm, tok, [], tmp_path, cfg, TEXT, transforms={"same": identity, "zeroed": zeroed}, units=units)
    assert list(r.answers) == [EXACT, "same", "zeroed"]  # no codec given: no press at its bytes
    assert [a.score for a in r.answers["same"]] == [a.score for a in r.answers[EXACT]]
    assert r.cell(EXACT, "niah_single_1", 512)[0] == 100.0  # the embedded model finds the number at 512
    assert r.cell("zeroed", "niah_single_1", 512)[0] == 0.0
    assert r.qualifies("niah_single_1", 512)
    assert stop_tokens(lm.config, tok)
    # Again: every unit comes from the store, nothing is decoded.
    import kvlib.checks.ruler.run as run_mod

    def no_prefill(*a, **k):
        raise AssertionError("prefilled although every unit is stored")

    orig, run_mod.prefill_observed = run_mod.prefill_observed, no_prefill
    try:
        again = run_ruler(lm, tok, [], tmp_path, cfg, TEXT, transforms={"same": identity, "zeroed": zeroed},
                          units=units)
    finally:
        run_mod.prefill_observed = orig
    assert [a.answer for a in again.answers[EXACT]] == [a.answer for a in r.answers[EXACT]]


def test_floors_run_the_exact_cache_only_unless_asked(embedded, tmp_path, monkeypatch):
    """Where the exact cache is below the floor only it runs (a floor is not a result, and the
    schemes' work there would be wasted), with a note; ``floors=True`` runs the schemes anyway."""
    import kvlib.checks.ruler.run as run_mod

    lm, tok = embedded
    monkeypatch.setattr(run_mod, "ruler_qualifies", lambda acc: False)
    monkeypatch.setattr(run_mod, "ruler_sure", lambda scores, n: False)
    cfg = RulerConfig(tasks=("niah_single_1",), lengths=(512,), samples=2, presses=())
    r = run_ruler(lm, tok, [], tmp_path, cfg, TEXT, transforms={"zeroed": zeroed})
    assert len(r.scores(EXACT, "niah_single_1", 512)) == 2 and r.scores("zeroed", "niah_single_1", 512) == []
    assert any("a floor (the exact cache 100 %), the schemes not run" in n for n in r.notes)
    assert math.isnan(r.average("zeroed", 512)[0]) and r.average(EXACT, 512)[0] == 100.0
    assert RulerConfig.parse(floors="false").floors is False and RulerConfig.parse(floors="True").floors
    with pytest.raises(ValueError, match="floors 'maybe'"):
        RulerConfig.parse(floors="maybe")
    both = run_ruler(lm, tok, [], tmp_path, RulerConfig.parse("niah_single_1", "512", 2, "none", floors=True), TEXT,
                     transforms={"zeroed": zeroed})
    assert both.scores("zeroed", "niah_single_1", 512) == [0.0, 0.0]
    assert [a.answer for a in both.answers[EXACT]] == [a.answer for a in r.answers[EXACT]]


def test_a_floor_stops_once_it_cannot_qualify(embedded, tmp_path, monkeypatch):
    """The exact cache stops on a cell as soon as perfect scores on the samples left could not lift it
    to the floor; those it ran are kept and counted."""
    import kvlib.checks.ruler.run as run_mod
    from kvlib.gates import ruler_out_of_reach

    assert ruler_out_of_reach([0.0, 0.0, 0.0], 5) and not ruler_out_of_reach([0.0, 0.0], 5)
    assert not ruler_out_of_reach([1.0, 0.0, 0.0], 5) and ruler_out_of_reach([0.5] * 4 + [0.0] * 4, 10)
    lm, tok = embedded
    asked = []

    def never_found(self, s, names, known, label="", keep=False):  # the exact cache never finds it (no model run)
        asked.append(names)
        return {**known, **{m: {"answer": "", "score": 0.0, "seconds": 0.0, "cache_bytes": 0} for m in names}}

    monkeypatch.setattr(run_mod.Runner, "answer", never_found)
    r = run_ruler(lm, tok, [], tmp_path, RulerConfig(tasks=("niah_single_1",), lengths=(512,), samples=4, presses=()),
                  TEXT, transforms={"zeroed": zeroed})
    assert len(r.scores(EXACT, "niah_single_1", 512)) == 3  # after 3 zeros, one more sample cannot reach 50 %
    assert asked == [[EXACT]] * 3
    assert any("the exact cache 0 % on 3 of 4 samples" in n for n in r.notes), r.notes
    # Sure to qualify after 2 of 4 found: from the third sample on, every cache answers in one pass.
    asked.clear()
    found = iter([1.0, 1.0, 0.0, 0.0])

    def first_two_found(self, s, names, known, label="", keep=False):  # what is missing is computed (one prefill)
        missing = [m for m in names if m not in known]
        if missing:
            asked.append(missing)
        return {**known, **{m: {"answer": "", "score": next(found) if m == EXACT else 0.0, "seconds": 0.0,
                                "cache_bytes": 0} for m in missing}}

    monkeypatch.setattr(run_mod.Runner, "answer", first_two_found)
    r = run_ruler(lm, tok, [], tmp_path, RulerConfig(tasks=("niah_single_1",), lengths=(512,), samples=4, presses=()),
                  TEXT, transforms={"zeroed": zeroed})
    assert asked == [[EXACT], [EXACT], [EXACT, "zeroed"], [EXACT, "zeroed"], ["zeroed"], ["zeroed"]]
    assert r.scores("zeroed", "niah_single_1", 512) == [0.0] * 4 and r.cell(EXACT, "niah_single_1", 512)[0] == 50.0


def test_waves_of_samples_give_the_cells_of_one_at_a_time(embedded, tmp_path, monkeypatch):
    """An executor answering several samples at once (Ray's waves) keeps the answers up to where one
    at a time would have stopped: the same floor, counted on the same samples."""
    import kvlib.checks.ruler.run as run_mod

    lm, tok = embedded

    def never_found(self, s, names, known, label="", keep=False):
        return {**known, **{m: {"answer": "", "score": 0.0, "seconds": 0.0, "cache_bytes": 0} for m in names}}

    monkeypatch.setattr(run_mod.Runner, "answer", never_found)
    cfg = RulerConfig(tasks=("niah_single_1",), lengths=(512,), samples=8, presses=())
    cells = {}
    for width in (1, 3, 8):
        def wide(*a, width=width, **k):
            runner = run_mod.Runner(*a, **k)
            runner.width = width
            return runner
        r = run_ruler(lm, tok, [], tmp_path, cfg, TEXT, transforms={"zeroed": zeroed}, executor=wide)
        cells[width] = (r.scores(EXACT, "niah_single_1", 512), r.notes)
    assert cells[3] == cells[8] == cells[1] and len(cells[1][0]) == 5  # 5 zeros of 8: 3 more cannot reach 50 %


def test_a_qualifying_cell_prefills_each_sample_once(embedded, tmp_path, monkeypatch):
    """The samples the exact cache answered alone keep their prefill (bit for bit) until the
    schemes need it: one prefill per sample, and the answers of a single pass."""
    import kvlib.checks.ruler.run as run_mod

    lm, tok = embedded
    calls = []
    real = run_mod.prefill_observed
    monkeypatch.setattr(run_mod, "prefill_observed", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = RulerConfig(tasks=("niah_single_1",), lengths=(512,), samples=2, presses=())
    r = run_ruler(lm, tok, [], tmp_path / "a", cfg, TEXT, transforms={"same": identity})
    assert len(calls) == 2 and not list((tmp_path / "a").rglob("*.pt"))  # nothing left behind
    once = run_ruler(lm, tok, [], tmp_path / "b", RulerConfig(tasks=("niah_single_1",), lengths=(512,), samples=2,
                                                              presses=(), floors=True), TEXT,
                     transforms={"same": identity})
    assert [a.answer for a in r.answers["same"]] == [a.answer for a in once.answers["same"]]
    assert [a.answer for a in r.answers[EXACT]] == [a.answer for a in once.answers[EXACT]]


def test_caches_are_built_and_decoded_in_chunks_within_the_memory_budget():
    """A sample's caches come in chunks whose caches and padded batch fit the budget: the
    full-length ones first, then the presses by tokens kept (an 8K grid of every preset and press
    ran out of 24 GB when all were alive at once)."""
    from kvlib.checks.ruler.run import decode_chunks
    from kvlib.transforms.evict import make_press

    every = {"int4": object(), "q8_0": object(), "knorm@int4": make_press("knorm", 0.734),
             "knorm@q8_0": make_press("knorm", 0.469), "snapkv@int4": make_press("snapkv", 0.734)}
    names = [EXACT, *every]
    assert decode_chunks(names, every, 100, budget=10_000) == [[EXACT, "int4", "q8_0"],
                                                             ["knorm@q8_0", "knorm@int4", "snapkv@int4"]]
    assert decode_chunks(names, every, 100, budget=400) == [[EXACT, "int4"], ["q8_0"],  # 2 rows of 100, twice
                                                          ["knorm@q8_0", "knorm@int4", "snapkv@int4"]]
    assert decode_chunks(names, every, 100, budget=250)[3:] == [["knorm@q8_0", "knorm@int4"], ["snapkv@int4"]]
    assert decode_chunks(names, every, 100, budget=1) == [[n] for n in [EXACT, "int4", "q8_0", "knorm@q8_0",
                                                                       "knorm@int4", "snapkv@int4"]]


def test_presses_run_once_per_distinct_bytes():
    """Codecs of equal bits share their presses' rows (the same tokens kept): one row per press and
    bytes, named after the first codec of those bytes, comparing to all of them."""
    from kvlib.checks.ruler.run import eviction_peers
    from kvlib.codec.spec import resolve_codec

    peers = eviction_peers(RulerConfig(presses=("knorm", "snapkv")), [resolve_codec(c) for c in ("int4", "q8_0", "rot4")])
    assert list(peers) == ["knorm@int4", "snapkv@int4", "knorm@q8_0", "snapkv@q8_0"]
    press, at = peers["knorm@int4"]
    assert at == ["int4", "rot4"] and press.spec == "knorm@0.7344"


def test_sentences_split_at_ends_before_capitals():
    assert sentences("It was built . Then it fell ! \"Why?\" he asked") == ["It was built .", "Then it fell !",
                                                                           "\"Why?\" he asked"]


def made_result():
    from kvlib.checks.ruler.run import RulerAnswer, RulerResult

    def answers(scores, task, length, nbytes):
        return [RulerAnswer(task, length, i, "a", s, 0.1, nbytes) for i, s in enumerate(scores)]

    got = {EXACT: answers([1, 1, 1, 0], "niah_single_1", 1024, 2**21) + answers([0, 0, 1, 0], "vt", 1024, 2**21),
           "int4": answers([1, 1, 0, 0], "niah_single_1", 1024, 2**19) + answers([0, 0, 0, 0], "vt", 1024, 2**19),
           "knorm@int4": answers([0, 0, 0, 0], "niah_single_1", 1024, 2**19) + answers([0, 0, 0, 0], "vt", 1024, 2**19)}
    schemes = {EXACT: {"kind": "exact", "spec": "exact", "bits": 16.0},
               "int4": {"kind": "kvq", "spec": "int4", "bits": 4.25},
               "knorm@int4": {"kind": "evict", "spec": "knorm@0.7344", "bits": 4.25, "compared_to": "int4"}}
    cfg = {"tasks": ["niah_single_1", "vt"], "lengths": [1024], "samples": 4, "seed": 42, "presses": ["knorm"],
           "haystack": "embedded"}
    return RulerResult(cfg, [1024], got, schemes, ["qa_1 (squad) skipped: offline"], {"total_s": 1.0})


def test_results_summarise_qualify_and_round_trip():
    r = made_result()
    assert r.qualifies("niah_single_1", 1024) and not r.qualifies("vt", 1024)  # 75 % and 25 % exact
    assert r.average(EXACT, 1024)[0] == 50.0 and r.average(EXACT, 1024, qualifying_only=True)[0] == 75.0
    assert r.summary().startswith("ruler 1024, 1 of 2 tasks qualify: exact 75.0")
    assert r.headline() == ("At 1024 tokens 1 of 2 tasks qualify (niah_single_1): the exact cache averages 75 % on "
                            "them, the quantized caches 50 to 50 %, the evicted ones 0 to 0 %.")
    assert r.megabytes("int4", 1024) == 0.5
    rows = [x for x in r.table() if x["scheme"] == "int4" and x["task"] == "vt"]
    assert rows[0]["accuracy"] == 0.0 and rows[0]["qualifies"] is False
    back = type(r).from_dict(r.to_dict())
    assert back.table() == r.table() and back.notes == r.notes


def test_runs_of_different_lengths_merge_into_one_result():
    from kvlib.checks.ruler.run import RulerAnswer, RulerResult

    r = made_result()
    longer = RulerResult(dict(r.config, lengths=[2048]), [2048],
                         {k: [RulerAnswer(a.task, 2048, a.index, a.answer, a.score, a.seconds, a.cache_bytes)
                              for a in v] for k, v in r.answers.items() if k != "knorm@int4"},
                         {k: v for k, v in r.schemes.items() if k != "knorm@int4"}, ["at 2048"], {"total_s": 2.0})
    both = RulerResult.merge([r, longer])
    assert both.lengths == [1024, 2048] and list(both.schemes) == list(r.schemes)
    assert both.cell("int4", "niah_single_1", 2048) == r.cell("int4", "niah_single_1", 1024)
    assert both.scores("knorm@int4", "vt", 2048) == [] and both.timing["total_s"] == 3.0
    assert both.notes[-1] == "at 2048" and type(r).from_dict(both.to_dict()).table() == both.table()
    assert RulerResult.merge([r, r]).table() == r.table()  # the same run twice: every cell agrees
    other = RulerResult(dict(longer.config, seed=7), longer.lengths, longer.answers, longer.schemes)
    with pytest.raises(ValueError, match="different seed"):
        RulerResult.merge([r, other])


def test_runs_of_different_tasks_at_one_length_merge_cell_by_cell():
    from kvlib.checks.ruler.run import RulerResult

    r = made_result()
    pick = {t: RulerResult(dict(r.config, tasks=[t]), r.lengths, {k: [a for a in v if a.task == t]
                                                                  for k, v in r.answers.items()}, r.schemes, r.notes)
            for t in ("vt", "niah_single_1")}
    both = RulerResult.merge([pick["vt"], pick["niah_single_1"]])
    assert both.config["tasks"] == ["niah_single_1", "vt"]  # the suite's order, whichever run came first
    assert both.table() == r.table() and both.summary() == r.summary()


def test_a_scheme_added_later_merges_where_the_runs_agree():
    from dataclasses import replace

    from kvlib.checks.ruler.run import RulerResult

    r = made_result()
    part = {k: RulerResult(r.config, r.lengths, {s: v for s, v in r.answers.items() if s in (EXACT, k)},
                           {s: v for s, v in r.schemes.items() if s in (EXACT, k)}, r.notes)
            for k in ("int4", "knorm@int4")}
    both = RulerResult.merge([part["int4"], part["knorm@int4"]])  # the same cells, a scheme each
    assert list(both.schemes) == list(r.schemes) and both.table() == r.table()
    codecs_only = RulerResult(dict(r.config, presses=[]), r.lengths, part["int4"].answers, part["int4"].schemes)
    added = RulerResult.merge([part["knorm@int4"], codecs_only])  # a run of codecs with --ruler-presses none
    assert added.table() == r.table() and added.config["presses"] == ["knorm"]
    answers = dict(part["int4"].answers)
    answers[EXACT] = [replace(a, answer="b", score=0.0) if a.index == 0 else a for a in answers[EXACT]]
    with pytest.raises(ValueError, match="exact on niah_single_1 at 1024, sample 0: results 1 and 2 answer differently"):
        RulerResult.merge([part["knorm@int4"], RulerResult(r.config, r.lengths, answers, part["int4"].schemes)])
    answers[EXACT] = [a for a in r.answers[EXACT] if a.index != 3]
    with pytest.raises(ValueError, match="niah_single_1 at 1024: results 1 and 2 hold different samples"):
        RulerResult.merge([part["knorm@int4"], RulerResult(r.config, r.lengths, answers, part["int4"].schemes)])


def test_report_marks_floors_and_draws_both_families():
    from kvlib.report import ruler as report

    r = made_result()
    cells = report.cell_table(r)._repr_html_()
    assert "vt<br>1024 <em>(floor)</em>" in cells and "niah_single_1<br>1024 <em>" not in cells
    avg = report.average_table(r)._repr_html_()
    assert "keeps 26.6 % of the tokens (the bytes of int4)" in avg and "4.25 bits/element" in avg
    assert "<img" in report.plot_heatmaps(r)._repr_html_()
    assert "<img" in report.plot_accuracy_vs_bytes(r)._repr_html_()
    text = report.reading(r)
    assert "floors: vt" in text and "qa_1 (squad) skipped" in text
    assert "niah_single_1, evicted caches: below the exact cache beyond their CI: `knorm@int4`" in text


def test_report_lists_caches_by_family_then_bits():
    from kvlib.report import ruler as report

    r = made_result()
    r.schemes["q8_0"] = {"kind": "kvq", "spec": "q8_0", "bits": 8.5}  # run after int4 and its peer
    r.schemes["knorm@q8_0"] = {"kind": "evict", "spec": "knorm@0.4688", "bits": 8.5, "compared_to": "q8_0"}
    r.schemes["odd"] = {"kind": "kvq", "spec": "odd", "bits": math.nan}
    r.answers.update({k: r.answers["int4"] for k in ("q8_0", "knorm@q8_0", "odd")})
    assert report.ordered(r) == [EXACT, "q8_0", "int4", "odd", "knorm@q8_0", "knorm@int4"]
    cells = report.cell_table(r)._repr_html_()
    assert cells.index("<code>q8_0</code>") < cells.index("<code>int4</code>") < cells.index("<code>knorm@q8_0</code>")


def test_kvpress_comparison_counts_identical_sets():
    from kvlib.runs.kvpress_check import compare

    c = compare([[[1, 2], [3, 4]]], [[[2, 1], [3, 5]]])
    assert (c["sets"], c["identical"]) == (2, 1) and c["worst_jaccard"] == pytest.approx(1 / 3)


def test_cli_refuses_ruler_in_write_mode(capsys):
    """RULER runs the prefix protocol only: write mode (or an engine's menu, a write-mode verdict) is refused, not ignored."""
    from kvlib.cli import main

    for argv in (["--ruler", "--mode", "write"], ["--ruler", "--engine", "llama.cpp"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "prefix mode only" in err and err.count("\n") == 1


def test_a_press_at_the_same_bytes_merges_as_one_peer_whichever_codec_named_it():
    """A run adding lm4rot (4.25 bits, as int4) names its peers knorm@lm4rot: merged with the run
    that named them knorm@int4 they are one peer compared to both."""
    from kvlib.checks.ruler.run import RulerResult

    r = made_result()
    added = RulerResult(r.config, r.lengths,
                        {EXACT: r.answers[EXACT], "lm4rot": r.answers["int4"], "knorm@lm4rot": r.answers["knorm@int4"]},
                        {EXACT: r.schemes[EXACT], "lm4rot": dict(r.schemes["int4"], spec="lm4/g64/rot"),
                         "knorm@lm4rot": dict(r.schemes["knorm@int4"], compared_to="lm4rot")}, r.notes)
    both = RulerResult.merge([r, added])
    assert list(both.schemes) == [EXACT, "int4", "lm4rot", "knorm@int4"]  # the caches before the peers
    assert both.schemes["knorm@int4"]["compared_to"] == "int4, lm4rot"
    assert both.scores("knorm@int4", "vt", 1024) == r.scores("knorm@int4", "vt", 1024)
    assert RulerResult.merge([r, added, added]).table() == both.table()  # a third run names it once more


def test_a_press_two_runs_answer_differently_stays_two_rows_with_a_note():
    """Where the same press at the same bytes answered a shared sample differently in two runs, the
    merge does not pick one: both rows stay, each compared to its own codecs, and a note says so."""
    from dataclasses import replace

    from kvlib.checks.ruler.run import RulerResult

    r = made_result()
    other = [replace(a, answer="z") if a.index == 1 and a.task == "vt" else a for a in r.answers["knorm@int4"]]
    added = RulerResult(r.config, r.lengths, {EXACT: r.answers[EXACT], "knorm@lm4rot": other},
                        {EXACT: r.schemes[EXACT], "knorm@lm4rot": dict(r.schemes["knorm@int4"], compared_to="lm4rot")},
                        r.notes)
    both = RulerResult.merge([r, added])
    assert both.schemes["knorm@int4"]["compared_to"] == "int4" and both.schemes["knorm@lm4rot"]["compared_to"] == "lm4rot"
    assert both.notes[-1] == ("knorm@int4 and knorm@lm4rot (both knorm@0.7344) answer 1 of the samples both hold "
                              "differently (runs 1 and 2: a batch of other caches rounds differently), so they stay two rows")

"""The sensitivity pass, the exact knapsack and the mixed spec they produce (tiny model)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from kvlib.budget.allocate import allocate, solve
from kvlib.cache.layout import cache_layers
from kvlib.codec.spec import resolve_codec
from kvlib.budget.heads import HeadSensitivity, head_variants, measure_heads, per_head_estimate
from kvlib.budget.pricing import PRICERS, FastPricer, measure_sensitivity, two_part_kl
from kvlib.budget.sensitivity import (CalibrationConfig, Sensitivity, calibration_window, measure_mix, resolve_candidates, score_variant)
from kvlib.cache.layout import layout_of
from kvlib.transforms.codec import cache_transforms


def test_knapsack_is_exact_against_brute_force():
    rng = random.Random(7)
    for _ in range(300):
        n, m = rng.randint(1, 6), rng.randint(1, 4)
        costs = [[rng.choice([rng.random(), 0.5]) for _ in range(m)] for _ in range(n)]
        sizes = [[rng.randint(1, 9) for _ in range(m)] for _ in range(n)]
        cap = rng.randint(0, 40)
        fits = [(sum(costs[i][j] for i, j in enumerate(p)), p) for p in itertools.product(range(m), repeat=n)
                if sum(sizes[i][j] for i, j in enumerate(p)) <= cap]
        got = solve(costs, sizes, cap)
        if not fits:
            assert got is None
            continue
        picks, cost, size = got
        assert cost == pytest.approx(min(c for c, _ in fits), abs=1e-12)
        assert size == sum(sizes[i][j] for i, j in enumerate(picks)) <= cap
        assert cost == pytest.approx(sum(costs[i][j] for i, j in enumerate(picks)), abs=1e-12)


def test_calibration_config_round_trips_and_rejects():
    c = CalibrationConfig(corpus="embedded", windows=3, targets=64, candidates=("lm3rot", "q8_0"))
    assert CalibrationConfig.from_string(c.to_string()) == c and {c: 1}[c] == 1
    assert CalibrationConfig.from_string("windows=1") == CalibrationConfig(windows=1)
    specs = CalibrationConfig(candidates=("rot3", "k=asym3/g128/channel,v=asym3/g128"), measure="full")
    assert CalibrationConfig.from_string(specs.to_string()) == specs  # a spec's commas survive the string form
    assert CalibrationConfig.from_string("candidates=lm2rot,rot3").candidates == ("lm2rot", "rot3")
    assert resolve_candidates(CalibrationConfig().candidates)  # the default set is valid
    engines = resolve_candidates(("llama.cpp:q4_0", "vllm:fp8", "lm2rot"))  # engine formats are candidates too
    assert [c.name for c in engines] == ["llama.cpp:q4_0", "vllm:fp8", "lm2rot"]
    mixed = resolve_codec("k=llama.cpp:q4_0,v=lm2/g64/rot,k3=vllm:fp8,v2=llama.cpp:q8_0")  # a mix of them is a spec
    assert mixed.scheme_for(3, "key") == engines[1].key and mixed.scheme_for(0, "key") == engines[0].key
    for bad in ("windows=0", "nope=1", "targets", "measure=guess"):
        with pytest.raises(ValueError):
            CalibrationConfig.from_string(bad)
    with pytest.raises(ValueError, match="one scheme per role"):
        resolve_candidates(("int4,k0=int8",))


@pytest.fixture(scope="module")
def calibrated(tiny_llama, tmp_path_factory):
    torch.manual_seed(3)
    ids = torch.randint(3, 64, (1, 200))
    with torch.no_grad():
        windows = [calibration_window(tiny_llama, ids, b, 96, 16) for b in (0, 100)]
    codecs = resolve_candidates(("lm2rot", "lm4rot", "q8_0"))
    ts, _ = cache_transforms(codecs, tmp_path_factory.mktemp("sens"), "tiny")
    with torch.no_grad():
        sens = measure_sensitivity(tiny_llama, windows, codecs, ts, "random ids")
    return windows, codecs, ts, sens


def test_prefix_reuse_gives_the_same_bits(tiny_llama, calibrated):
    windows, codecs, ts, _ = calibrated
    w = windows[0]
    exact = cache_layers(w.context)
    rec, _ = ts[codecs[0].name](w.context)
    for layer in (0, 5, 21):
        layers = list(exact)
        layers[layer] = (cache_layers(rec)[layer][0].clone(), exact[layer][1])
        with torch.no_grad():
            assert score_variant(tiny_llama, w, layers, layer) == score_variant(tiny_llama, w, layers, 0)
    with torch.no_grad():
        assert score_variant(tiny_llama, w, list(exact), 7) == 0.0  # nothing compressed: exactly nothing lost


def test_replay_puts_back_a_forward_set_on_the_instance(tiny_llama, calibrated):
    windows, _, _, _ = calibrated
    layer = tiny_llama.get_decoder().layers[0]
    wrapped = layer.forward  # the bound class method, as accelerate's hooks wrap it
    layer.forward = lambda *a, **k: wrapped(*a, **k)
    hook = layer.forward
    try:
        with torch.no_grad():
            score_variant(tiny_llama, windows[0], cache_layers(windows[0].context), 3)
        assert layer.__dict__["forward"] is hook
    finally:
        del layer.forward
    assert "forward" not in layer.__dict__


def test_sensitivity_table_is_complete_and_ordered(calibrated):
    windows, codecs, _, sens = calibrated
    assert sens.num_layers == 22 and sens.names == ["lm2rot", "lm4rot", "q8_0"]
    assert sens.forwards == 22 * 2 * 3 * 2 and 0.4 < sens.layers_run < 0.6  # prefix reuse: about half the layers
    for layer in range(22):
        for r in range(2):
            b = [sens.bits(layer, r, c) for c in range(3)]
            assert b == pytest.approx([2.25, 4.25, 8.5])
            assert all(k >= 0 for k in sens.kl[layer][r])
    mean = [sum(sens.kl[la][r][c] for la in range(22) for r in range(2)) for c in range(3)]
    assert mean[0] > mean[1] > mean[2]  # fewer bits cost more, in total
    assert Sensitivity.from_dict(sens.to_dict()) == sens


def test_allocation_meets_the_budget_and_its_spec_reconstructs_the_mix(tiny_llama, calibrated, tmp_path):
    windows, codecs, _, sens = calibrated
    a = allocate(sens, 3.25)
    assert a.bits <= 3.25 and a.bits > 2.25
    mix = resolve_codec(a.spec)
    for layer, (k, v) in enumerate(a.choice):
        assert mix.scheme_for(layer, "key") == codecs[k].key and mix.scheme_for(layer, "value") == codecs[v].value
    # The mixed spec through kv-compress stores each slot as its candidate does: the same bits.
    ts, _ = cache_transforms(codecs + [mix], tmp_path, "tiny")
    w = windows[1]
    mixed, metrics = ts[mix.name](w.context)
    assert 8 * metrics.compressed_size_bytes / metrics.num_elements == pytest.approx(
        8 * sum(sens.stored_bytes[la][r][a.choice[la][r]] for la in range(22) for r in range(2))
        / sum(sum(e) for e in sens.elements))
    for layer, (k, v) in enumerate(a.choice):
        rk, _ = ts[codecs[k].name](w.context)
        assert torch.equal(cache_layers(mixed)[layer][0], cache_layers(rk)[layer][0])
    with torch.no_grad():
        measured = measure_mix(tiny_llama, windows, mix, ts)
    assert measured > 0
    # Everything at the cheapest candidate is the only choice at its own size; too small a budget fails.
    assert allocate(sens, 2.25).spec == resolve_codec("lm2rot").spec
    with pytest.raises(ValueError, match="below the cheapest"):
        allocate(sens, 2.0)


def test_sweep_with_a_budget_validates_the_mix_and_reuses_the_sensitivity(tiny_dir, tmp_path):
    from kvlib.report import budget as budget_report
    from kvlib.runs.sweep import run_sweep

    kw = dict(model=str(tiny_dir / "model"), corpus_name=str(tiny_dir / "corpus.txt"), device="cpu", stride=128,
              max_windows=3, context_length=256, peers=False, verbose=False, results=tmp_path / "store",
              budget="3.25", calibration="windows=1;targets=16;candidates=lm2rot,lm4rot")
    r = run_sweep(["lm3rot"], **kw, progress=True)  # the progress bars too
    mix = r.scheme("mix@3.25")
    assert mix.bits_per_element <= 3.25 + 1e-9 and "," in mix.spec and not r.budget["reused"]
    b = r.budget
    assert "Python documentation" in b["sensitivity"]["calibration"]  # auto: the embedded corpus, not the evaluated one
    assert b["mixes"][0]["spec"] == mix.spec and b["mixes"][0]["measured_kl"] > 0
    assert budget_report.budget_rows(r)[0][0] == "mix@3.25"
    for fig in (budget_report.plot_sensitivity(r), budget_report.plot_allocation(r)):
        assert fig is not None and "layer" in fig.alt
    again = run_sweep(["lm3rot"], **kw)
    assert again.budget["reused"] and again.budget["sensitivity"]["kl"] == b["sensitivity"]["kl"]
    assert again.scheme("mix@3.25").context_delta == mix.context_delta


def test_calibration_on_the_evaluated_corpus_comes_after_its_windows(tiny_dir, tiny_tokenizer):
    from kvlib.budget.plan import calibration_tokens
    from kvlib.models.corpus import load_corpus, tokenize

    text = load_corpus(str(tiny_dir / "corpus.txt"))
    ids = tokenize(tiny_tokenizer, text)
    cal = calibration_tokens(CalibrationConfig(corpus=str(tiny_dir / "corpus.txt"), windows=2), text, ids,
                             tiny_tokenizer, 256, 128, 3)
    assert cal.starts == [512, 768]  # three windows of 256 at stride 128 end at token 512
    with pytest.raises(ValueError, match="too few"):
        calibration_tokens(CalibrationConfig(corpus=str(tiny_dir / "corpus.txt"), windows=2), text, ids,
                           tiny_tokenizer, 256, 128, None)


def test_cli_rejects_a_bad_budget_or_calibration(capsys):
    from kvlib.cli import main

    for argv, words in ((["--budget", "abc"], "budget 'abc'"), (["--budget", "0.5"], "outside [1, 16]"),
                        (["--calibration", "windows=x"], "not an integer"),
                        (["--budget", "3", "--calibration", "candidates=int4,k0=int8"], "one scheme per role"),
                        (["--budget", "3", "--calibration", "candidates=int4+lossless|rot3"], "different entropy stages"),
                        (["--quick-test", "--sensitivity"], "need a model")):
        assert main(argv) == 2
        assert words in capsys.readouterr().err


def test_budget_weighs_slots_by_their_elements():
    """A sliding-window layer's tensors hold fewer tokens: its bits weigh less in the average."""
    # Layer 1 holds a quarter of layer 0's elements; lm2rot stores 2.25 bits, rot4 4.25.
    elements = [[1024, 1024], [256, 256]]
    sizes = {"lm2rot": [[288, 288], [72, 72]], "rot4": [[544, 544], [136, 136]]}
    kl = [[[1.0, 0.0], [0.9, 0.0]], [[0.5, 0.0], [0.4, 0.0]]]  # rot4 removes the whole cost
    specs = [resolve_codec(n).spec for n in ("lm2rot", "rot4")]
    sens = Sensitivity(candidates=specs, names=["lm2rot", "rot4"], kl=kl, elements=elements, calibration="synthetic",
                       stored_bytes=[[[sizes["lm2rot"][la][r], sizes["rot4"][la][r]] for r in range(2)] for la in range(2)],
                       targets=1)
    a = allocate(sens, 3.25)  # 1040 bytes: layer 0's keys (+256) and layer 1's keys (+64) fit, nothing more
    assert a.choice == ((1, 0), (1, 0)) and a.bits == pytest.approx(3.25) and a.predicted_kl == pytest.approx(1.3)
    assert resolve_codec(a.spec).scheme_for(1, "key") == resolve_codec("rot4").key


def test_calibration_window_takes_the_evaluated_layout(tiny_llama):
    ids = torch.randint(3, 64, (1, 120))
    with torch.no_grad():
        w = calibration_window(tiny_llama, ids, 0, 96, 16, context=40)
    assert layout_of(w.context).seen == 40 and w.suffix.shape[1] == 17 and w.end == 57
    assert torch.equal(w.suffix, ids[:, 40:57])  # the tokens after the context: 16 targets scored
    with pytest.raises(ValueError, match="do not fit"):
        calibration_window(tiny_llama, ids, 0, 96, 16, context=80)


def test_fast_measure_is_the_full_one_when_the_head_scores_every_token(tiny_llama, calibrated):
    """Batching a layer's variants and scoring the head on a token subset change nothing when the
    subset is the whole vocabulary; on a small subset the ranking of the slots holds."""
    windows, codecs, ts, full = calibrated
    vocab = windows[0].logp.shape[-1]
    import kvlib.budget.pricing as pricing
    saved = pricing.PRICERS["fast"]
    try:
        with torch.no_grad():
            pricing.PRICERS["fast"] = lambda: FastPricer(top=vocab)
            everything = measure_sensitivity(tiny_llama, windows, codecs, ts, "random ids", measure="fast")
            pricing.PRICERS["fast"] = lambda: FastPricer(top=4)
            fast = measure_sensitivity(tiny_llama, windows, codecs, ts, "random ids", measure="fast")
    finally:
        pricing.PRICERS["fast"] = saved
    assert everything.forwards == 22 * 2 and everything.head_tokens == vocab and everything.head_tail < 1e-6
    a = torch.tensor(full.kl).flatten()
    assert torch.allclose(torch.tensor(everything.kl).flatten(), a, rtol=1e-3, atol=1e-7)
    assert everything.stored_bytes == full.stored_bytes and everything.measure == "fast"
    # A near-uniform random model is no test of the ranking (docs/mixed-precision.md measures it on
    # real ones); on 4 tokens the candidates still order as the full measure orders them.
    totals = lambda s: [sum(s.kl[la][r][c] for la in range(22) for r in range(2)) for c in range(3)]
    assert fast.head_tokens < vocab and totals(fast)[0] > totals(fast)[1] > totals(fast)[2] > 0
    pricer = FastPricer(top=4)  # nothing compressed: the rest's estimated shift is 0 and so is the cost
    exact = cache_layers(windows[0].context)
    with torch.no_grad():
        pricer.prepare(tiny_llama, windows[0])
        assert max(pricer.price(tiny_llama, windows[0], exact, 5, [exact[5]] * 2)) < 1e-6


def test_a_budget_of_bytes_sent_prices_each_slot_with_the_wire_stage(calibrated, tmp_path):
    """Candidates that all carry +wire: a slot's bytes are what the stage stores for it (tables
    included), the reconstruction is the plain candidate's (so its cost is too), and the mix's
    spec keeps the stage and stores exactly the chosen slots' bytes."""
    windows, codecs, _, sens = calibrated
    wired = resolve_candidates(tuple(c.spec + "+wire" for c in codecs))
    ts, _ = cache_transforms(codecs + wired, tmp_path, "tiny")
    w = windows[0]
    per_slot = [[[0] * len(wired) for _ in range(2)] for _ in range(22)]
    for j, (plain, coded) in enumerate(zip(codecs, wired)):
        a, _ = ts[plain.name](w.context)
        b, metrics = ts[coded.name](w.context)
        assert all(torch.equal(x, y) for p, q in zip(cache_layers(a), cache_layers(b)) for x, y in zip(p, q))
        sizes = {d["name"]: int(d["compressed_size_bytes"]) for d in metrics.tensors}
        for la in range(22):
            for r, role in enumerate(("key", "value")):
                per_slot[la][r][j] = sizes[f"layer_{la}_{role}"]
    s = Sensitivity(candidates=[c.spec for c in wired], names=[c.name for c in wired], kl=sens.kl,
                    stored_bytes=per_slot, elements=[[k.numel(), v.numel()] for k, v in cache_layers(w.context)],
                    calibration="random ids", targets=16)
    assert s.bits(3, 0, 0) < sens.bits(3, 0, 0) * 1.0001  # the stage never grows a payload
    a = allocate(s, 3.0)
    mix = resolve_codec(a.spec)
    assert a.spec.endswith("+wire") and mix.entropy_suffix == "+wire" and a.bits <= 3.0
    _, metrics = cache_transforms([mix], tmp_path, "tiny")[0][mix.name](w.context)
    assert metrics.compressed_size_bytes == sum(per_slot[la][r][a.choice[la][r]] for la in range(22) for r in range(2))


def test_head_variants_replace_one_head_of_one_role():
    torch.manual_seed(0)
    exact = [(torch.randn(1, 3, 5, 4), torch.randn(1, 3, 5, 4)) for _ in range(2)]
    recon = [(torch.randn(1, 3, 5, 4), torch.randn(1, 3, 5, 4)) for _ in range(2)]
    got = head_variants(exact, recon, 1)
    assert len(got) == 6
    for i, (k, v) in enumerate(got):
        role, h = divmod(i, 3)
        changed, kept = (k, v) if role == 0 else (v, k)
        assert torch.equal(kept, exact[1][1 - role])
        assert torch.equal(changed[:, h], recon[1][role][:, h])
        others = [j for j in range(3) if j != h]
        assert torch.equal(changed[:, others], exact[1][role][:, others])


def test_head_costs_are_each_head_alone_and_spread_reads_them(tiny_llama, calibrated, monkeypatch):
    """measure_heads prices, per window and layer, each head of each role alone and averages over
    the windows; on the tiny model the fast measure's value heads add up to about the slot."""
    windows, codecs, ts, full = calibrated
    codec = codecs[0]

    class Changed:  # a cost that says which head of which role was replaced, and how much
        forwards = 0

        def prepare(self, model, w):
            self.w = w

        def price(self, model, w, exact, layer, variants):
            k, v = exact[layer]
            return [float((a - k).abs().sum() + 10 * (b - v).abs().sum()) + layer for a, b in variants]

    monkeypatch.setitem(PRICERS, "changed", Changed)
    with torch.no_grad():
        fake = measure_heads(tiny_llama, windows, codec, ts[codec.name], "random ids", measure="changed")
        real = measure_heads(tiny_llama, windows[:1], codec, ts[codec.name], "random ids")
        want = []
        for w in windows:
            exact = cache_layers(w.context)
            recon = cache_layers(ts[codec.name](w.context)[0])
            want.append([(exact[5][r][:, h] - recon[5][r][:, h]).abs().sum() * (1, 10)[r] + 5 for r in range(2) for h in range(4)])
    assert torch.allclose(torch.tensor(fake.kl[5]), torch.tensor(want).mean(0).view(2, 4).float(), rtol=1e-6)
    assert len(real.kl) == 22 and all(len(h) == 4 for layer in real.kl for h in layer)
    assert real.forwards == 22 and real.candidate == codec.spec and real.measure == "fast"
    assert min(min(h) for layer in real.kl for h in layer) > 0
    # values: their heads add up to about the slot (the random model's key costs, ~1e-8 nats, are
    # below the fast measure's float32 floor; real models' are 1e-4 and up)
    ratio = torch.tensor([sum(real.kl[la][1]) / full.kl[la][1][0] for la in range(22)])
    assert 0.5 < float(ratio.median()) < 2.0
    made = HeadSensitivity("x", [[[1.0, 12.0], [2.0, 3.0]], [[0.0, 0.0], [0.0, 5.0]]], "c", 1, "full")
    assert made.spread(0, 0) == 12.0 and made.spread(1, 0) == 1.0 and made.spread(1, 1) == float("inf")
    assert made.spread_slots() == [(0, 0), (1, 1)] and made.share([(0, 0)]) == pytest.approx(13 / 23)


def test_two_part_kl_is_the_kl_of_the_renormalised_variant_and_stays_finite():
    """The fast measure's KL over (tokens, the rest) equals the definition on small changes, and a
    variant that breaks the model (a logit moving by hundreds) gets a large finite cost, not inf
    (Qwen2.5's layer-0 keys under rot3 came out as inf before)."""
    torch.manual_seed(0)
    p = torch.rand(3, 5, dtype=torch.float64)
    p = p / p.sum(-1, keepdim=True) * 0.9
    mass = torch.full((3,), 0.1, dtype=torch.float64)

    def definition(d, shift):
        full = torch.cat([p, mass.unsqueeze(-1)], -1)
        logq = torch.cat([p.log() - d, (mass.log() + shift).unsqueeze(-1)], -1)
        return (full * (full.log() - torch.log_softmax(logq, -1))).sum(-1)

    d, shift = torch.randn(3, 5, dtype=torch.float64) * 0.01, torch.randn(3, dtype=torch.float64) * 0.01
    assert torch.allclose(two_part_kl(p, d, mass, shift), definition(d, shift), rtol=1e-9)
    d[1, 0], shift = -800.0, torch.tensor([800.0, 1.0, -900.0], dtype=torch.float64)
    got = two_part_kl(p, d, mass, shift)
    assert torch.isfinite(got).all() and got.min() > 50
    assert torch.allclose(got, definition(d, shift), rtol=1e-9)


def test_per_head_estimate_never_costs_more_than_the_slot_plan():
    """Heads free to differ within a slot can always take the slot's choice (their bytes, floor
    shares, add up to at most the slot's), so the per-head plan's KL is at most the slot plan's;
    with one head per slot the two are the same knapsack."""
    rng = random.Random(5)
    layers, cands = 6, 3
    kl = [[sorted((rng.random() for _ in range(cands)), reverse=True) for _ in range(2)] for _ in range(layers)]
    nbytes = [[[1000 * (c + 2) for c in range(cands)] for _ in range(2)] for _ in range(layers)]
    s = Sensitivity(candidates=["a", "b", "c"], names=["a", "b", "c"], kl=kl, stored_bytes=nbytes,
                    elements=[[2000, 2000] for _ in range(layers)], calibration="x", targets=1)
    one = HeadSensitivity("a", [[[1.0], [1.0]] for _ in range(layers)], "x", 1, "fast")
    three = HeadSensitivity("a", [[[rng.random() for _ in range(3)] for _ in range(2)] for _ in range(layers)], "x", 1, "fast")
    for budget in (10.0, 12.0, 14.0):
        slots, heads = per_head_estimate(s, one, budget, scale=1)
        assert heads == pytest.approx(slots)
        slots, heads = per_head_estimate(s, three, budget, scale=1)
        assert heads <= slots + 1e-12
    assert per_head_estimate(s, three, 12.0, scale=1)[1] < per_head_estimate(s, three, 12.0, scale=1)[0]
    with pytest.raises(ValueError, match="below the cheapest"):
        per_head_estimate(s, three, 1.0)


def test_a_per_head_allocation_prices_each_head_and_its_spec_stores_it(tiny_llama, calibrated, tmp_path):
    """``heads=on``: every KV head of every slot priced alone under every candidate (the slot table
    unchanged), a candidate allotted per head within the budget, and the spec's head overrides
    reconstruct each head as its candidate does."""
    windows, codecs, ts, sens = calibrated
    with torch.no_grad():
        per = measure_sensitivity(tiny_llama, windows[:1], codecs, ts, "random ids", measure="fast", heads=True)
    nh = cache_layers(windows[0].context)[0][0].shape[1]
    assert len(per.head_kl) == 22 and nh > 1
    assert all(len(per.head_kl[la][r]) == nh and len(per.head_kl[la][r][h]) == 3 and min(per.head_kl[la][r][h]) >= 0
               for la in range(22) for r in range(2) for h in range(nh))
    w = windows[0]  # one head's cost is the KL with that head alone replaced, as the pricer measures it
    exact = cache_layers(w.context)
    k = exact[5][0].clone()
    k[:, 1] = cache_layers(ts[codecs[0].name](w.context)[0])[5][0][:, 1]
    pricer = FastPricer()
    with torch.no_grad():
        pricer.prepare(tiny_llama, w)
        alone = pricer.price(tiny_llama, w, exact, 5, [(k, exact[5][1])])[0]
    assert per.head_kl[5][0][1][0] == pytest.approx(alone, rel=1e-4, abs=1e-9)
    assert Sensitivity.from_dict(per.to_dict()) == per
    a = allocate(per, 3.25)
    assert 2.25 < a.bits <= 3.25 and len(a.head_choice) == 22 and "h" in a.spec.split(",", 2)[-1]
    mix = resolve_codec(a.spec)
    assert mix.heads  # some heads differ from their slot
    tsm, _ = cache_transforms([mix], tmp_path, "tiny")
    w = windows[1]
    mixed, metrics = tsm[mix.name](w.context)
    recon = {c.name: cache_layers(ts[c.name](w.context)[0]) for c in codecs}
    for layer in range(22):
        for r in range(2):
            for h, c in enumerate(a.head_choice[layer][r]):
                assert torch.equal(cache_layers(mixed)[layer][r][:, h], recon[codecs[c].name][layer][r][:, h])
    assert 8 * metrics.compressed_size_bytes / metrics.num_elements == pytest.approx(a.bits, rel=1e-3)
    with pytest.raises(ValueError, match="below the cheapest"):
        allocate(per, 2.0)
    assert CalibrationConfig.from_string("heads=on").heads and not CalibrationConfig.from_string("heads=off").heads
    assert CalibrationConfig.from_string(CalibrationConfig(heads=True).to_string()).heads

"""The search over an engine's knobs: every llama.cpp -ctk/-ctv pair, fewest bits first, stopping at the
first level with a robust pass (a sweep stand-in decides the verdicts); vLLM's skipped layers under one
format, ranked by the sensitivity pass; TurboQuant's fixed rule against the measurement."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvlib.codec.spec import resolve_codec
from kvlib.runs.knobs import (print_search, LlamaCppTypes, MeasuredSkips, VllmSkipLayers, boundary_check, cheapest_setting,
                              first_fresh_window, layer_damage, levels, print_boundary_check)
from kvlib.scoring.perplexity import plan_windows


def test_llamacpp_settings_are_every_pair_in_order_of_bits():
    s = LlamaCppTypes().settings()
    assert len(s) == 49 and len({x.flags for x in s}) == 49
    assert [x.bits for x in s] == sorted(x.bits for x in s)
    assert s[0].flags == "-ctk q4_0 -ctv q4_0" and s[-1].flags == "-ctk f16 -ctv f16"
    assert ("k=llama.cpp:q8_0,v=llama.cpp:q4_0", 6.5) in {(x.spec, x.bits) for x in s}
    for x in s:
        resolve_codec(x.spec)  # every setting is a spec kv-compress takes


def test_search_stops_at_the_first_level_with_a_robust_pass(capsys):
    ran: list[list[str]] = []

    def sweep(specs):
        ran.append(specs)
        rows = []
        for spec in specs:
            keys_fine = spec.startswith(("llama.cpp:q8_0", "k=llama.cpp:q8_0", "llama.cpp:f16", "k=llama.cpp:f16"))
            delta = 0.1 if keys_fine else 0.9
            delta += 0.01 if "iq4_nl" in spec else 0.0
            rows.append(SimpleNamespace(name=resolve_codec(spec).name, bits_per_element=6.5, context_delta=delta,
                                        ci_low=delta - 0.1, ci_high=delta + 0.1, kld_mean=0.01, robust=keys_fine,
                                        passed=keys_fine))
        return SimpleNamespace(mode="write", threshold=0.5, schemes=rows)

    found = cheapest_setting("llama.cpp", sweep, say=lambda *a: None)
    assert found.cheapest["flags"] == "-ctk q8_0 -ctv q4_0"  # of the two at 6.5 bits, the smaller delta
    bits_of = {x.spec: x.bits for x in LlamaCppTypes().settings()}
    assert all(bits_of[x] <= 6.5 for g in ran for x in g)  # nothing costlier than the answer ran
    done = sum(len(g) for g in ran)
    assert done + found.untried == 49 and found.untried > 0 and len(found.rows) == done
    assert len(ran) == len([g for g in levels(LlamaCppTypes().settings()) if g[0].bits <= 6.5])
    # bounded below the answer: nothing passes, and what was left out is counted and said
    said: list[str] = []
    bounded = cheapest_setting("llama.cpp", sweep, say=said.append, max_bits=5.0)
    assert bounded.cheapest is None and all(r["bits_per_element"] <= 5.0 for r in bounded.rows)
    assert all(r["stored_bits_per_element"] == 6.5 for r in bounded.rows)  # what the (fake) sweep stored
    assert bounded.untried == 49 - len(bounded.rows) and bounded.max_bits == 5.0
    assert any(line.startswith("  -ctk q4_0 -ctv q4_0: ") and line.endswith("FAIL") for line in said)
    with pytest.raises(ValueError, match="every setting of llama.cpp's knob stores more"):
        cheapest_setting("llama.cpp", sweep, max_bits=1.0)
    print_search(bounded)
    assert f"passes robustly up to 5 bits/element ({bounded.untried} costlier settings not run)" in capsys.readouterr().out


def _verdicts(robust: set[str], delta: dict[str, float] | None = None, first_window: int = 0, windows: int = 8):
    """A sweep stand-in: the settings in ``robust`` pass robustly, the rest fail; ``ran`` records the calls."""
    ran: list[list[str]] = []

    def sweep(specs):
        ran.append(specs)
        rows = []
        for spec in specs:
            d = (delta or {}).get(spec, 0.3 if spec in robust else 0.9)
            rows.append(SimpleNamespace(name=resolve_codec(spec).name, bits_per_element=4.5, context_delta=d,
                                        ci_low=d - 0.1, ci_high=d + 0.1 if spec in robust else 0.6, kld_mean=0.01,
                                        robust=spec in robust, passed=spec in robust or d < 0.5))
        return SimpleNamespace(mode="write", threshold=0.5, schemes=rows, first_window=first_window, windows=windows)
    return sweep, ran


def test_a_robust_pass_that_fresh_windows_do_not_confirm_is_not_the_answer(capsys):
    """The search's first robust pass fails on fresh windows: it stays in the rows, marked, and the
    search goes on to the next robust pass of the same level, then to the next level, confirming each."""
    q40, q40_iq, iq_q40 = "llama.cpp:q4_0", "k=llama.cpp:q4_0,v=llama.cpp:iq4_nl", "k=llama.cpp:iq4_nl,v=llama.cpp:q4_0"
    q41_q40 = "k=llama.cpp:q4_1,v=llama.cpp:q4_0"
    sweep, ran = _verdicts({q40, iq_q40, q41_q40}, {q40: 0.2, iq_q40: 0.3})
    confirm, confirmed = _verdicts({iq_q40, q41_q40}, first_window=8, windows=21)
    found = cheapest_setting("llama.cpp", sweep, say=lambda *a: None, confirm=confirm)
    # q4_0 (the smaller delta) is tried first and fails on fresh windows; iq4_nl/q4_0 holds
    assert [c[0] for c in confirmed] == [q40, iq_q40] and len(ran) == 1
    assert found.cheapest["spec"] == iq_q40 and found.cheapest["confirmed"] is True
    assert [r["confirmed"] for r in found.rows if "confirmed" in r] == [False, True]
    assert [(c["spec"], c["robust"], c["first_window"], c["windows"]) for c in found.confirmations] == [
        (q40, False, 8, 21), (iq_q40, True, 8, 21)]
    print_search(found)
    out = capsys.readouterr().out
    assert "pass (robust), not confirmed on fresh windows" in out and "on fresh windows 8-28" in out
    assert "cheapest that passes robustly, confirmed on fresh windows: -ctk iq4_nl -ctv q4_0" in out
    # nothing holds at 4.5 bits: the search goes on to the next level, and confirms there
    confirm, confirmed = _verdicts({q41_q40})
    found = cheapest_setting("llama.cpp", sweep, say=lambda *a: None, confirm=confirm)
    assert found.cheapest["spec"] == q41_q40 and len(found.confirmations) == 3
    # without a confirmation, the first robust pass is the answer, as before
    assert cheapest_setting("llama.cpp", sweep, say=lambda *a: None).cheapest["spec"] == q40


def test_fresh_windows_begin_past_the_search_and_its_calibration():
    plan = plan_windows(20_000, 2048, 512)
    assert first_fresh_window(plan, 8) == 8
    # a calibration read tokens [5120, 9216): windows whose targets touch them are skipped
    first = first_fresh_window(plan, 8, [(5120, 9216)])
    w = plan[first]
    assert w.end - w.num_targets >= 9216 and plan[first - 1].end > 5120
    with pytest.raises(ValueError, match="no fresh window left to confirm on"):
        first_fresh_window(plan, 8, [(0, 20_000)])


def test_search_names_the_engines_it_knows():
    with pytest.raises(ValueError, match="knob search knows llama.cpp, vllm"):
        cheapest_setting("sglang", lambda specs: None)
    with pytest.raises(ValueError, match="vllm's knob needs a format"):
        cheapest_setting("vllm", lambda specs: None)


def test_cli_knobs_needs_an_engine(capsys):
    from kvlib.cli import main

    assert main(["--knobs"]) == 2
    assert "--knobs needs --engine" in capsys.readouterr().err


def test_cli_runs_the_search_in_write_mode_and_prints_the_flags(tiny_dir, tmp_path, monkeypatch, capsys):
    """End to end on the tiny model: a two-setting engine whose cheaper setting fails and whose f16
    passes exactly; the JSON names the flags, and the costlier level ran only because the first failed."""
    import json

    from kvlib.cli import main
    from kvlib.runs import knobs

    class Two:
        def settings(self):
            return [knobs.Setting("llama.cpp:q4_0/norot", "-ctk q4_0 -ctv q4_0", 4.5),
                    knobs.Setting("llama.cpp:f16", "-ctk f16 -ctv f16", 16.0)]

    monkeypatch.setitem(knobs.KNOBS, "tiny-engine", Two)
    out = tmp_path / "knobs.json"
    argv = ["--model", str(tiny_dir / "model"), "--corpus", str(tiny_dir / "corpus.txt"), "--context-length", "96",
            "--stride", "32", "--max-windows", "6", "--engine", "tiny-engine", "--knobs", "--results", str(tmp_path / "r"),
            "--threshold", "1e-9", "--confirm-windows", "5", "--json", str(out)]
    assert main(argv) == 0
    d = json.loads(out.read_text())
    # f16 (exact) passes again on five windows past the search's six
    assert [(c["first_window"], c["windows"], c["robust"]) for c in d["confirmations"]] == [(6, 5, True)]
    assert d["mode"] == "write" and [r["flags"] for r in d["rows"]] == ["-ctk q4_0 -ctv q4_0", "-ctk f16 -ctv f16"]
    assert not d["rows"][0]["robust"] and d["cheapest"]["flags"] == "-ctk f16 -ctv f16"
    printed = capsys.readouterr().out
    assert "cheapest that passes robustly, confirmed on fresh windows: -ctk f16 -ctv f16" in printed
    assert "(gate 1e-09)" in printed
    assert d["threshold"] == 1e-9
    assert main(argv[:-8] + ["--max-windows", "3", "--knobs"]) == 2  # no CI below 5 windows: refused up front
    assert main(argv[:-4] + ["--confirm-windows", "4"]) == 2  # nor for a confirmation
    assert main(argv[:-4] + ["--confirm-windows", "500"]) == 2  # more fresh windows than the corpus has
    assert "windows left past the search's" in capsys.readouterr().err


# vLLM: --kv-cache-dtype X --kv-cache-dtype-skip-layers ...

def _table(damage_k, damage_v=None):
    """A sensitivity table's shape (kl[layer][role][candidate]) with one candidate."""
    damage_v = damage_v or [0.0] * len(damage_k)
    return SimpleNamespace(kl=[[[k], [v]] for k, v in zip(damage_k, damage_v)])


def _knob(fmt, damage_k, damage_v=None, per_sweep=None):
    asked = []

    def measure(spec_for):
        asked.append(spec_for(len(damage_k)))
        return _table(damage_k, damage_v)

    return VllmSkipLayers(fmt, measure, per_sweep), asked


def test_vllm_settings_skip_the_measured_worst_layers_first():
    # layer 2 damages most (its K and V added), then 4, then 0; ties go to the lower layer
    knob, asked = _knob("fp8", [0.3, 0.1, 0.2, 0.0, 0.5, 0.1], [0.0, 0.0, 0.5, 0.0, 0.0, 0.0])
    s = knob.settings()
    assert asked == ["vllm:fp8"]  # measured once, the format on every layer
    assert knob.ranking() == [2, 4, 0, 1, 5, 3] and knob.rule() == []
    assert [x.skipped for x in s[:4]] == [(), (2,), (2, 4), (0, 2, 4)] and len(s) == 7
    assert [x.flags for x in s[:3]] == ["--kv-cache-dtype fp8", "--kv-cache-dtype fp8 --kv-cache-dtype-skip-layers 2",
                                         "--kv-cache-dtype fp8 --kv-cache-dtype-skip-layers 2 4"]
    assert [x.bits for x in s] == pytest.approx([(8 * (6 - k) + 16 * k) / 6 for k in range(7)])
    assert s[0].spec == "vllm:fp8" and s[2].spec == "vllm:fp8,kv2=none,kv4=none"
    assert resolve_codec(s[3].spec) == resolve_codec("vllm:fp8,kv0=none,kv2=none,kv4=none")
    assert resolve_codec(s[-1].spec).spec == resolve_codec("vllm:fp8,kv0-5=none").spec
    # docs/engines.md: --kv-cache-dtype-skip-layers 0 1 is vllm:fp8,kv0-1=none
    assert knob.spec([1, 0]) == "vllm:fp8,kv0-1=none" and knob.flags([1, 0]).endswith("-skip-layers 0 1")
    nv, _ = _knob("vllm:nvfp4", [0.0] * 4)  # by the kv-compress name too
    assert nv.settings()[1].bits == pytest.approx((3 * 4.5 + 16) / 4) and nv.flag == "--kv-cache-dtype nvfp4"
    with pytest.raises(ValueError, match="vllm format 'fp9': choose one of fp8, "):
        VllmSkipLayers("fp9", lambda spec_for: None)


def test_turboquant_settings_add_to_the_boundary_rule_and_are_measured_on_every_layer():
    knob, asked = _knob("turboquant_3bit_nc", [0.9, 0.1, 0.2, 0.6, 0.3, 0.0, 0.4, 0.5])
    assert knob.rule() == [0, 1, 6, 7] and knob.ranking() == [3, 4, 2, 5]
    assert asked == ["none,k0-7=vllm:turboquant_k3_nc,v0-7=vllm:turboquant_v3"]  # boundary layers priced too
    s = knob.settings()
    assert len(s) == 5 and s[0].spec == "vllm:turboquant_3bit_nc" and s[0].skipped == (0, 1, 6, 7)
    assert s[0].flags == "--kv-cache-dtype turboquant_3bit_nc" and s[0].bits == pytest.approx((4 * 3.1875 + 4 * 16) / 8)
    assert s[1].flags == "--kv-cache-dtype turboquant_3bit_nc --kv-cache-dtype-skip-layers 3"
    assert resolve_codec(s[1].spec).layers == resolve_codec("vllm:turboquant_3bit_nc,kv3=none").layers
    m = MeasuredSkips(knob).settings()  # every layer, the rule set aside: 0 is the worst
    assert [x.skipped for x in m[:3]] == [(), (0,), (0, 3)] and len(m) == 9
    assert m[0].spec == "none,k0-7=vllm:turboquant_k3_nc,v0-7=vllm:turboquant_v3"
    assert m[2].spec == "none,k1-2=vllm:turboquant_k3_nc,k4-7=vllm:turboquant_k3_nc,v1-2=vllm:turboquant_v3,v4-7=vllm:turboquant_v3"
    assert m[2].flags == "(not a vLLM setting) skip 0 3" and m[0].flags == "(not a vLLM setting) skip none"
    for x in m + s:
        resolve_codec(x.spec)  # every setting is a spec kv-compress takes
    rule = MeasuredSkips(knob).setting([7, 6, 1, 0])  # a skip set holding the rule is vLLM's own setting
    assert rule == s[0]


def _skipped(spec, n):
    """The layers a spec leaves exact (what the fake sweep judges by)."""
    c = resolve_codec(spec)
    over = {(o.layer, o.role): o.scheme.method for o in c.layers}
    rule = set(range(2)) | set(range(n - 2, n)) if c.key.method.startswith("vllm:turboquant") else set()
    return {i for i in range(n) if over.get((i, "key"), "none" if i in rule or c.key.method == "none" else "q") == "none"}


def _sweep(n, needs, ran):
    def sweep(specs):
        ran.append(list(specs))
        rows = []
        for spec in specs:
            ok = needs <= _skipped(spec, n)
            d = 0.1 if ok else 0.9
            rows.append(SimpleNamespace(name=resolve_codec(spec).name, bits_per_element=4.0, context_delta=d,
                                        ci_low=d - 0.1, ci_high=d + 0.1, kld_mean=0.01, robust=ok, passed=ok))
        return SimpleNamespace(mode="write", threshold=0.5, schemes=rows)
    return sweep


def test_vllm_search_runs_a_few_k_a_sweep_and_stops_at_the_first_robust_pass():
    knob, _ = _knob("int4_per_token_head", [0.1, 0.5, 0.2, 0.4, 0.3, 0.0], per_sweep=4)  # order 1 3 4 2 0 5
    ran = []
    found = cheapest_setting("vllm", _sweep(6, {1, 3}, ran), say=lambda *a: None, knob=knob)
    assert found.cheapest["flags"] == "--kv-cache-dtype int4_per_token_head --kv-cache-dtype-skip-layers 1 3"
    assert found.cheapest["skipped"] == [1, 3] and found.knob.startswith("--kv-cache-dtype int4_per_token_head")
    assert len(ran) == 1 and len(ran[0]) == 4  # k = 0..3 in one sweep
    assert [r["robust"] for r in found.rows] == [False, False, True, True]
    assert found.past == 1 and found.untried == 3 and len(found.rows) + found.untried == 7
    ran = []
    found = cheapest_setting("vllm", _sweep(6, {1, 3, 4, 2}, ran), say=lambda *a: None,
                             knob=VllmSkipLayers("int4_per_token_head", knob._measure, per_sweep=2))
    assert [len(b) for b in ran] == [2, 2, 2] and found.cheapest["skipped"] == [1, 2, 3, 4]
    assert found.past == 1 and found.untried == 1
    found = cheapest_setting("vllm", _sweep(6, {7}, []), say=lambda *a: None, knob=knob)  # nothing passes: every k ran
    assert found.cheapest is None and len(found.rows) == 7 and found.untried == 0


def test_the_ranking_comes_from_the_sensitivity_pass(tmp_path, cli):
    """On a tiny random Llama of 8 layers (test_architectures' builder): the knob's ranking is the
    sensitivity table's order of K + V cost per layer; a TurboQuant preset priced as itself shows its
    boundary layers at 0 (kv-compress keeps them exact), which is why the knob prices it on every layer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from kvlib.budget.pricing import measure_sensitivity
    from kvlib.budget.sensitivity import calibration_window
    from kvlib.transforms.codec import cache_transforms
    from test_architectures import BASE

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **{**BASE, "head_dim": 64,
                                                                              "num_hidden_layers": 8})).eval()
    ids = torch.randint(3, BASE["vocab_size"], (1, 200), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        windows = [calibration_window(model, ids, b, 96, 16) for b in (0, 100)]
    tables = {}

    def measure(spec_for):
        codec = resolve_codec(spec_for(8))
        ts, _ = cache_transforms([codec], tmp_path / str(len(tables)), "tiny")
        with torch.no_grad():
            tables[codec.spec] = measure_sensitivity(model, windows, [codec], ts, "random ids", measure="fast")
        return tables[codec.spec]

    knob = VllmSkipLayers("int4_per_token_head", measure)
    ranking = knob.ranking()
    sens = tables[resolve_codec("vllm:int4_per_token_head").spec]
    cost = [sens.kl[i][0][0] + sens.kl[i][1][0] for i in range(8)]
    assert ranking == sorted(range(8), key=lambda i: -cost[i]) and min(cost) > 0
    assert knob.settings()[3].skipped == tuple(sorted(ranking[:3]))
    tq = VllmSkipLayers("turboquant_3bit_nc", measure)
    assert tq.rule() == [0, 1, 6, 7] and min(tq.damage()) > 0  # every layer priced
    assert sorted(tq.ranking()) == [2, 3, 4, 5] and tq.ranking() == sorted([2, 3, 4, 5], key=lambda i: -tq.damage()[i])
    plain = layer_damage(measure(lambda n: "vllm:turboquant_3bit_nc"))
    assert [plain[i] for i in (0, 1, 6, 7)] == [0.0] * 4 and min(plain[2:6]) > 0


def test_the_rule_spelled_per_layer_writes_what_vllm_writes(tiny_llama, tmp_path, cli):
    """``none`` with TurboQuant's halves on layers 2..19 is the preset's own write path bit for bit, and on a
    boundary layer it quantizes where the preset keeps it exact."""
    import torch

    from kvlib.scoring.write import write_cache
    from kvlib.transforms.codec import cache_transforms

    codecs = [resolve_codec("vllm:turboquant_3bit_nc"),
              resolve_codec("none,k2-19=vllm:turboquant_k3_nc,v2-19=vllm:turboquant_v3"),
              resolve_codec("none,k0-21=vllm:turboquant_k3_nc,v0-21=vllm:turboquant_v3")]
    ts, _ = cache_transforms(codecs, tmp_path, "t", mode="write", architecture="llama")
    rule, spelled, every = (ts[c.name] for c in codecs)
    write_cache(tiny_llama, rule, [])
    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(1, 4, 8, 64, generator=g), torch.randn(1, 4, 8, 64, generator=g)
    for layer in (0, 1, 2, 19, 20, 21):
        a, b, c = (t.roundtrip_layer(layer, k, v)[:2] for t in (rule, spelled, every))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), layer
        assert torch.equal(a[0], c[0]) == (2 <= layer <= 19), layer


def test_boundary_check_verdict():
    # 8 layers; layer 0 and 3 damage most; the fake engine passes once 0 and 3 are skipped
    knob, _ = _knob("turboquant_4bit_nc", [0.9, 0.1, 0.2, 0.6, 0.3, 0.0, 0.4, 0.5], per_sweep=2)
    ran = []
    sweep = _sweep(8, {0, 3}, ran)
    searched = cheapest_setting("vllm", sweep, say=lambda *a: None, knob=knob)
    assert searched.cheapest["skipped"] == [0, 1, 3, 6, 7]  # vLLM's answer: the rule and layer 3
    ran.clear()
    c = boundary_check(knob, sweep, say=lambda *a: None, searched=searched)
    assert c.rule == [0, 1, 6, 7] and c.ranking[:4] == [0, 3, 7, 6] and c.rule_ranks == [1, 7, 4, 3]
    assert c.fewest == 2 and c.fewest_layers == [0, 3] and not c.same_layers
    assert c.rule_row["flags"] == "--kv-cache-dtype turboquant_4bit_nc" and not c.rule_row["robust"]
    assert len(ran) == 2  # k = 0..3 over every layer; the rule's row came from the knob's own search
    assert c.verdict == ("fewer layers pass: 2 (0 3) against the rule's 4; the rule's setting fails; "
                         "its layers are not the measured top 4")
    edges, _ = _knob("turboquant_4bit_nc", [0.9, 0.8, 0.1, 0.2, 0.0, 0.1, 0.7, 0.6])  # the rule is the answer
    c = boundary_check(edges, _sweep(8, {0, 1, 6, 7}, []), say=lambda *a: None)
    assert c.fewest == 4 and c.rule_row["robust"] and c.same_layers and c.rule_ranks == [1, 2, 3, 4]
    assert c.verdict == ("the rule's 4 layers are the fewest that pass; the rule's setting passes robustly; "
                         "its layers are the measured top 4")
    c = boundary_check(knob, _sweep(8, {0, 1, 6, 7}, []), say=lambda *a: None)  # measured otherwise: 7 skips
    assert c.fewest == 7 and c.rule_row["robust"] and c.verdict.startswith("the ranking needs 7 skips to pass where the rule's 4 layers do")
    with pytest.raises(ValueError, match="no fixed rule"):
        boundary_check(_knob("fp8", [0.0] * 4)[0], sweep)


def test_boundary_check_prints_like_the_search(capsys):
    knob, _ = _knob("turboquant_4bit_nc", [0.9, 0.1, 0.2, 0.6, 0.3, 0.0, 0.4, 0.5], per_sweep=2)
    print_boundary_check(boundary_check(knob, _sweep(8, {0, 3}, []), say=lambda *a: None))
    out = capsys.readouterr().out
    assert "turboquant_4bit_nc's fixed rule: skip layers 0 1 6 7 of 8" in out
    assert "measured ranks of those layers (1: most damaging): 0: 1, 1: 7, 6: 4, 7: 3" in out
    assert "cheapest that passes robustly: (not a vLLM setting) skip 0 3" in out
    assert "the rule's setting --kv-cache-dtype turboquant_4bit_nc" in out and "verdict: fewer layers pass" in out


@pytest.mark.parametrize("argv, message", [
    (["--engine", "vllm", "--knobs", "--knob-format", "fp9"], "vllm format 'fp9': choose one of fp8,"),
    (["--engine", "vllm", "--knobs"], "vllm's knob needs a format (--knob-format: fp8,"),
    (["--engine", "sglang", "--knobs"], "engine 'sglang': knob search knows llama.cpp, vllm"),
    (["--engine", "llama.cpp", "--knobs", "--knob-format", "fp8"], "llama.cpp's knobs take no format"),
    (["--engine", "vllm", "--knobs", "--knob-format", "fp8", "--boundary-check"], "fp8 has no fixed rule"),
    (["--engine", "vllm", "--knob-format", "fp8"], "--knob-format and --boundary-check go with --engine vllm --knobs"),
    (["--engine", "llama.cpp", "--max-bits", "8"], "--max-bits bounds a --knobs search"),
    (["--engine", "llama.cpp", "--knobs", "--max-bits", "0"], "--max-bits 0: outside (0, 32]"),
    (["--engine", "llama.cpp", "--max-bits", "16"], "--max-bits bounds a --knobs search"),
])
def test_cli_names_a_knob_or_format_that_does_not_exist(argv, message, capsys):
    from kvlib.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1  # one line, before anything loads


def test_a_sweep_from_a_later_window_scores_the_same_units(tiny_dir, tmp_path):
    """``first_window``: the windows from that index on, keyed as a run over all of them keys them, so a
    confirmation past a search's windows reads what a longer run already scored, and computes only those."""
    from kvlib.runs.sweep import run_sweep

    kw = dict(model=str(tiny_dir / "model"), corpus_name=str(tiny_dir / "corpus.txt"), context_length=96, stride=32,
              peers=False, verbose=False, results=tmp_path / "r", mode="write")
    later = run_sweep(["int4"], max_windows=3, first_window=4, **kw)
    assert (later.first_window, later.windows, later.timing["units_computed"]) == (4, 3, 3)
    whole = run_sweep(["int4"], max_windows=7, **kw)
    assert whole.timing["units_computed"] == 4 and whole.timing["units_reused"] == 3  # windows 4-6 were scored
    again = run_sweep(["int4"], max_windows=3, first_window=4, **kw)
    assert again.timing["units_computed"] == 0 and again.scheme("int4").context_delta == later.scheme("int4").context_delta
    with pytest.raises(ValueError, match="no window from index 500"):
        run_sweep(["int4"], max_windows=3, first_window=500, **kw)
    with pytest.raises(ValueError, match="no budget, calibration or decoding checks"):
        run_sweep(["int4"], max_windows=3, first_window=4, budget=3.0, **kw)

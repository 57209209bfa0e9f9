"""The search over an engine's knobs: every llama.cpp -ctk/-ctv pair, fewest bits first, stopping at the
first level with a robust pass (a sweep stand-in decides the verdicts)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvlib.codec.spec import resolve_codec
from kvlib.runs.knobs import LlamaCppTypes, cheapest_setting, levels


def test_llamacpp_settings_are_every_pair_in_order_of_bits():
    s = LlamaCppTypes().settings()
    assert len(s) == 49 and len({x.flags for x in s}) == 49
    assert [x.bits for x in s] == sorted(x.bits for x in s)
    assert s[0].flags == "-ctk q4_0 -ctv q4_0" and s[-1].flags == "-ctk f16 -ctv f16"
    assert ("k=llama.cpp:q8_0,v=llama.cpp:q4_0", 6.5) in {(x.spec, x.bits) for x in s}
    for x in s:
        resolve_codec(x.spec)  # every setting is a spec kv-compress takes


def test_search_stops_at_the_first_level_with_a_robust_pass():
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
        return SimpleNamespace(mode="write", schemes=rows)

    found = cheapest_setting("llama.cpp", sweep, say=lambda *a: None)
    assert found.cheapest["flags"] == "-ctk q8_0 -ctv q4_0"  # of the two at 6.5 bits, the smaller delta
    bits_of = {x.spec: x.bits for x in LlamaCppTypes().settings()}
    assert all(bits_of[x] <= 6.5 for g in ran for x in g)  # nothing costlier than the answer ran
    done = sum(len(g) for g in ran)
    assert done + found.untried == 49 and found.untried > 0 and len(found.rows) == done
    assert len(ran) == len([g for g in levels(LlamaCppTypes().settings()) if g[0].bits <= 6.5])


def test_search_names_the_engines_it_knows():
    with pytest.raises(ValueError, match="knob search knows llama.cpp"):
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
            "--threshold", "1e-9", "--json", str(out)]
    assert main(argv) == 0
    d = json.loads(out.read_text())
    assert d["mode"] == "write" and [r["flags"] for r in d["rows"]] == ["-ctk q4_0 -ctv q4_0", "-ctk f16 -ctv f16"]
    assert not d["rows"][0]["robust"] and d["cheapest"]["flags"] == "-ctk f16 -ctv f16"
    assert "cheapest that passes robustly: -ctk f16 -ctv f16" in capsys.readouterr().out
    assert main(argv[:-6] + ["--max-windows", "3", "--knobs"]) == 2  # no CI below 5 windows: refused up front

"""An option an engine refuses for a model is listed as unavailable with the engine's reason, before
any window runs, and never run as something else (kvlib.codec.preflight)."""

from __future__ import annotations

import random

import pytest
import torch

from kvlib.codec.preflight import refusals
from kvlib.codec.spec import resolve_codec
from kvlib.runs.engines import engine_tables, print_engine_tables
from kvlib.runs.sweep import AllRefused, print_sweep, run_sweep

LLAMA_TYPES = ["llama.cpp:q8_0", "llama.cpp:q5_1", "llama.cpp:q5_0", "llama.cpp:q4_1", "llama.cpp:q4_0", "llama.cpp:iq4_nl"]


def _shapes(head_dim: int, tokens: int = 64, layers: int = 2, heads: int = 2) -> list:
    return [(i, role, (1, heads, tokens, head_dim)) for i in range(layers) for role in ("key", "value")]


def test_llamacpp_refuses_its_block_types_where_32_does_not_divide_head_dim(cli):
    codecs = [resolve_codec(s) for s in ["llama.cpp:f16", *LLAMA_TYPES, "int4", "exllamav2:q4"]]
    refused = refusals(codecs, _shapes(48))
    assert set(refused) == {*LLAMA_TYPES, "exllamav2:q4"}  # f16 and kvlib's int4 take head_dim 48
    assert refused["llama.cpp:q4_0"] == ('tensor "layer_0_key": llama.cpp refuses q4_0 for head_dim 48: its blocks '
                                         "of 32 must divide head_dim (src/llama-context.cpp:3851-3871)")
    assert all("\n" not in why and "preflight" not in why and "safetensors" not in why for why in refused.values())
    assert set(refusals(codecs, _shapes(96))) == {"exllamav2:q4"}  # 32 divides 96; ExLlamaV2's chunks of 64 do not
    assert refusals(codecs, _shapes(64)) == {}


def test_a_refusal_that_depends_on_the_token_count_is_found_at_the_runs_shapes(cli):
    """kvlib's q4_0 takes one head of 48 at 64 tokens (a multiple of 32 elements) but not at the 127
    a context of 256 tokens at stride 128 holds; a layer with two shapes (a sliding one's context, a
    last short window) is probed at both."""
    q4 = [resolve_codec("q4_0")]
    assert refusals(q4, _shapes(48, 64, heads=1)) == {}
    assert "multiple of 32" in refusals(q4, _shapes(48, 127, heads=1))["q4_0"]
    two = _shapes(48, 64, heads=1) + [(1, role, (1, 1, 127, 48)) for role in ("key", "value")]
    assert "layer_1" in refusals(q4, two)["q4_0"]


@pytest.fixture(scope="module")
def head_dim_48(tmp_path_factory, tiny_tokenizer):
    """A tiny Llama whose head_dim (48) llama.cpp's quantized types refuse, saved with a corpus."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from conftest import TINY_WORDS

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=48, max_position_embeddings=512)
    d = tmp_path_factory.mktemp("hd48")
    LlamaForCausalLM(cfg).eval().save_pretrained(d / "model")
    tiny_tokenizer.save_pretrained(d / "model")
    rng = random.Random(0)
    (d / "corpus.txt").write_text(" ".join(rng.choice(TINY_WORDS) for _ in range(900)))
    return d


def test_a_sweep_lists_a_refused_option_with_the_engines_reason(head_dim_48, tmp_path, capsys):
    kw = dict(model=str(head_dim_48 / "model"), corpus_name=str(head_dim_48 / "corpus.txt"), device="cpu",
              context_length=128, stride=64, max_windows=2, peers=False, verbose=False, results=tmp_path / "store",
              mode="write")
    r = run_sweep(["llama.cpp:f16", "llama.cpp:q4_0"], **kw)
    q4 = r.scheme("llama.cpp:q4_0")
    assert q4.error.startswith("unavailable for this model: ") and "refuses q4_0 for head_dim 48" in q4.error
    assert q4.verdict_text == "not run" and not q4.passed and r.scheme("llama.cpp:f16").passed
    assert r.timing["units_computed"] == 2  # f16's two windows; q4_0 never ran
    rows = {row["option"]: row for row in r.engines["llama.cpp"]["rows"]}
    assert rows["llama.cpp:q4_0"]["verdict"] == "unavailable" and "blocks of 32" in rows["llama.cpp:q4_0"]["unavailable"]
    assert rows["llama.cpp:q4_0"]["flags"] == "-ctk q4_0 -ctv q4_0"
    assert r.engines["llama.cpp"]["cheapest"] != "llama.cpp:q4_0"
    print_sweep(r)
    out = capsys.readouterr().out
    assert "llama.cpp:q4_0 unavailable for this model: " in out and "refuses q4_0 for head_dim 48" in out
    with pytest.raises(AllRefused, match="refuses every scheme for this model's cache: llama.cpp:q8_0: ") as e:
        run_sweep(["llama.cpp:q8_0"], **kw)
    assert [r.name for r in e.value.rows] == ["llama.cpp:q8_0"] and "blocks of 32" in e.value.rows[0].error


def test_a_knob_level_the_engine_refuses_whole_is_recorded_and_the_search_goes_on(head_dim_48, tmp_path):
    """llama.cpp on head_dim 48: every quantized -ctk/-ctv pair is refused, so the search's levels
    are rows that say why, and the only setting it can run, f16, is its answer."""
    from kvlib.runs.knobs import cheapest_setting
    from kvlib.runs.sweep import run_sweep

    kw = dict(model=str(head_dim_48 / "model"), corpus_name=str(head_dim_48 / "corpus.txt"), device="cpu",
              context_length=128, stride=64, max_windows=5, peers=False, verbose=False, results=tmp_path / "s",
              mode="write")
    found = cheapest_setting("llama.cpp", lambda specs: run_sweep(specs, **kw), say=lambda *a: None)
    refused = [r for r in found.rows if r.get("unavailable")]
    assert refused and all("refuses" in r["unavailable"] and "head_dim 48" in r["unavailable"] for r in refused)
    assert found.cheapest is not None and found.cheapest["flags"] == "-ctk f16 -ctv f16"


def test_an_engine_table_with_nothing_that_passes_says_so(capsys):
    from kvlib.runs.sweep import SchemeResult

    rows = [SchemeResult(name=n, spec=n, kind="kvq", mode="write", error="unavailable for this model: it refuses")
            for n in ("llama.cpp:q4_0", "exllamav3:4")]
    tables = engine_tables(rows, "write")
    assert tables["llama.cpp"]["cheapest"] is None and tables["llama.cpp"]["rows"][0]["unavailable"] == "it refuses"
    print_engine_tables(tables)
    out = capsys.readouterr().out
    assert "cheapest option that passes in llama.cpp: none" in out
    assert "across engines (cheapest passing option each): none passes robustly" in out


def test_the_report_shows_the_reason_and_the_other_mode():
    from kvlib.report.sweep import engine_tables as html_tables

    rows = [{"option": "llama.cpp:q8_0", "flags": "-ctk q8_0 -ctv q8_0", "scales": "", "bits_per_element": 8.5,
             "context_delta": 0.0123, "ci_low": 0.001, "ci_high": 0.02, "kld_mean": 0.0001, "top1_agreement": 99.1,
             "saturated": 0, "verdict": "PASS (robust)", "robust": True,
             "beside": {"mode": "prefix", "context_delta": -0.0042, "ci_low": -0.01, "ci_high": 0.002}},
            {"option": "llama.cpp:q4_0", "flags": "-ctk q4_0 -ctv q4_0", "scales": "", "verdict": "unavailable",
             "robust": False, "unavailable": "llama.cpp refuses q4_0 for head_dim 48 <here>"}]
    page = html_tables({"engines": {"llama.cpp": {"version": "v", "mode": "write", "rows": rows,
                                                  "cheapest": "llama.cpp:q8_0", "cheapest_flags": "-ctk q8_0 -ctv q8_0"}}}).data
    assert "Δ gated, prefix mode [CI]" in page and "-0.0042 [-0.0100, +0.0020]" in page
    assert "unavailable for this model: llama.cpp refuses q4_0 for head_dim 48 &lt;here&gt;" in page
    assert page.count("<tr>") == 3  # the header and both options

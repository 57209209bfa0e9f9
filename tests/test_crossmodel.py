"""The cross-model report (make zoo) on two tiny random-weight models of different
layouts (Gemma-3 with sliding and global layers, Llama with full attention), saved
as Hugging Face directories: every table cell equals the sweeps' JSON."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from test_architectures import ARCHS, BASE, word_corpus
from transformers import AutoConfig, AutoModelForCausalLM

from kvlib.runs import crossmodel
from kvlib.report import crossmodel as crossmodel_report
from kvlib.report.common import fmt
from kvlib.scoring.stats import spearman as _spearman


@pytest.fixture(scope="module")
def result(tmp_path_factory, tiny_tokenizer, cli):
    dirs = []
    for arch in ("gemma3", "llama"):
        d = tmp_path_factory.mktemp(f"tiny-{arch}")
        model_type, kw = ARCHS[arch]
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(model_type, **{**BASE, **kw, "vocab_size": len(tiny_tokenizer)})
        AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
        tiny_tokenizer.save_pretrained(d)
        dirs.append(str(d))
    corpus = word_corpus(tmp_path_factory.mktemp("corpus") / "words.txt", 900, seed=2)
    r = crossmodel.run_models(dirs, ["q8_0", "int4", "kivi2"], corpus_name=str(corpus), max_windows=3, stride=64,
                              context_length=160, peers=False, verbose=False, budget="4.25")
    out = tmp_path_factory.mktemp("zoo") / "zoo.json"
    r.to_json(out)
    return r, json.loads(out.read_text()), dirs


def test_one_sweep_per_model_same_targets(result):
    r, d, dirs = result
    assert [s["model_spec"] for s in d["sweeps"]] == dirs
    assert [s["kv_geometry"]["layers"] for s in d["sweeps"]] == [
        "3 sliding (window 32) + 1 full-attention layers", "4 full-attention layers"]
    assert {s["windows"] for s in d["sweeps"]} == {3}
    assert set(d["snr_correlation"]["per_model"]) == set(dirs)
    assert d["timing"]["total_s"] >= sum(d["timing"][f"{m}_s"] for m in dirs) * 0.99


def test_delta_table_equals_the_json(result):
    _, d, dirs = result
    headers, rows = crossmodel_report.delta_rows(d)
    assert headers == ["scheme", "bits/elem", *dirs]
    by = {(sw["model_spec"], s["name"]): s for sw in d["sweeps"] for s in sw["schemes"]}
    assert [row[0] for row in rows] == ["q8_0", "int4", "kivi2", "mix@4.25"]
    assert rows[-1][1] == "≤ 4.25"  # each model plans its own mix: the bits are in its cell
    for m, cell in zip(dirs, rows[-1][2:]):
        assert f"{by[(m, 'mix@4.25')]['bits_per_element']:.3f} bits stored" in cell
        assert by[(m, "mix@4.25")]["bits_per_element"] <= 4.25
    for row in rows:
        for m, cell in zip(dirs, row[2:]):
            s = by[(m, row[0])]
            shown = re.search(r">([+-][0-9.]+)<", cell).group(1)
            assert shown == f"{s['context_delta']:+.3f}"
            assert f"[{fmt(s['ci_low'], '+.3f')}, {fmt(s['ci_high'], '+.3f')}]" in cell
            assert f"KLD {s['kld_mean']:.4f}" in cell
    geo = crossmodel_report.geometry_rows(d)
    assert [g[5] for g in geo] == [sw["kv_geometry"]["layers"] for sw in d["sweeps"]]
    assert [g[3] for g in geo] == ["1 / 4", "2 / 4"]


def test_readings_and_plot(result):
    r, d, _ = result
    text = crossmodel_report.snr_reading(d)
    pooled = d["snr_correlation"]["pooled"]["key_snr"]
    assert f"key SNR {pooled:+.2f}" in text and "Within each model" in text
    fig = crossmodel_report.plot_snr_vs_kld(r)
    assert fig.png[:8] == b"\x89PNG\r\n\x1a\n" and "rank correlation" in fig.alt
    banner = crossmodel_report.banner(d).data
    assert f"of {len(d['sweeps'])} models have a robust scheme" in banner


def test_spearman():
    assert _spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert _spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert _spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)  # ties share ranks (scipy)
    assert math.isnan(_spearman([1, 2], [2, 1])) and math.isnan(_spearman([1, 1, 1], [1, 2, 3]))
    assert _spearman([1, None, 3, 4, float("nan")], [1, 5, 2, 3, 9]) == pytest.approx(1.0)


def test_bad_model_fails_before_any_sweep(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        crossmodel.run_models(["embedded", str(tmp_path / "nope.gguf")], ["int4"], verbose=False)


def test_saved_ruler_runs_give_the_zoo_its_ruler_columns(result, tmp_path):
    """RULER runs attach to the sweep of the model they ran on (lengths merge) and every RULER
    cell is that run's average over the qualifying tasks; a run of another model is refused."""
    from test_ruler import made_result

    _, d, dirs = result
    zoo = crossmodel.CrossModelResult(**{k: json.loads(json.dumps(d[k])) for k in
                                         crossmodel.CrossModelResult.__dataclass_fields__})
    assert crossmodel_report.ruler_table(zoo) is None and "ZOO_RULER_LENGTHS" in crossmodel_report.ruler_reading(zoo)
    r4 = made_result()
    r4.config["model"] = dirs[1]
    r8 = crossmodel.RulerResult.from_dict(json.loads(json.dumps(r4.to_dict()).replace("1024", "2048")))
    paths = []
    for i, r in enumerate((r4, r8)):
        paths.append(tmp_path / f"ruler{i}.json")
        paths[-1].write_text(json.dumps(r.to_dict()))
    crossmodel.attach_ruler(zoo, paths)
    assert "ruler" not in zoo.sweeps[0] and zoo.sweeps[1]["ruler"]["lengths"] == [1024, 2048]
    headers, rows = crossmodel_report.ruler_rows(zoo)
    assert headers == ["cache", f"{dirs[1]} · 1K", f"{dirs[1]} · 2K"]
    assert [row[0] for row in rows] == ["exact", "int4"]  # the zoo's schemes the run has; presses left out
    for row, name in zip(rows, ("exact", "int4")):
        acc, lo, hi = r4.average(name, 1024, qualifying_only=True)
        assert row[1] == row[2] and f">{acc:.0f} %<" in row[1] and f"[{lo:.0f}, {hi:.0f}]" in row[1]
    assert "at 1K: 1 of 2 tasks (niah_single_1)" in crossmodel_report.ruler_reading(zoo)
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(r4.to_dict(), config=dict(r4.config, model="someone-else"))))
    with pytest.raises(ValueError, match=r"other.json: a RULER run of 'someone-else'"):
        crossmodel.attach_ruler(zoo, [other])
    with pytest.raises(ValueError, match="ruler0.json.*not a kvlib RULER result"):
        paths[0].write_text("{}")
        crossmodel.attach_ruler(zoo, [paths[0]])


@pytest.fixture(scope="module")
def engine_result(result, tmp_path_factory):
    """The same two models with OCP's MX menu (mxfp8, mxfp4) swept beside, as make zoo ZOO_ENGINE=ocp."""
    _, _, dirs = result
    corpus = word_corpus(tmp_path_factory.mktemp("corpus-engine") / "words.txt", 900, seed=2)
    r = crossmodel.run_models(dirs, ["q8_0"], corpus_name=str(corpus), max_windows=3, stride=64, context_length=160,
                              peers=False, verbose=False, engine="ocp")
    out = tmp_path_factory.mktemp("zoo-engine") / "zoo.json"
    r.to_json(out)
    return crossmodel.CrossModelResult.from_json(out), dirs


def test_an_engine_menu_runs_on_every_model_in_its_mode_and_the_table_equals_the_json(engine_result):
    r, dirs = engine_result
    d = r.to_dict()
    assert r.engine == "ocp" and {f"{m}_engine_s" for m in dirs} <= set(d["timing"])
    tables = [sw["engine_tables"]["ocp"] for sw in d["sweeps"]]
    assert all(t["mode"] == "write" and {row["option"] for row in t["rows"]} == {"ocp:mxfp8_e4m3", "ocp:mxfp4"}
               for t in tables)
    assert all("beside" in row and row["beside"]["mode"] == "prefix" for t in tables for row in t["rows"])
    headers, rows = crossmodel_report.engine_rows(d)["ocp"]
    assert headers == ["option", "flags", *(f"{m} (write mode)" for m in dirs)]
    assert sorted(row[0] for row in rows[:-1]) == ["ocp:mxfp4", "ocp:mxfp8_e4m3"]
    assert rows[-1][0] == "<b>cheapest that passes</b>"
    line = {row[0]: row for row in rows}
    for t, col in zip(tables, range(2, 2 + len(dirs))):
        for row in t["rows"]:
            cell = line[row["option"]][col]
            assert fmt(row["context_delta"], "+.3f") in cell and fmt(row["bits_per_element"], ".2f") in cell
        assert rows[-1][col] == (f"<b>{t['cheapest']}</b>" if t["cheapest"] else "none passes robustly")
    assert "kvlib-zoo-engine-ocp" in crossmodel_report.engine_table(d).data


def test_no_engine_no_engine_table_and_an_unknown_engine_fails_before_any_model(result):
    r, d, dirs = result
    assert crossmodel_report.engine_table(d) is None and r.engine is None
    with pytest.raises(ValueError, match="nosuch"):
        crossmodel.run_models(dirs, ["q8_0"], engine="nosuch", verbose=False)

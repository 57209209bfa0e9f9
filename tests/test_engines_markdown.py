"""Saved --engine runs as docs/ markdown (kvlib.report.engines): recomputed from the schemes, the
other mode beside, the unavailable listed, runs of several engines merged."""

from __future__ import annotations

import dataclasses
import json
import math

from kvlib.report.engines import main, markdown, scheme_of, tables_of
from kvlib.runs.engines import engine_tables
from kvlib.runs.sweep import SchemeResult


def _scheme(name: str, bits: float, delta: float, hi: float, **kw) -> SchemeResult:
    return SchemeResult(name=name, spec=name, kind="kvq", mode="write", bits_per_element=bits, context_delta=delta,
                        ci_low=delta - 0.05, ci_high=hi, kld_mean=0.01, top1_agreement=95.0, passed=delta < 0.5,
                        robust=hi < 0.5, **kw)


def _run(schemes: list[SchemeResult], beside: list[SchemeResult] = ()) -> dict:
    d = {"model": "m", "windows": 21, "mode": "write", "schemes": [dataclasses.asdict(s) for s in schemes],
         "engines": engine_tables(schemes, "write", list(beside))}
    return json.loads(json.dumps(d, default=str).replace("NaN", "null"))  # as write_json saves NaN


def test_a_saved_run_reads_back_as_its_schemes():
    s = _scheme("llama.cpp:q5_0", 5.5, 0.129, 0.169)
    back = scheme_of(json.loads(json.dumps(dataclasses.asdict(s)).replace("NaN", "null")))
    assert back.verdict_text == s.verdict_text == "PASS (robust)" and math.isnan(back.retrieval_found)


def test_markdown_lists_both_modes_the_unavailable_and_the_cheapest(tmp_path, capsys):
    q5 = _scheme("llama.cpp:q5_0", 5.5, 0.129, 0.169)
    q4 = _scheme("llama.cpp:q4_0", 4.5, 0.507, 0.619)
    iq4 = SchemeResult(name="llama.cpp:iq4_nl", spec="llama.cpp:iq4_nl", kind="kvq", mode="write",
                       error="unavailable for this model: it refuses head_dim 48")
    run = _run([q4, q5, iq4], beside=[dataclasses.replace(q5, mode="prefix", context_delta=-0.0047)])
    text = markdown(tables_of(run))
    assert "verdict in write mode" in text and "Δ gated, prefix mode" in text
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert lines[1].startswith("| **`llama.cpp:q5_0`**") and "cheapest in llama.cpp" in lines[1] and "−0.0047" in lines[1]
    assert lines[2].startswith("| `llama.cpp:q4_0`") and lines[2].endswith("| not run |")
    assert "unavailable for this model: it refuses head_dim 48" in lines[3]
    vllm = _run([_scheme("vllm:fp8", 8, 0.24, 0.36)])
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(run))
    b.write_text(json.dumps(vllm))
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "| llama.cpp | `llama.cpp:q5_0` |" in out and "| vllm | `vllm:fp8` |" in out
    assert "| on fresh windows [95 % CI] |" in out and out.count("| not run |") >= 2  # neither was confirmed
    assert main([str(a), str(a)]) == 2 and "engine llama.cpp is in two runs" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert main([str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.json: not a saved kv-validate --engine run" in err


def test_a_run_of_one_mode_has_no_empty_column_for_the_other():
    from kvlib.report.sweep import engine_tables as html_tables

    run = _run([_scheme("llama.cpp:q5_0", 5.5, 0.129, 0.169)])
    assert "mode [95 % CI]" not in markdown(tables_of(run)) and "not run" not in markdown(tables_of(run))
    page = html_tables(run).data
    assert "mode [CI]" not in page and "not run" not in page


def test_the_cheapest_is_the_first_robust_option_that_holds_on_fresh_windows(capsys):
    from types import SimpleNamespace

    from kvlib.runs.engines import confirm_cheapest, print_engine_tables

    q4 = _scheme("llama.cpp:iq4_nl", 4.5, 0.417, 0.493)
    q5 = _scheme("llama.cpp:q5_0", 5.5, 0.145, 0.185)
    fail = _scheme("llama.cpp:q4_0", 4.5, 0.537, 0.666)
    tables = engine_tables([q4, q5, fail], "write")
    assert tables["llama.cpp"]["cheapest"] == "llama.cpp:iq4_nl"
    fresh = {"iq4_nl": _scheme("x", 4.5, 0.45, 0.53), "q5_0": _scheme("x", 5.5, 0.15, 0.21)}
    asked = []

    def confirm(specs):
        asked.append(specs)
        return SimpleNamespace(schemes=[fresh[specs[0].split(":")[1]]], first_window=21, windows=21)

    confirm_cheapest(tables, {s.name: s.spec for s in (q4, q5, fail)}, confirm, say=lambda *a: None)
    t = tables["llama.cpp"]
    assert asked == [["llama.cpp:iq4_nl"], ["llama.cpp:q5_0"]]  # fewest bits first, the failing never
    rows = {r["option"]: r for r in t["rows"]}
    assert t["cheapest"] == "llama.cpp:q5_0" and t["cheapest_flags"] == "-ctk q5_0 -ctv q5_0"
    assert rows["llama.cpp:iq4_nl"]["confirmed"] is False and rows["llama.cpp:q5_0"]["confirmed"] is True
    assert rows["llama.cpp:iq4_nl"]["confirmation"]["ci_high"] == 0.53 and "confirmation" not in rows["llama.cpp:q4_0"]
    print_engine_tables(tables)
    out = capsys.readouterr().out
    assert "cheapest option that passes in llama.cpp, confirmed on fresh windows: llama.cpp:q5_0" in out
    assert "(not confirmed)" in out
    run = _run([q4, q5, fail])
    run["engines"] = json.loads(json.dumps(tables))
    text = markdown(tables_of(run))
    assert "on 21 fresh windows +0.4500 [+0.4000, +0.5300], not confirmed" in text
    assert "| **`llama.cpp:q5_0`**" in text and "| **`llama.cpp:iq4_nl`**" not in text


def test_a_mode_without_a_ci_says_so_once_and_a_nan_output_reads_nan(capsys):
    """Five windows give prefix mode four with a compressed context: its delta shows "(no CI)" and one
    note says why; an overflowed cache's NaN delta reads NaN, not as a missing CI."""
    q5 = _scheme("llama.cpp:q5_0", 5.5, 0.134, 0.183)
    few = dataclasses.replace(q5, mode="prefix", context_delta=0.034, ci_low=float("nan"), ci_high=float("nan"))
    nan = _scheme("sglang:fp8_e4m3", 8, float("nan"), float("nan"))
    text = markdown(tables_of(_run([q5, nan], beside=[few])))
    row = next(line for line in text.splitlines() if "`llama.cpp:q5_0`" in line)
    assert row.endswith("| +0.0340 (no CI) |") and "[−" not in row.split("|")[-2]
    assert text.count("(no CI): fewer than 5 windows with a compressed context") == 1
    bad = next(line for line in text.splitlines() if line.startswith("| `sglang:fp8_e4m3`"))
    assert "| 8 | NaN |" in bad
    from kvlib.runs.engines import print_engine_tables
    print_engine_tables(engine_tables([q5], "write", [few]))
    out = capsys.readouterr().out
    assert "prefix mode +0.0340 (no CI)" in out and "nan" not in out


def test_every_measured_engine_table_in_the_docs_is_its_saved_run():
    """docs/engines.md's measured rows are what the saved runs in docs/data/engines/ render to now:
    a table edited by hand, or left behind when the renderer or a run changed, fails here."""
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    doc = (repo / "docs" / "engines.md").read_text()
    runs = sorted((repo / "docs" / "data" / "engines").glob("*.json"))
    assert runs, "no saved engine runs in docs/data/engines/"
    for path in runs:
        rows = [line for line in markdown(tables_of(json.loads(path.read_text()))).splitlines()
                if line.startswith(("| `", "| **"))]
        assert rows, f"{path.name}: renders no row"
        missing = [r for r in rows if r not in doc]
        assert not missing, f"{path.name}: {len(missing)} rendered rows not in docs/engines.md, first: {missing[0]}"

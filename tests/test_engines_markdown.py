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

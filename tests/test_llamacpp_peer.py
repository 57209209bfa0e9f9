"""The llama.cpp side-by-side's plumbing: llama-perplexity's per-chunk rows, the specs and flags of
a setting, the paired CI, and a run's JSON back into the report (the runs themselves: make
peer-llamacpp; the measured ones are under docs/data/llamacpp)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvlib.report.llamacpp import agreement
from kvlib.runs.llamacpp import (CacheTypes, ChunkRun, Comparison, SideBySide, chunk_ids, delta, delta_ci,
                                 first_difference, gguf_bos, kvlib_spec, paired_ci, parse_chunks, parse_types,
                                 reused_kvlib_side)
from kvlib.scoring.perplexity import plan_chunks

# llama-perplexity --ppl-output-type 1 on SmolLM2-135M, WikiText-2 valid, -c 2048 (first 3 rows).
ROWS = """perplexity: calculating perplexity over 8 chunks, n_ctx=2048, batch_size=2048, n_seq=1
       0  13.2507  2.584051  0.093109
    2048  13.7711  2.622570  0.064610
    4096  13.5222  2.604333  0.052284
"""


def test_chunk_nlls_from_the_running_means():
    nll = parse_chunks(ROWS, 2048)
    per = 2048 - 1024 - 1
    assert len(nll) == 3 and nll[0] == pytest.approx(2.584051 * per)
    assert sum(nll) / (3 * per) == pytest.approx(2.604333)  # the running mean after three chunks
    assert math.exp(nll[0] / per) == pytest.approx(13.2507, rel=1e-5)


def test_the_plan_is_llamacpps():
    w = plan_chunks(20_000, 2048, 8)
    assert len(w) == 8 and (w[1].begin, w[1].end, w[1].num_targets) == (2048, 4096, 1023)
    assert len(plan_chunks(5000, 2048)) == 2  # whole chunks only


def test_each_chunk_starts_with_bos_where_llamacpp_puts_it():
    """llama-perplexity replaces each chunk's first token by BOS when the tokenizer adds one (Gemma-3:
    its ids start with it); SmolLM2's adds none, and its ids stay as tokenized."""
    ids = [2] + list(range(10, 29))
    x = chunk_ids(ids, 8, 2, bos=2)[0].tolist()
    assert x[0] == 2 and x[8] == 2 and x[16] == ids[16] and x[1:8] == ids[1:8]
    assert chunk_ids(ids[1:], 8, 2, bos=2)[0].tolist() == ids[1:]  # no BOS at the start: none added
    assert chunk_ids(ids, 8, 2, bos=None)[0].tolist() == ids
    from kvlib.models.zoo import EMBEDDED
    from kvlib.models.sources import resolve_model
    src = resolve_model(EMBEDDED)
    assert gguf_bos(Path(src.path) / src.gguf_file) is not None  # named, but its tokenizer adds none


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_settings_name_their_flags_and_specs():
    assert kvlib_spec(CacheTypes("q4_0", "q4_0", True)) == "llama.cpp:q4_0"
    assert kvlib_spec(CacheTypes("q4_0", "q4_0", False)) == "llama.cpp:q4_0/norot"
    assert kvlib_spec(CacheTypes("q8_0", "f16", False)) == "k=llama.cpp:q8_0/norot,v=llama.cpp:f16"
    assert CacheTypes("q4_0", "q4_0", False).flags == "LLAMA_ATTN_ROT_DISABLE=1 llama-perplexity -ctk q4_0 -ctv q4_0"


def test_types_name_k_and_v_apart():
    """--types q4_0/f16 is the K-only setting (-ctk q4_0 -ctv f16); a bad type is one line naming it."""
    assert parse_types("q8_0,q4_0/f16") == [("q8_0", "q8_0"), ("q4_0", "f16")]
    assert CacheTypes("q4_0", "f16", True).label == "K q4_0, V f16, rotation on"
    with pytest.raises(ValueError, match="q3_k is not a llama.cpp cache type"):
        parse_types("q4_0/q3_k")


def test_paired_ci_brackets_the_difference_and_is_zero_for_equal_sides():
    base = ChunkRun([2000.0 + i for i in range(8)], 1023)
    run = ChunkRun([2100.0 + 3 * i for i in range(8)], 1023)
    assert paired_ci(run, base, run, base) == (0.0, 0.0)
    other = ChunkRun([2110.0 + 3 * i for i in range(8)], 1023)
    lo, hi = paired_ci(run, base, other, base)
    assert lo <= delta(other, base) - delta(run, base) <= hi and lo > 0


def test_each_sides_ci_brackets_its_delta():
    base = ChunkRun([2000.0 + 5 * (i % 3) for i in range(8)], 1023)
    run = ChunkRun([2050.0 + 7 * (i % 4) for i in range(8)], 1023)
    lo, hi = delta_ci(run, base)
    assert lo < delta(run, base) < hi and lo > 0


def _side_by_side() -> SideBySide:
    base = ChunkRun([2000.0 + 5 * (i % 3) for i in range(8)], 1023)
    ours_base = ChunkRun([2001.0 + 5 * (i % 3) for i in range(8)], 1023)
    r = SideBySide("m.gguf", "wikitext-2-valid", 2048, 8, base.perplexity, ours_base.perplexity, base.nll, ours_base.nll)
    for k, shift in (("q8_0", 1.0), ("q4_0", 60.0)):
        eng, ours = ChunkRun([a + shift for a in base.nll], 1023), ChunkRun([a + 1.3 * shift for a in ours_base.nll], 1023)
        r.rows.append(Comparison(CacheTypes(k, k, True), kvlib_spec(CacheTypes(k, k, True)), delta(eng, base),
                                 delta(ours, ours_base), paired_ci(eng, base, ours, ours_base), eng.perplexity,
                                 ours.perplexity, eng.nll, ours.nll, delta_ci(eng, base), delta_ci(ours, ours_base)))
    return r


def test_a_run_round_trips_through_its_json_and_old_json_gets_its_cis():
    r = _side_by_side()
    d = json.loads(json.dumps(r.to_dict()))
    assert json.loads(json.dumps(SideBySide.from_dict(d).to_dict())) == d
    for row in d["rows"]:  # a JSON written before each side's CI was kept: recomputed from the chunks
        del row["engine_ci"], row["kvlib_ci"]
    assert json.loads(json.dumps(SideBySide.from_dict(d).to_dict()))["rows"] == json.loads(json.dumps(r.to_dict()))["rows"]


def test_kvlibs_side_is_reused_only_from_the_same_gguf_tokens_and_chunks(tmp_path):
    """--kvlib-from: kvlib's NLLs of an earlier run, per setting, when the GGUF, n_ctx, chunks and token ids
    match; a one-line ValueError naming the file otherwise, or when a setting was not run."""
    r = _side_by_side()
    r.tokens = {"count": 272244, "bos_each_chunk": 2}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(r.to_dict()))
    base, q4 = CacheTypes("f16", "f16", True), CacheTypes("q4_0", "q4_0", True)
    got = reused_kvlib_side(path, Path("m.gguf"), 2048, 8, {"count": 272244, "bos_each_chunk": 2}, [base, q4])
    assert got[base].nll == r.kvlib_base_nll and got[q4].nll == r.rows[1].kvlib_nll
    with pytest.raises(ValueError, match="old.json: kvlib's side was run on"):
        reused_kvlib_side(path, Path("m.gguf"), 2048, 24, {"count": 272244, "bos_each_chunk": 2}, [base, q4])
    with pytest.raises(ValueError, match="old.json: no kvlib run of q4_0, rotation off"):
        reused_kvlib_side(path, Path("m.gguf"), 2048, 8, {"count": 272244, "bos_each_chunk": 2},
                          [base, CacheTypes("q4_0", "q4_0", False)])
    r.engine_weights, r.kvlib_from = "f32", str(path)
    assert SideBySide.from_dict(json.loads(json.dumps(r.to_dict()))).engine_weights == "f32"


def test_agreement_names_the_bound_that_governs():
    small, large = _side_by_side().rows
    assert small.agrees and agreement(small) == "met (0.02 bound)"  # 15 % of a tiny delta is below 0.02
    rel = abs(large.kvlib_delta - large.engine_delta) / large.engine_delta
    assert not large.agrees and rel > 0.15 and agreement(large) == f"<b>NOT met</b> ({rel * 100:.1f} %)"


def test_the_measured_runs_load():
    """docs/data/llamacpp holds the runs docs/engines.md quotes; the report renders them."""
    paths = sorted((Path(__file__).resolve().parents[1] / "docs" / "data" / "llamacpp").glob("*.json"))
    assert paths
    for p in paths:
        r = SideBySide.from_dict(json.loads(p.read_text()))
        assert r.rows and all(len(c.engine_nll) == len(c.kvlib_nll) == r.chunks for c in r.rows)
        assert all(c.engine_ci[0] <= c.engine_delta <= c.engine_ci[1] for c in r.rows)


def test_a_killed_comparison_cleans_up(tmp_path):
    """make peer-llamacpp's process turns SIGTERM into an exit that runs its cleanup (llama-perplexity's
    process group killed, the temporary corpus removed), as kv-validate does."""
    import signal
    import subprocess
    import sys


    code = ("import signal, tempfile, time, kvlib.env as e\n"
            "e.stop_on_sigterm()\n"
            f"with tempfile.TemporaryDirectory(prefix='kvlib-llamacpp-', dir={str(tmp_path)!r}):\n"
            "    print('ready', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert not list(tmp_path.iterdir())
    from kvlib.runs import llamacpp
    assert "stop_on_sigterm()" in Path(llamacpp.__file__).read_text()


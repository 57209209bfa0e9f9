"""The sweep: every scheme in one pass, through the real CLI, on the embedded
model; its results equal single-scheme runs exactly; the statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvlib.transforms import peer
from kvlib import dtypes
from kvlib.gates import PPL_DELTA_THRESHOLD
from kvlib.scoring.stats import KLDSummary, bootstrap_delta_ci
from kvlib.runs.sweep import SchemeResult, recommend, run_sweep
from kvlib.runs.validate import run_full_validation

# Two windows of 256 (one with a compressed context of 128 tokens): as small as a sweep with a gated window
# gets; the embedded model itself loads once for the whole test run (conftest).
SMALL = dict(corpus_name="embedded", max_windows=2, context_length=256, stride=128, verbose=False, progress=False)


@pytest.fixture(scope="module")
def small_sweep(cli):
    return run_sweep(["int4", "kivi4"], peers=True, **SMALL)


def test_sweep_of_two_schemes_and_the_peers(small_sweep):
    r = small_sweep
    names = [s.name for s in r.schemes]
    assert set(names) == {"int4", "kivi4", "hf-quanto-int4", "hf-quanto-int2"}
    assert r.windows == 2 and r.context_windows == 1 and r.context_scored_tokens == 128
    for s in r.schemes:
        assert not s.error
        assert math.isnan(s.ci_low) and math.isnan(s.ci_high) and not s.robust  # one gated window: no CI
        assert s.kld_mean > 0 and s.kld_median <= s.kld_p99 and 0 < s.top1_agreement <= 100
        assert len(s.layer_key_snr_db) == len(s.layer_value_snr_db) == r.kv_geometry["num_layers"]
        assert s.passed == (s.context_delta < PPL_DELTA_THRESHOLD)
    assert r.scheme("int4").bits_per_element == pytest.approx(4.25)
    assert r.scheme("kivi4").spec == "k=asym4/g64/channel,v=asym4/g64"
    assert r.scheme("hf-quanto-int4").bits_per_element == pytest.approx(5.0, abs=0.02)  # FP32 scale + shift per 64
    assert r.scheme("kivi4").keys["snr_db"] > r.scheme("int4").keys["snr_db"] + 6  # channel groups fix the keys
    # Ranked: passing schemes first, cheapest first; the recommendation is the cheapest robust one.
    passing = [s for s in r.schemes if s.passed]
    assert r.schemes[: len(passing)] == passing
    assert [s.bits_per_element for s in passing] == sorted(s.bits_per_element for s in passing)
    robust = [s for s in r.schemes if s.robust]
    assert r.recommended == (min(robust, key=lambda s: s.bits_per_element).name if robust else None)


def same_numbers(a, b) -> bool:
    """Equal, NaN (no CI) equal to NaN."""
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def test_a_sweep_of_enough_windows_has_a_ci_around_its_delta(tiny_dir):
    """Five gated windows (kvlib.gates.MIN_CI_UNITS) on the tiny model: a real interval that brackets the delta."""
    from kvlib.gates import MIN_CI_UNITS

    r = run_sweep(["int4"], model=str(tiny_dir / "model"), corpus_name=str(tiny_dir / "corpus.txt"), device="cpu",
                  context_length=128, stride=64, max_windows=MIN_CI_UNITS + 1, peers=False, verbose=False,
                  progress=False)
    s = r.scheme("int4")
    assert r.context_windows == MIN_CI_UNITS and s.ci_low < s.ci_high
    assert s.ci_low <= s.context_delta <= s.ci_high and s.robust == (s.passed and s.ci_high < PPL_DELTA_THRESHOLD)


def test_sweep_results_equal_single_scheme_runs_exactly(small_sweep):
    one = run_full_validation(codec="kivi4", **SMALL)
    s = small_sweep.scheme("kivi4")
    assert one.context_delta == s.context_delta and one.delta == s.delta
    assert one.compressed_perplexity == s.compressed_perplexity
    assert one.baseline_perplexity == small_sweep.baseline_perplexity
    assert same_numbers((one.ci_low, one.ci_high, one.kld_mean, one.top1_agreement),
                        (s.ci_low, s.ci_high, s.kld_mean, s.top1_agreement))
    assert one.keys == s.keys and one.compression["sums"] == s.compression["sums"]


def test_identity_transform_has_no_divergence(embedded, cli):
    """The exact cache through the split path: KLD 0 (to float rounding) and top-1 100 %."""
    from kvlib.models import corpus
    from kvlib.scoring.perplexity import score_windows

    lm, tok = embedded
    ids = corpus.tokenize(tok, corpus.load_corpus("embedded"))
    res = score_windows(lm, ids, 256, 128, {"identity": lambda c: (c, None)}, max_windows=3, progress=False)["identity"]
    ctx = [w for w in res.windows if w.compressed]
    assert len(ctx) == 2
    kld = KLDSummary.of([v for w in ctx for v in w.kld])
    assert kld.mean < 1e-6 and kld.p99 < 1e-5
    assert sum(w.top1_agree for w in ctx) == sum(w.num_targets for w in ctx)
    assert abs(res.context_delta) < 1e-3


def test_bootstrap_ci_by_hand():
    """Two windows A and B: every resample is AA, AB, BA or BB (25 % each), so the
    95 % percentile interval runs from delta(AA) to delta(BB) exactly."""
    lo, hi = bootstrap_delta_ci([10.0, 20.0], [11.0, 23.0], [5, 5], min_units=1)
    assert lo == pytest.approx(math.exp(22 / 10) - math.exp(20 / 10), rel=1e-12)
    assert hi == pytest.approx(math.exp(46 / 10) - math.exp(40 / 10), rel=1e-12)
    same = bootstrap_delta_ci([7.0] * 4, [8.0] * 4, [3] * 4, min_units=1)  # identical windows: no spread
    assert same[0] == same[1] == pytest.approx(math.exp(8 / 3) - math.exp(7 / 3))
    assert all(math.isnan(v) for v in bootstrap_delta_ci([], [], [], min_units=1))
    assert all(math.isnan(v) for v in bootstrap_delta_ci([10.0, 20.0], [11.0, 23.0], [5, 5]))  # below MIN_CI_UNITS
    k = KLDSummary.of(np.arange(101.0))
    assert (k.mean, k.median, k.p99, k.tokens) == (50.0, 50.0, 99.0, 101)


def _scheme(name, bits, delta, lo, hi, passed=None):
    s = SchemeResult(name=name, spec=name, kind="kvq", bits_per_element=bits, compression_ratio=16 / bits,
                     context_delta=delta, ci_low=lo, ci_high=hi, top1_agreement=99.0)
    s.passed = delta < PPL_DELTA_THRESHOLD if passed is None else passed
    s.robust = s.passed and hi < PPL_DELTA_THRESHOLD
    return s


def test_recommendation_is_the_cheapest_robust_scheme():
    a = _scheme("cheap-but-unsure", 3.0, 0.3, 0.1, 0.7)
    b = _scheme("robust", 4.25, 0.2, 0.1, 0.3)
    c = _scheme("robust-dearer", 8.5, 0.01, 0.0, 0.02)
    d = _scheme("fails", 2.0, 3.0, 2.5, 3.5)
    name, sentence = recommend([a, b, c, d])
    assert name == "robust" and "4.25 bits/element" in sentence and "3.76x" in sentence and "73% less" in sentence
    name, sentence = recommend([a, d])
    assert name is None and "cheap-but-unsure" in sentence and "CI crosses" in sentence
    assert recommend([d]) == (None, "No scheme keeps the model's quality: none passes the perplexity gate.")
    # A lossless twin is cheaper to store but cannot be attended to in place: named for storage, never picked.
    twin = _scheme("robust+lossless", 3.1, 0.2, 0.1, 0.3)
    b.spec, twin.spec = "sym4/g64", "sym4/g64+lossless"
    name, sentence = recommend([twin, a, b, c, d])
    assert name == "robust" and "To store or send it, robust+lossless takes 3.10 bits/element" in sentence
    # Robust only with an entropy stage (a +wire mix): no pick for memory, and the sentence says which to send.
    wired = _scheme("mix@2.667", 2.665, 0.138, 0.08, 0.2)
    wired.spec = "k=sym4/g64/rot,v=lm2/g64/rot+wire"
    name, sentence = recommend([wired, a, d])
    assert name is None and "No scheme held in memory passes robustly; to store or send the cache, mix@2.667 does: " \
        "2.67 bits/element" in sentence and "CI crosses" not in sentence
    # A spec of per-layer static scales (an engine's calibrated option) is not quoted whole.
    b.spec = "trtllm:int8," + ",".join(f"k{i}=trtllm:int8/scale0.{i:08d}" for i in range(30))
    name, sentence = recommend([b, d])
    assert name == "robust" and "Use robust (trtllm:int8,... 30 more parts: the spec in the JSON's schemes)" in sentence
    assert len(sentence) < 300


def test_missing_peer_is_reported_and_the_sweep_goes_on(monkeypatch, cli):
    monkeypatch.setattr(peer, "peer_unavailable", lambda: "optimum-quanto cannot be imported (test)")
    r = run_sweep(["int4"], peers=True, **SMALL)
    rows = {s.name: s for s in r.schemes}
    assert rows["hf-quanto-int4"].error == "optimum-quanto cannot be imported (test)"
    assert rows["hf-quanto-int4"].verdict_text == "not run" and not rows["int4"].error


def test_duplicate_and_bad_schemes_fail_first(cli):
    with pytest.raises(ValueError, match="listed twice"):
        run_sweep(["int4", "sym4/g64"], **SMALL)
    from kvlib.codec.spec import SchemeError

    with pytest.raises(SchemeError, match="unknown scheme"):
        run_sweep(["int4", "int5"], **SMALL)
    with pytest.raises(ValueError, match="dtype 'float8'"):
        dtypes.resolve_dtype("float8", "cpu")


def test_sweep_report_shows_the_result(small_sweep):
    """Banner, ranked table and plots from the SweepResult: what the notebook displays."""
    from kvlib.report import sweep as sweep_report

    r = small_sweep
    banner = sweep_report.banner(r).data
    assert r.recommendation.replace("'", "&#x27;") in banner or r.recommendation in banner
    rows = sweep_report.ranked_rows(r)
    assert [row[0] for row in rows] == [s.name for s in r.schemes]
    for row, s in zip(rows, r.schemes):
        assert row[4] == f"{s.context_delta:+.4f}" and row[1] == f"{s.bits_per_element:.3f}"
        assert row[-1].startswith("PASS" if s.passed else "FAIL")
    table = sweep_report.ranked_table(r).data
    assert table.count("<tr>") == len(r.schemes) + 1 and 'id="kvlib-sweep-table"' in table
    fr = sweep_report.frontier(r.to_dict()["schemes"])
    assert fr[0]["bits_per_element"] == min(s.bits_per_element for s in r.schemes)
    assert all(a["context_delta"] > b["context_delta"] for a, b in zip(fr, fr[1:]))
    for fig in (sweep_report.plot_pareto(r), sweep_report.plot_layer_snr(r)):
        html = fig._repr_html_()
        assert html.startswith('<img alt="') and "data:image/png;base64," in html and "kivi4" in fig.alt
        assert fig.png[:8] == b"\x89PNG\r\n\x1a\n"

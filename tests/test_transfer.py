"""The transfer view: bytes on the wire per compressed context token against quality (tiny model)."""

from __future__ import annotations

import json

import pytest

from kvlib.cli import main
from kvlib.report import transfer as report
from kvlib.runs.sweep import SchemeResult, run_sweep
from kvlib.runs.transfer import TRANSFER_PRESETS, print_transfer, transfer_schemes, transfer_table


def test_the_view_holds_the_serdes_and_each_preset_with_and_without_the_wire_stage():
    got = transfer_schemes(["lmcache:fp8", "lmcache:cachegen"])
    assert got[:2] == ["lmcache:fp8", "lmcache:cachegen"] and len(got) == 2 + 2 * len(TRANSFER_PRESETS)
    assert all(p in got and p + "+wire" in got for p in TRANSFER_PRESETS)


@pytest.fixture(scope="module")
def viewed(tiny_dir):
    return run_sweep(["lmcache:fp8", "int4", "int4+wire", "kivi2"], model=str(tiny_dir / "model"),
                     corpus_name=str(tiny_dir / "corpus.txt"), device="cpu", context_length=256, stride=128,
                     max_windows=3, peers=False, verbose=False, results=False, threshold=1e9, transfer=True)


def test_bytes_per_token_are_the_files_over_the_compressed_contexts(viewed, capsys):
    r = viewed
    # three windows of 256 at stride 128: the first compresses nothing, the others 256 - 128 - 1 tokens
    assert r.context_tokens == 2 * 127
    t = r.transfer
    rows = {row["scheme"]: row for row in t["rows"]}
    assert set(rows) == {"lmcache:fp8", "int4", "int4+wire", "kivi2"}
    for name, row in rows.items():
        comp = r.scheme(name).compression
        assert row["bytes_per_token"] == pytest.approx(comp["compressed_file_bytes"] / 254)
        assert row["times_smaller"] == pytest.approx(comp["original_size_bytes"] / comp["compressed_file_bytes"])
    assert rows["int4+wire"]["wire"] and not rows["int4"]["wire"]
    # the stage changes bytes, never quality
    assert rows["int4+wire"]["context_delta"] == rows["int4"]["context_delta"]
    assert rows["int4+wire"]["bytes_per_token"] < rows["int4"]["bytes_per_token"]
    assert [row["bytes_per_token"] for row in t["rows"]] == sorted(row["bytes_per_token"] for row in t["rows"])
    assert t["fewest"] is None  # two compressed windows give no CI: nothing passes robustly
    print_transfer(t)
    assert "fewest bytes that pass robustly: none" in capsys.readouterr().out


def test_the_fewest_bytes_that_pass_robustly_win():
    def scheme(name, sent, delta, robust):
        return SchemeResult(name=name, spec=name, kind="kvq", bits_per_element=8 * sent / 1000, context_delta=delta,
                            ci_low=delta - 0.1, ci_high=delta + 0.1, robust=robust, passed=robust,
                            compression={"compressed_file_bytes": sent, "original_size_bytes": 2000,
                                         "codec_time_ms": 2.0})
    t = transfer_table([scheme("int4", 300, 0.6, False), scheme("q8_0", 500, 0.2, True),
                        scheme("rot4+wire", 400, 0.3, True), scheme("kivi2", 100, 0.0, False)], context_tokens=10)
    assert [r["scheme"] for r in t["rows"]] == ["kivi2", "int4", "rot4+wire", "q8_0"] and t["fewest"] == "rot4+wire"
    c = t["rows"][2]
    assert c["bytes_per_token"] == 40 and c["fp16_bytes_per_token"] == 200 and c["times_smaller"] == 5
    assert c["codec_mb_s"] == pytest.approx(2000 / 1e6 / 2e-3)


def test_the_view_is_refused_in_write_mode_or_with_overrides(capsys):
    assert main(["--transfer", "--mode", "write", "--max-windows", "5"]) == 2
    assert "prefix mode" in capsys.readouterr().err
    assert main(["--transfer", "--lossless"]) == 2
    assert "--transfer compares fixed schemes" in capsys.readouterr().err


def test_the_report_draws_and_tables_the_view(viewed):
    d = json.loads(json.dumps(viewed.to_dict()))  # as the notebook reads it back from sweep.json
    table = report.transfer_table(d).data
    assert table.count("<tr") == 1 + 4 and "lmcache:fp8" in table and "none passes robustly" in table
    fig = report.plot_transfer(d)
    assert fig.png.startswith(b"\x89PNG") and "4 schemes" in fig.alt
    empty = {**d, "transfer": {}}
    assert report.transfer_table(empty).data == "" and report.plot_transfer(empty) is None

"""kv-validate / python -m kvlib: exit codes, output and JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from kvlib.cli import main


def test_quick_test_passes_and_writes_json(tmp_path, capsys, cli):
    out = tmp_path / "q.json"
    assert main(["--quick-test", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "22 layers x 4 KV heads" in text and "PASSED" in text
    data = json.loads(out.read_text())
    assert data["passed"] and data["compression_ratio"] > 3.7 and data["kv_geometry"]["num_kv_heads"] == 4
    assert data["baseline_perplexity"] is None  # NaN is written as null


def test_quick_test_can_fail(capsys, cli):
    assert main(["--quick-test", "--bits", "2", "--quiet"]) == 1
    assert capsys.readouterr().out.startswith("FAILED")


def test_bad_corpus_is_exit_2_with_a_clear_message(capsys, tmp_path):
    assert main(["--corpus", str(tmp_path / "missing.txt"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "missing.txt" in err and "Traceback" not in err


def test_python_dash_m(cli):
    proc = subprocess.run([sys.executable, "-m", "kvlib", "--quick-test", "--quiet"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("PASSED")


# --- Issue 9, items 8-10: bad parameters fail first, in one line, exit 2 -------

import pytest  # noqa: E402

from kvlib.codec import cli as bridge  # noqa: E402
from kvlib.models import sources as models


@pytest.mark.parametrize("argv, words", [
    (["--group-size", "0"], "group size 0"),
    (["--bits", "9"], "bits 9 out of range"),
    (["--scheme", "int5"], "unknown scheme"),
    (["--scheme", "kivi4", "--bits", "1"], "bits 1 out of range"),
    (["--stride", "0"], "stride 0 must be in [1, 2048]"),
    (["--stride", "4096"], "stride 4096"),
    (["--max-windows", "0"], "max_windows 0 must be at least 2"),
    (["--max-windows", "1"], "max_windows 1 must be at least 2"),
    (["--threshold", "nan"], "threshold nan is not a finite number"),
    (["--threshold", "inf"], "threshold inf"),
    (["--context-length", "1"], "context_length 1"),
])
def test_bad_parameters_fail_before_the_model_loads(argv, words, capsys, monkeypatch, cli):
    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the parameters were checked")

    monkeypatch.setattr(models, "load_model_and_tokenizer", no_model)
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err and "AssertionError" not in err


@pytest.mark.parametrize("make_path, words", [
    (lambda d: d / "afile" / "out.json", "is not a directory"),
    (lambda d: d, "is a directory"),
    (lambda d: "/proc/kvlib-out.json", "cannot write there"),
])
def test_json_path_is_checked_first(make_path, words, tmp_path, capsys, monkeypatch, cli):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setattr(models, "load_model_and_tokenizer", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    assert main(["--json", str(make_path(tmp_path)), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_binary_corpus_names_the_file(tmp_path, capsys, cli):
    bad = tmp_path / "blob.bin"
    bad.write_bytes(bytes(range(256)) * 4)
    assert main(["--corpus", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "blob.bin" in err and "not UTF-8" in err and err.count("\n") == 1


def test_cli_error_reaches_the_python_exception(tmp_path, cli):
    bad = tmp_path / "kv.safetensors"
    bad.write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    bad.write_bytes((4).to_bytes(8, "little") + b"{}  " + b"junk")
    with pytest.raises(bridge.KVCompressError) as e:
        bridge.compress_kv_cache(bad, tmp_path / "out.safetensors")
    assert str(e.value).startswith("kv-compress compress: " + str(bad)) and "not covered by any tensor" in str(e.value)
    assert e.value.returncode == 2 and not (tmp_path / "out.safetensors").exists()


def test_a_hung_cli_times_out(tmp_path, monkeypatch):
    fake = tmp_path / "kv-compress"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("KV_COMPRESS_PATH", str(fake))
    monkeypatch.setattr(bridge, "TIMEOUT_BASE_S", 0.5)
    src = tmp_path / "in.safetensors"
    src.write_bytes(b"x" * 100)
    with pytest.raises(TimeoutError, match="did not finish within 1 s"):
        bridge.decompress_kv_cache(src, tmp_path / "out.safetensors")


def test_too_short_corpus_is_an_input_error(tmp_path, capsys, cli):
    short = tmp_path / "short.txt"
    short.write_text("Ten words of text are far too few to score here.")
    assert main(["--corpus", str(short), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "short.txt" in err and "too short for a window with a compressed context" in err


def test_sigterm_ends_a_run_as_ctrl_c_does():
    """kv-validate turns SIGTERM into SystemExit(143), so every with-block and finally runs
    (temporary directories, the codec server): a killed run leaves nothing behind."""
    import signal

    from kvlib import env
    from kvlib.cli import main

    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert main(["--list-models"]) == 0
        handler = signal.getsignal(signal.SIGTERM)
        assert handler is env._raise_exit
        with pytest.raises(SystemExit) as e:
            handler(signal.SIGTERM, None)
        assert e.value.code == 143
    finally:
        signal.signal(signal.SIGTERM, previous)

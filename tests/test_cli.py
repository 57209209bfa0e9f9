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

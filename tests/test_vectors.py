"""The shared test vectors: the NumPy reference must still produce the
committed file, and the Go CLI must reproduce it bit for bit (go test checks
the Go package against the same file)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from safetensors import safe_open

import make_vectors
from kvq_reference import pack, quantize
from vector_files import write_inputs

CASES = json.loads(make_vectors.OUT.read_text())["cases"]
NP_DTYPES = {"F32": np.float32, "F16": np.float16}


def test_committed_vectors_match_the_reference():
    assert make_vectors.OUT.read_text() == make_vectors.render(), "run `python tests/make_vectors.py` and commit"


def test_vectors_cover_the_spec():
    names = {c["name"] for c in CASES}
    for needed in ("ties_half_to_even", "zero_group", "short_last_group", "f16_input", "bf16_input", "scale_overflow"):
        assert needed in names
    ties = next(c for c in CASES if c["name"] == "ties_half_to_even")
    assert ties["codes"][:4] == [0, 2, 2, 4]  # 0.5, 1.5, 2.5, 3.5 with scale 1: half to even


def test_reference_pack_layout():
    assert pack(np.array([1, -1, 7], np.int8), 4) == bytes([0xF1, 0x07])
    codes, scales, recon = quantize(np.array([0.5, 1.5, -7], np.float32), 4, 64)
    assert codes.tolist() == [0, 2, -7] and scales.view(np.float16)[0] == 1.0


def _write_case(case, path):
    """Write a vector case's input as a safetensors file (BF16 through raw bytes)."""
    raw = bytes.fromhex(case["input_hex"])
    header = {"t": {"dtype": case["dtype"], "shape": case["shape"], "data_offsets": [0, len(raw)]}}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(len(h).to_bytes(8, "little") + h + raw)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_cli_reproduces_vectors(case, cli, tmp_path):
    src, kvq, out = tmp_path / "in.safetensors", tmp_path / "in.kvq.safetensors", tmp_path / "out.safetensors"
    _write_case(case, src)
    args = ["-bits", str(case["bits"]), "-group-size", str(case["group_size"])]
    proc = subprocess.run([cli, "compress", "-input", str(src), "-output", str(kvq), *args], capture_output=True, text=True)
    if "error" in case:
        assert proc.returncode == 2 and case["error"] in proc.stderr and '"t"' in proc.stderr
        assert not kvq.exists()
        return
    assert proc.returncode in (0, 1), proc.stderr
    with safe_open(str(kvq), "np") as f:
        assert f.get_tensor("t.codes").tobytes().hex() == case["packed_hex"]
        assert f.get_tensor("t.scales").view(np.uint16).tolist() == case["scales_f16"]
    proc = subprocess.run([cli, "decompress", "-input", str(kvq), "-output", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    blob = out.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    assert json.loads(blob[8 : 8 + n])["t"]["dtype"] == case["dtype"]
    assert blob[8 + n :].hex() == case["restored_hex"]


@pytest.mark.parametrize("case", [c for c in CASES if "error" not in c and c["dtype"] != "BF16"], ids=lambda c: c["name"])
def test_benchmark_torch_copy_matches_vectors(case):
    """benchmarks/torch_kvq.py (the in-process comparison of make bench) is the same arithmetic."""
    import sys

    import torch

    from conftest import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    from torch_kvq import quantize_dequantize

    x = np.frombuffer(bytes.fromhex(case["input_hex"]), dtype=NP_DTYPES[case["dtype"]]).copy()
    y = quantize_dequantize(torch.from_numpy(x), case["bits"], case["group_size"]).numpy()
    assert y.tobytes().hex() == case["restored_hex"]


# --- kvq v2: every scheme -----------------------------------------------------

import make_vectors_v2  # noqa: E402

V2_CASES = json.loads(make_vectors_v2.OUT.read_text())["cases"]


def test_committed_v2_vectors_match_the_reference():
    assert make_vectors_v2.OUT.read_text() == make_vectors_v2.render(), "run `python tests/make_vectors_v2.py` and commit"


def test_v2_vectors_cover_every_scheme():
    specs = " ".join(c["spec"] for c in V2_CASES)
    for needed in ("asym", "/channel", "/rot", "/out", "/res", "/sp", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "k=", "asym2",
                   "asym3", "asym8"):
        assert needed in specs, needed
    dtypes = {t["dtype"] for c in V2_CASES for t in c["tensors"]}
    assert dtypes == {"F32", "F16", "BF16"}
    assert sum("error" in c for c in V2_CASES) >= 4


def test_ggml_vectors_are_gguf_bytes():
    """The ggml cases hold exactly what gguf.quants.quantize makes (the oracle)."""
    import gguf.quants as gq
    from gguf import GGMLQuantizationType as T

    for c in V2_CASES:
        if c["spec"].startswith("q") and "error" not in c:
            t = c["tensors"][0]
            x = np.frombuffer(bytes.fromhex(t["input_hex"]), NP_DTYPES[t["dtype"]]).astype(np.float32)
            assert gq.quantize(x.reshape(-1, 32), getattr(T, c["spec"].upper())).tobytes().hex() == t["parts"][".codes"]


@pytest.mark.parametrize("case", V2_CASES, ids=[c["name"] for c in V2_CASES])
def test_cli_reproduces_v2_vectors(case, cli, tmp_path):
    src, kvq, out = tmp_path / "in.safetensors", tmp_path / "in.kvq.safetensors", tmp_path / "out.safetensors"
    write_inputs(src, case["tensors"])
    proc = subprocess.run([cli, "compress", "-input", str(src), "-output", str(kvq), "-scheme", case["spec"]],
                          capture_output=True, text=True)
    if "error" in case:
        assert proc.returncode == 2 and case["error"] in proc.stderr and "tensor " in proc.stderr, proc.stderr
        assert not kvq.exists()
        return
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["scheme"] == case["spec"] and report["format_version"] == 2
    with safe_open(str(kvq), "np") as f:  # the safetensors library opens it
        assert f.metadata()["kvq.spec"] == case["spec"]
    header, parts = _raw_tensors(kvq)
    assert set(parts) == {t["name"] + s for t in case["tensors"] for s in t["parts"]}
    for t in case["tensors"]:
        for suffix, want in t["parts"].items():
            assert parts[t["name"] + suffix].hex() == want, t["name"] + suffix
    assert report["compressed_size_bytes"] == sum(len(b) for b in parts.values())
    proc = subprocess.run([cli, "decompress", "-input", str(kvq), "-output", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    header, restored = _raw_tensors(out)
    for t in case["tensors"]:
        assert header[t["name"]]["dtype"] == t["dtype"] and header[t["name"]]["shape"] == t["shape"]
        assert restored[t["name"]].hex() == t["restored_hex"], t["name"]


def _raw_tensors(path):
    """A safetensors file's header and each tensor's raw bytes (BF16 included)."""
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    body = blob[8 + n :]
    return header, {k: body[v["data_offsets"][0] : v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}

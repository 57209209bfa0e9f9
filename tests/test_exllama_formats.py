"""ExLlamaV2 0.3.2's quantized caches (kv-compress's exllamav2:fp8, q4, q8 and the q6 pairing):
the shared vectors (tests/vectors/engine_vectors.json, from tests/exllama_reference.py) pin the
codec bit for bit in test_engine_formats; here, what can be checked beyond the reference itself."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import torch

import exllama_reference as xr


def test_fp8_is_the_top_byte_of_every_fp16():
    """ExLlamaV2Cache_8bit keeps the top byte of each fp16 (a truncation toward zero): over every fp16
    value but NaN (which kv-compress refuses) the reference is torch's own fp16 bits shifted, and reads
    back at most one e5m2 step lower."""
    h = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    h = h[~torch.isnan(h)]
    codes, back = xr.compress_tensor(h.float().numpy(), "fp8")
    want = (h.view(torch.int16).numpy().view(np.uint16) >> 8).astype(np.uint8)
    assert codes == want.tobytes()
    finite = np.isfinite(h.float().numpy())
    x, y = h.float().numpy()[finite], back[finite]
    assert np.all(np.abs(y) <= np.abs(x)) and np.all(np.sign(y) * np.sign(x) >= 0)


def test_q4_and_q8_reconstruct_within_their_step():
    """Rotation and scales as the engine computes them: the read is close to the fp16 input (within
    the code step of each chunk's Hadamard-domain scale), and an all-zero chunk reads back as zeros."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    x[0] = 0
    for fmt, tol in (("q4", 0.35), ("q8", 0.02)):
        _, y = xr.compress_tensor(x, fmt)
        y = y.reshape(64, 64)
        assert np.all(y[0] == 0)
        assert np.sqrt(np.mean((y - x) ** 2)) < tol, fmt


def test_exllamav2_is_listed_with_its_cache_classes(cli):
    rows = json.loads(subprocess.run([cli, "schemes", "-engine", "exllamav2"], capture_output=True, text=True,
                                     check=True).stdout)
    assert [(r["name"], r["flags"]) for r in rows] == [
        ("exllamav2:fp8", "ExLlamaV2Cache_8bit"), ("exllamav2:q4", "ExLlamaV2Cache_Q4"),
        ("exllamav2:q8", "ExLlamaV2Cache_Q8"), ("exllamav2:q6", "ExLlamaV2Cache_Q6")]
    assert rows[3]["scheme"] == "k=exllamav2:q8,v=exllamav2:q4" and rows[3]["value_bits_per_element"] == 4.5
    assert all(r["engine_version"] == xr.VERSION and r["evidence"] == "read" for r in rows)


def test_q6_is_named_as_the_engine_names_it():
    """Python names the pairing as the CLI does, so a sweep's row finds its menu entry (flags)."""
    from kvlib.codec.spec import resolve_codec

    q6 = resolve_codec("exllamav2:q6")
    assert q6.name == "exllamav2:q6" and q6.spec == "k=exllamav2:q8,v=exllamav2:q4"
    assert resolve_codec(q6.spec).name == "exllamav2:q6"
    assert resolve_codec("k=exllamav2:q4,v=exllamav2:q8").name == "k=exllamav2:q4,v=exllamav2:q8"


def test_exllamav3_widths_are_listed_and_round_trip(cli):
    """ExLlamaV3's cache at 2-8 bits, K and V apart as -cq K,V; a width reads back within its step."""
    rows = json.loads(subprocess.run([cli, "schemes", "-engine", "exllamav3"], capture_output=True, text=True,
                                     check=True).stdout)
    assert [r["name"] for r in rows] == [f"exllamav3:{b}" for b in xr.V3_BITS]
    assert [r["key_bits_per_element"] for r in rows] == [b + 0.5 for b in xr.V3_BITS]
    assert rows[2]["flags"].startswith("-cq 4,4")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    errs = [np.sqrt(np.mean((xr.v3_compress(x, b)[1] - x.reshape(-1)) ** 2)) for b in xr.V3_BITS]
    assert all(a > b for a, b in zip(errs, errs[1:])) and errs[-1] < 0.01  # each bit halves the error, roughly

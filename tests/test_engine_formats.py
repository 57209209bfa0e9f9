"""llama.cpp's KV-cache formats (kv-compress's llama.cpp:f16 ... llama.cpp:iq4_nl, with the engine's
default Hadamard rotation) are bit-exact to the engine:

- the shared vectors (tests/vectors/engine_vectors.json) are the NumPy reference's output
  (tests/engine_reference.py), and the CLI reproduces them byte for byte (go test does too);
- the reference is the gguf package's quantizers (llama.cpp's own, in NumPy, by its authors) for
  q4_0, q4_1, q5_0, q5_1 and the _ref q8_0;
- the reference and the CLI are llama.cpp's C, compiled here with the engine's flags and run on the
  same bytes: verbatim excerpts (tests/engine_harness/*_excerpt.c) of the quantizers (the x86 q8_0,
  iq4_nl, the _ref types), the F16C f16 conversion and the CPU Hadamard kernel (skipped without a C
  compiler, or without AVX2/FMA/F16C for the CPU build's functions);
- with LLAMA_CPP_DIR set to the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp, the excerpts are
  checked verbatim against it, and libggml itself is built from it (cmake, into build/) and its
  set_rows graph (rotation included) runs on the CLI's inputs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

import engine_reference as er
import make_engine_vectors
from kvq_reference import decode
from vector_files import read_parts, write_inputs

HARNESS = Path(__file__).parent / "engine_harness"
REPO = Path(__file__).resolve().parent.parent
VECTORS = json.loads(make_engine_vectors.OUT.read_text())
CASES = VECTORS["cases"]
GGUF_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1")


# --- the vectors and the CLI ---------------------------------------------------------------------

def test_committed_engine_vectors_match_the_reference():
    assert make_engine_vectors.OUT.read_text() == make_engine_vectors.render(), \
        "run `python tests/make_engine_vectors.py` and commit"


def test_engine_vectors_cover_the_issue():
    names = {c["name"] for c in CASES}
    for fmt in er.FORMATS:
        for dtype in ("f32", "f16", "bf16"):
            for hd in (64, 128, 256):
                assert f"{fmt}_{dtype}_hd{hd}" in names
    rotated = {t["rotation_size"] for c in CASES for t in c["tensors"] if "rotation_size" in t}
    assert {0, 64, 128, 256} <= rotated
    assert any(t.get("non_finite") for c in CASES for t in c["tensors"])  # past the range: Inf / NaN as the engine
    assert sum("error" in c for c in CASES) >= 5
    assert {b["format"] for b in VECTORS["blocks"]} == set(er.FORMATS) | {"q8_0_ref"}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_cli_reproduces_engine_vectors(case, cli, tmp_path):
    src, kvq, out = tmp_path / "in.safetensors", tmp_path / "in.kvq.safetensors", tmp_path / "out.safetensors"
    write_inputs(src, case["tensors"])
    proc = subprocess.run([cli, "compress", "-input", str(src), "-output", str(kvq), "-scheme", case["spec"]],
                          capture_output=True, text=True)
    if "error" in case:
        assert proc.returncode == 2 and case["error"] in proc.stderr and "tensor " in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and not kvq.exists()
        return
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["scheme"] == case["spec"]
    _, parts = read_parts(kvq)
    for t, tr in zip(case["tensors"], report["tensors"]):
        assert parts[t["name"] + ".codes"].hex() == t["parts"][".codes"], t["name"]
        if "rotation_size" in t:  # an engine format: the report says what the rotation did (llama.cpp's)
            assert tr.get("rotation_size", 0) == t["rotation_size"] and tr.get("non_finite", 0) == t["non_finite"]
            assert tr.get("saturated", 0) == t.get("saturated", 0)
            assert tr["rotation"].startswith(("on", "off")) if ":" not in t["format"] else "rotation" not in tr
    assert set(parts) == {t["name"] + ".codes" for t in case["tensors"]}
    proc = subprocess.run([cli, "decompress", "-input", str(kvq), "-output", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    header, restored = read_parts(out)
    for t in case["tensors"]:
        assert header[t["name"]]["dtype"] == t["dtype"] and restored[t["name"]].hex() == t["restored_hex"], t["name"]


def test_schemes_lists_the_engine_formats(cli):
    rows = json.loads(subprocess.run([cli, "schemes", "-engine", "llama.cpp"], capture_output=True, text=True, check=True).stdout)
    assert [r["name"] for r in rows] == [f"llama.cpp:{f}" for f in er.FORMATS]
    for r in rows:
        assert r["engine_version"] == VECTORS["engine_version"] and r["evidence"] == "executed"
        assert r["flags"] == f"-ctk {r['format']} -ctv {r['format']}" and r["key_scheme"]["rotate"] == (r["format"] != "f16")
    presets = json.loads(subprocess.run([cli, "schemes"], capture_output=True, text=True, check=True).stdout)
    assert not any(":" in p["name"] for p in presets)  # the presets list is unchanged


@pytest.mark.parametrize("spec, words", [
    ("tgi:fp8", 'unknown engine "tgi"'), ("vllm:fp8/scale0", "positive finite float32 scale"), ("llama.cpp:q3_k", 'llama.cpp has no KV-cache format "q3_k"'),
    ("llama.cpp:f16/rot", "never rotated"), ("llama.cpp:q4_0/g64", "blocks of 32"), ("none/rot", "unchanged"),
])
def test_bad_engine_specs_are_one_line(spec, words, cli):
    proc = subprocess.run([cli, "check", "-scheme", spec], capture_output=True, text=True)
    assert proc.returncode == 2 and words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


# --- gguf: llama.cpp's quantizers in NumPy ----------------------------------------------------------

def _gguf_blocks(rng) -> np.ndarray:
    """Finite blocks: Gaussian, outliers, constants, exact halves, zeros, ties, large and small."""
    b = [rng.standard_normal((400, 32)) * s for s in (1, 3, 100)]
    o = rng.standard_normal((100, 32))
    o[:, 3] *= 50
    b.append(o)
    b.append(np.tile(np.linspace(-1, 1, 32), (4, 1)))
    b.append(np.full((2, 32), -2.5))
    b.append(np.zeros((2, 32)))
    b.append(np.r_[127, np.arange(31) - 15 + 0.5][None, :])
    b.append(rng.standard_normal((50, 32)) * 1e-3)
    b.append(rng.standard_normal((50, 32)) * 3e4)
    return np.concatenate(b).astype(np.float32)


@pytest.mark.parametrize("fmt", GGUF_TYPES + ("q8_0_ref",))
def test_reference_is_gguf(fmt):
    """gguf.quants (llama.cpp's quantizers ported by its authors) makes the reference's bytes."""
    import gguf.quants as gq
    from gguf import GGMLQuantizationType as T

    x = _gguf_blocks(np.random.default_rng(1))
    qt = getattr(T, fmt.replace("_ref", "").upper())
    with np.errstate(over="ignore"):  # a q4_1/q5_1 minimum below -65504 is Inf, in the engine as in gguf
        want = gq.quantize(x, qt)
    got = er.quantize_q8_0_ref(x) if fmt == "q8_0_ref" else er.QUANTIZE[fmt](x)
    assert got.tobytes() == want.tobytes()
    assert er.dequantize(fmt.replace("_ref", ""), got.tobytes()).tobytes() == \
        gq.dequantize(want, qt).astype(np.float32).reshape(-1).tobytes()


def test_q8_0_x86_differs_from_gguf_only_on_ties():
    """The CPU build's q8_0 on x86 (what a q8_0 cache stores) rounds x*127/amax half to even; gguf
    (the _ref) rounds 1/(amax/127)*x half away: equal except where x*id lands on a half."""
    import gguf.quants as gq
    from gguf import GGMLQuantizationType as T

    x = _gguf_blocks(np.random.default_rng(2))
    with np.errstate(over="ignore"):
        x86, ref = er.quantize_q8_0_x86(x), gq.quantize(x, T.Q8_0)
    assert (x86[:, :2] == ref[:, :2]).all()  # the same FP16 scale
    diff = np.nonzero((x86[:, 2:] != ref[:, 2:]).any(axis=1))[0]
    tie = int(np.nonzero((x[:, 0] == 127) & (x[:, 1] == -14.5))[0][0])  # the block of exact halves
    assert tie in diff
    ties = x[tie][1:]
    assert x86[tie, 3:].view(np.int8).tolist() == np.rint(ties).astype(int).tolist()  # half to even
    assert ref[tie, 3:].view(np.int8).tolist() == (np.sign(ties) * np.floor(np.abs(ties) + 0.5)).astype(int).tolist()
    assert len(diff) <= 5, diff  # elsewhere a tie only by the last bit of 127/amax against 1/(amax/127)


# --- llama.cpp's own C ------------------------------------------------------------------------

def _cpu_has(*flags: str) -> bool:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return all(f" {f}" in info for f in flags)


@pytest.fixture(scope="session")
def harness(tmp_path_factory) -> Path:
    """tests/engine_harness built with the engine's flags: ggml-base's (-O3 -std=gnu11) for
    ggml_base_excerpt.c, ggml-cpu's (-O3 -std=gnu11 -march=native) for ggml_cpu_excerpt.c."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler: the engine's C cannot run here")
    if not _cpu_has("avx2", "fma", "f16c"):
        pytest.skip("no AVX2/FMA/F16C: the x86 build's q8_0 and f16 conversion cannot run here")
    d = tmp_path_factory.mktemp("harness")
    steps = [
        [cc, "-O3", "-std=gnu11", "-c", str(HARNESS / "ggml_base_excerpt.c"), "-o", str(d / "base.o")],
        [cc, "-O3", "-std=gnu11", "-march=native", "-c", str(HARNESS / "ggml_cpu_excerpt.c"), "-o", str(d / "cpu.o")],
        [cc, "-O2", "-std=gnu11", "-c", str(HARNESS / "llamacpp_kv.c"), "-o", str(d / "main.o")],
        [cc, "-o", str(d / "llamacpp_kv"), str(d / "main.o"), str(d / "base.o"), str(d / "cpu.o"), "-lm"],
    ]
    for s in steps:
        subprocess.run(s, check=True, capture_output=True)
    return d / "llamacpp_kv"


def _run_c(harness: Path, fmt: str, nrot: int, x: np.ndarray) -> tuple[bytes, np.ndarray]:
    x = np.asarray(x, np.float32).reshape(-1)
    p = subprocess.run([str(harness), fmt, str(nrot), str(x.size)], input=x.tobytes(), capture_output=True, check=True)
    n = len(p.stdout) - 4 * x.size
    return p.stdout[:n], np.frombuffer(p.stdout[n:], np.float32)


def _mask_iq4_nl_empty(raw: bytes) -> np.ndarray:
    """iq4_nl blocks with d = 0 (max|x| < 1e-15) have codes the engine never writes: compare d only."""
    b = np.frombuffer(raw, np.uint8).reshape(-1, 18).copy()
    b[b[:, :2].copy().view("<u2")[:, 0] == 0, 2:] = 0
    return b


def _same_codes(fmt: str, a: bytes, b: bytes) -> bool:
    if fmt == "iq4_nl":
        return np.array_equal(_mask_iq4_nl_empty(a), _mask_iq4_nl_empty(b))
    return a == b


def _same_values(fmt: str, a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit; for iq4_nl up to the sign of zeros of the blocks whose codes are unwritten."""
    if fmt == "iq4_nl":
        a, b = np.where(a == 0, np.float32(0), a), np.where(b == 0, np.float32(0), b)
    return a.tobytes() == b.tobytes()


def test_c_harness_blocks(harness):
    """Every block vector (NaN payloads, Inf, subnormals, FLT_MAX, ties, signed zeros), the x86 q8_0
    and the _ref q8_0 included: the engine's C gives the reference's bytes and reads."""
    n = 0
    for bv in VECTORS["blocks"]:
        x = np.frombuffer(bytes.fromhex(bv["input_hex"]), "<f4")
        raw, y = _run_c(harness, bv["format"], 0, x)
        fmt = bv["format"].replace("_ref", "")
        assert _same_codes(fmt, raw, bytes.fromhex(bv["codes_hex"])), bv["name"]
        assert _same_values(fmt, y, np.frombuffer(bytes.fromhex(bv["restored_hex"]), "<f4")), bv["name"]
        n += 1
    assert n == len(VECTORS["blocks"]) >= 100


def _restored(y: np.ndarray, dtype: str) -> bytes:
    return make_engine_vectors.restored_bytes(y, dtype)


def test_c_harness_reproduces_the_vectors(harness):
    """Every cache of the vectors through the engine's C (rotation by its CPU kernel, the size the
    CLI reported), against the committed codes and reconstruction."""
    n = 0
    for c in CASES:
        if "error" in c:
            continue
        for t in c["tensors"]:
            if "rotation_size" not in t or ":" in t["format"]:  # none, and the engines other than llama.cpp (no C harness)
                continue
            fmt, x = t["format"], decode(bytes.fromhex(t["input_hex"]), t["dtype"])
            raw, y = _run_c(harness, fmt, t["rotation_size"], x)
            assert _same_codes(fmt, raw, bytes.fromhex(t["parts"][".codes"])), (c["name"], t["name"])
            want = np.frombuffer(_restored(y, t["dtype"]), np.uint8)
            got = np.frombuffer(bytes.fromhex(t["restored_hex"]), np.uint8)
            assert _same_values(fmt, decode(want.tobytes(), t["dtype"]), decode(got.tobytes(), t["dtype"])), (c["name"], t["name"])
            n += 1
    assert n >= 150


def _cache(rng, shape, role) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    if role == "key":
        x[..., :2] *= 8
        x[..., 7] *= 60
    x[:, -1, 0, :] = 0
    return x


@pytest.mark.parametrize("fmt", er.FORMATS)
@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_cli_is_the_engines_c(fmt, dtype, cli, harness, tmp_path):
    """A fresh cache (head_dim 64, 128, 256 and 96, keys and values) through kv-compress and through
    the engine's C: the same cache bytes and the same reconstruction."""
    from kvq_reference import encode

    rng = np.random.default_rng(zlib.crc32(f"{fmt} {dtype}".encode()))
    for hd in (64, 128, 256, 96):
        tensors, xs = [], {}
        for r in ("key", "value"):
            raw = encode(_cache(rng, [1, 3, 5, hd], r).reshape(-1), dtype)
            xs[r] = decode(raw, dtype)
            tensors.append(dict(name=f"layer_0_{r}", dtype=dtype, shape=[1, 3, 5, hd], input_hex=raw.hex()))
        src, kvq, out = tmp_path / "in.safetensors", tmp_path / "c.safetensors", tmp_path / "r.safetensors"
        write_inputs(src, tensors)
        proc = subprocess.run([cli, "roundtrip", "-input", str(src), "-output", str(out), "-scheme", f"llama.cpp:{fmt}"],
                              capture_output=True, text=True)
        assert proc.returncode in (0, 1), proc.stderr
        rep = json.loads(proc.stdout)
        subprocess.run([cli, "compress", "-input", str(src), "-output", str(kvq), "-scheme", f"llama.cpp:{fmt}"],
                       capture_output=True, check=False)
        _, parts = read_parts(kvq)
        _, restored = read_parts(out)
        for i, r in enumerate(("key", "value")):
            rot = 0 if fmt == "f16" else er.rotation_size(r, hd)[0]
            assert rep["tensors"][i].get("rotation_size", 0) == rot
            raw, y = _run_c(harness, fmt, rot, xs[r])
            assert _same_codes(fmt, raw, parts[f"layer_0_{r}.codes"]), (hd, r)
            assert _same_values(fmt, decode(_restored(y, dtype), dtype), decode(restored[f"layer_0_{r}"], dtype)), (hd, r)


# --- the engine itself, built from the sdist (opt-in) --------------------------------------------

LLAMA_CPP_DIR = os.environ.get("LLAMA_CPP_DIR")
needs_sdist = pytest.mark.skipif(not LLAMA_CPP_DIR, reason="set LLAMA_CPP_DIR to the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp")


@needs_sdist
def test_excerpts_are_verbatim():
    proc = subprocess.run(["python", str(HARNESS / "extract.py"), LLAMA_CPP_DIR, "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="session")
def libggml() -> Path:
    """libggml (ggml-base, ggml-cpu) built from the sdist with cmake into build/ggml-0c1e57098
    (minutes the first time), and tests/engine_harness/ggml_kv_write.c linked against it."""
    if not LLAMA_CPP_DIR:
        pytest.skip("set LLAMA_CPP_DIR to the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp")
    cmake, cc = shutil.which("cmake"), shutil.which(os.environ.get("CC", "cc"))
    if not cmake or not cc:
        pytest.skip("no cmake or C compiler")
    root = REPO / "build" / "ggml-0c1e57098"
    src, out = root / "src", root / "build"
    if not (out / "src" / "libggml.so").exists():
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(Path(LLAMA_CPP_DIR) / "ggml", src)
        (src / "ggml.pc.in").touch()  # missing from the sdist; only the install step reads it
        subprocess.run([cmake, "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
                        "-DGGML_OPENMP=OFF", "-DGGML_BACKEND_DL=OFF", "-DBUILD_SHARED_LIBS=ON", "-DGGML_BUILD_TESTS=OFF",
                        "-DGGML_BUILD_EXAMPLES=OFF", "-DGGML_LLAMAFILE=OFF"], check=True, capture_output=True)
        subprocess.run([cmake, "--build", str(out), "-j", "2", "--target", "ggml"], check=True, capture_output=True)
    exe = root / "ggml_kv_write"
    subprocess.run([cc, "-O2", "-o", str(exe), str(HARNESS / "ggml_kv_write.c"), f"-I{src / 'include'}", f"-L{out / 'src'}",
                    "-lggml", "-lggml-base", "-lggml-cpu", "-lm", f"-Wl,-rpath,{out / 'src'}"], check=True, capture_output=True)
    return exe


@pytest.mark.parametrize("fmt", er.FORMATS)
def test_cli_is_libggml(fmt, cli, libggml, tmp_path):
    """kv-compress against libggml's own graph (ggml_mul_mat with the Hadamard hint, then ggml_set_rows
    into a cache of the type, on the CPU backend), on the same caches."""
    from kvq_reference import encode

    rng = np.random.default_rng(len(fmt))
    for dtype in ("F32", "BF16"):
        for hd in (64, 128, 256, 96):
            nh, nt = 3, 5
            tensors, xs = [], {}
            for r in ("key", "value"):
                raw = encode(_cache(rng, [1, nh, nt, hd], r).reshape(-1), dtype)
                xs[r] = decode(raw, dtype).reshape(nh, nt, hd)
                tensors.append(dict(name=f"layer_0_{r}", dtype=dtype, shape=[1, nh, nt, hd], input_hex=raw.hex()))
            src, kvq, out = tmp_path / "in.safetensors", tmp_path / "c.safetensors", tmp_path / "r.safetensors"
            write_inputs(src, tensors)
            subprocess.run([cli, "compress", "-input", str(src), "-output", str(kvq), "-scheme", f"llama.cpp:{fmt}"],
                           capture_output=True, check=False)
            subprocess.run([cli, "decompress", "-input", str(kvq), "-output", str(out)], capture_output=True, check=True)
            _, parts = read_parts(kvq)
            _, restored = read_parts(out)
            for r in ("key", "value"):
                rot = 0 if fmt == "f16" else er.rotation_size(r, hd)[0]
                xe = xs[r].transpose(1, 0, 2).copy()  # the engine's rows: one token, all heads
                p = subprocess.run([str(libggml), fmt, str(rot), str(hd), str(nh), str(nt)], input=xe.tobytes(),
                                   capture_output=True, check=True)
                nb = len(p.stdout) - 4 * xe.size
                per = hd // (1 if fmt == "f16" else 32) * er.BLOCK_BYTES[fmt]
                cache = np.frombuffer(p.stdout[:nb], np.uint8).reshape(nt, nh, per).transpose(1, 0, 2).tobytes()
                y = np.frombuffer(p.stdout[nb:], np.float32).reshape(nt, nh, hd).transpose(1, 0, 2).reshape(-1)
                assert _same_codes(fmt, cache, parts[f"layer_0_{r}.codes"]), (dtype, hd, r)
                assert _same_values(fmt, decode(_restored(y, dtype), dtype), decode(restored[f"layer_0_{r}"], dtype)), (dtype, hd, r)


@pytest.mark.parametrize("spec", ["llama.cpp:q4_0", "llama.cpp:q4_0/norot", "k=llama.cpp:q8_0,v=llama.cpp:iq4_nl",
                                  "k=llama.cpp:f16,v=llama.cpp:q4_0/norot,kv0-1=none", "int4,k3=llama.cpp:q8_0",
                                  "vllm:fp8", "k=vllm:fp8_e4m3/scale0.0123,v=vllm:fp8_e5m2/scale2.5e-05",
                                  "vllm:fp8/scale1e+06", "vllm:int8_per_token_head,kv0=none"])
def test_python_spells_engine_specs_as_the_cli(spec):
    """CodecConfig.spec is the CLI's canonical spelling for engine formats and the identity too."""
    from kvlib.codec.spec import _check, resolve_codec

    c = resolve_codec(spec)
    assert c.spec == _check(("check", "-scheme", spec))["scheme"] and resolve_codec(c.spec) == c

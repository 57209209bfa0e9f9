"""Issue 9: the CLI under a memory limit on hostile inputs. Tiny headers that
declare huge shapes, sizes that overflow, devices as input: each ends cleanly
(a result, or exit 2 with one line), never an out-of-memory death or a stack
trace, and prints JSON in proportion to the data, not to the claims."""

from __future__ import annotations

import json
import resource
import struct
import subprocess

import pytest

# Go reserves ~0.8 GB of address space at start; 1.5 GB leaves the codec
# about 0.7 GB, where these inputs used to need 1.4 GB to 28 GB.
ADDRESS_SPACE = 1536 << 20


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _file(path, tensors, body=b""):
    h = json.dumps(tensors).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + body)
    return path


def _run(cli, *args):
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, preexec_fn=_limit, timeout=120)


def _empty(shape, name="t"):
    return {name: {"dtype": "F16", "shape": shape, "data_offsets": [0, 0]}}


@pytest.mark.parametrize("name, tensors, scheme", [
    ("[1, 1e6, 0] in an 81-byte header", _empty([1, 1_000_000, 0]), "int4"),
    ("[1, 1e8, 0]", _empty([1, 100_000_000, 0]), "int4"),
    ("[1, 2^40, 0]", _empty([1, 1 << 40, 0]), "int4"),
    ("[1, 2^40, 0, 64] as keys, kivi4", _empty([1, 1 << 40, 0, 64], "layer_0_key"), "kivi4"),
    ("[2^40, 0, 2^20, 64] with residual", _empty([1 << 40, 0, 1 << 20, 64], "layer_0_key"), "sym4/g64/res1000"),
])
def test_huge_declared_shapes_with_no_data(name, tensors, scheme, cli, tmp_path):
    src = _file(tmp_path / "hostile.safetensors", tensors)
    assert src.stat().st_size < 200
    for cmd in ("metrics", "roundtrip"):
        args = ["-input", src, "-scheme", scheme] + (["-output", tmp_path / "out.safetensors"] if cmd == "roundtrip" else [])
        p = _run(cli, cmd, *args)
        assert p.returncode in (0, 1), p.stderr
        assert len(p.stdout) < 20_000, f"{len(p.stdout)} bytes of JSON for an empty tensor"


def test_one_megabyte_of_f16_as_one_long_row(cli, tmp_path):
    n = 1 << 19
    src = _file(tmp_path / "row.safetensors", {"t": {"dtype": "F16", "shape": [1, n], "data_offsets": [0, 2 * n]}},
                struct.pack(f"<{n}e", *([0.5, -1.0] * (n // 2))))
    p = _run(cli, "metrics", "-input", src)
    assert p.returncode in (0, 1), p.stderr
    assert len(p.stdout) < 20_000 and json.loads(p.stdout)["tensors"][0]["head_sums"] == []


@pytest.mark.parametrize("args, words", [
    (["compress", "-input", "/dev/zero", "-output", "{out}"], "not a regular file"),
    (["roundtrip", "-input", "{src}", "-output", "{out}", "-group-size", "1152921504606846976"], "group size"),
    (["roundtrip", "-input", "{src}", "-output", "{out}", "-group-size", "2305843009213693952"], "group size"),
    (["metrics", "-input", "{src}", "-group-size", "1099511627776"], "group size"),
    (["metrics", "-input", "{src}", "-workers", "100000000000"], "-workers"),
    (["decompress", "-input", "{v1}", "-output", "{out}"], "group size 1152921504606846976"),
    (["compress", "-input", "{lying}", "-output", "{out}"], "header length"),
])
def test_hostile_parameters_exit_2_in_one_line(args, words, cli, tmp_path):
    src = _file(tmp_path / "kv.safetensors", {"layer_0_key": {"dtype": "F32", "shape": [1, 1, 2, 4], "data_offsets": [0, 32]}},
                bytes(32))
    # A version 1 kvq file whose header claims a group of 2^60 (it used to loop for ever).
    v1 = _file(tmp_path / "v1.kvq.safetensors", {
        "__metadata__": {"kvq.format": "kvq", "kvq.version": "1", "kvq.bits": "4", "kvq.group_size": str(1 << 60),
                         "kvq.sparsity": "0", "kvq.tensors": '[{"name":"t","dtype":"F32","shape":[8]}]'},
        "t.codes": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
        "t.scales": {"dtype": "F16", "shape": [1], "data_offsets": [4, 6]}}, bytes(6))
    lying = tmp_path / "lying.safetensors"
    lying.write_bytes(struct.pack("<Q", 1 << 62) + b"{}")
    out = tmp_path / "out.safetensors"
    p = _run(cli, *[a.format(src=src, out=out, v1=v1, lying=lying) for a in args])
    assert p.returncode == 2, p.stderr
    assert words in p.stderr and p.stderr.count("\n") == 1 and "goroutine" not in p.stderr
    assert p.stdout == "" and not out.exists()

"""docs/kv-compress/kvq-header.schema.json describes exactly what kv-compress writes, for every format it
knows: every row of `kv-compress schemes -engine all` and of kvlib's own menu (`kv-compress schemes`),
and the spec grammar's stages, overrides and dtypes (docs/kv-compress/schemes.md), are compressed from a
small synthetic cache and the header, and the records inside kvq.tensors (a JSON string the schema
names with contentSchema, which a validator does not apply by itself), are checked against the schema
with Draft202012Validator. The rows come from the CLI, so a format added to it is checked with no change
here: one the CLI refuses for every shape tried, or whose method the schema lacks, fails by its name.
The schema's method enum is exactly the set of methods written, and each record with one field made
wrong (a width, a group, a scale, a rotation, CacheGen's bins) fails: every method has its rules."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "kv-compress" / "kvq-header.schema.json").read_text())
HEAD_DIMS = (64, 128, 256)  # tried in order: the first a format accepts
PACKED = {"sym", "symf", "asym", "lm"}  # kvlib's methods of variable width and group

# The spec grammar beyond the menus (docs/kv-compress/schemes.md): stages, axes, +lossless, per-role
# and per-layer schemes, static scales, other dtypes and layer counts (CacheGen's 16 bins from layer
# 10 on; TurboQuant's boundary layers stored with none, and a boundary slot the spec sets). Each is
# (spec, layers, dtype), on 64 tokens.
GRAMMAR = [
    ("none", 2, "F32"),
    ("asym3/g32/channel/res4", 2, "F16"),
    ("sym4/g64/rot/out0.01/sp0.1+lossless", 2, "F32"),
    ("asym4/g16+lossless", 2, "F32"),
    ("int4+wire", 2, "F32"),
    ("k=kivi2,v=lm3rot,kv1=q4_0+wire", 2, "BF16"),
    ("none+lossless", 2, "BF16"),
    ("symf3/g16/token/out0.05", 2, "BF16"),
    ("lm4/g32/rot/res2", 2, "F32"),
    ("q8_0/rot/out0.01", 2, "F16"),
    ("k=int4/out0.01,v=q5_1", 2, "F32"),
    ("llama.cpp:q4_0,kv0=none", 2, "F32"),
    ("k=llama.cpp:q8_0,v=llama.cpp:q4_0/norot", 2, "F16"),
    ("llama.cpp:iq4_nl+lossless", 2, "BF16"),
    ("vllm:fp8_e4m3/scale0.05", 2, "F32"),
    ("vllm:fp8,k0=vllm:fp8/scale0.0123,v1=vllm:fp8_e5m2/scale2", 2, "BF16"),
    ("k=vllm:fp8,v=vllm:int8_per_token_head", 2, "BF16"),
    ("vllm:fp8_per_token_head,kv0=none", 3, "F16"),
    ("vllm:nvfp4_4over6/scale0.0025", 2, "F16"),
    ("vllm:turboquant_k3v4_nc", 6, "F32"),
    ("vllm:turboquant_k8v4,k0=sym4/g64", 3, "BF16"),
    ("trtllm:nvfp4/scale0.01,kv1=trtllm:int8/scale0.5", 2, "F32"),
    ("k=exllamav2:q6,v=exllamav3:3", 2, "F16"),
    ("lmcache:cachegen", 12, "F32"),
    ("k=lmcache:cachegen,v=lmcache:fp8", 2, "BF16"),
    ("lmcache:kivi", 2, "F16"),
    ("int4,k1h1=lm2rot,v0h0=q8_0", 2, "F32"),  # head overrides: version 3, records with of and head
    ("kivi2,kv0h1=sym8/g64/rot+wire", 2, "BF16"),
]


def _cache(path: Path, layers: int, head_dim: int, dtype: str, tokens: int = 8, heads: int = 2) -> None:
    """A safetensors KV cache: layer_{i}_key and layer_{i}_value, [1, heads, tokens, head_dim] each."""
    from vector_files import write_inputs

    rng = np.random.default_rng(layers * 1000 + head_dim)
    tensors = []
    for i in range(layers):
        for role in ("key", "value"):
            x = rng.standard_normal((1, heads, tokens, head_dim), dtype=np.float32)
            if dtype == "F32":
                raw = x.tobytes()
            elif dtype == "F16":
                raw = x.astype(np.float16).tobytes()
            else:  # BF16: the top half of each float32
                raw = (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
            tensors.append({"name": f"layer_{i}_{role}", "dtype": dtype, "shape": list(x.shape), "input_hex": raw.hex()})
    write_inputs(path, tensors)


def _header(path: Path) -> dict:
    from vector_files import read_parts

    return read_parts(path)[0]


def _compress(cli: str, tmp: Path, label: str, spec: str, layers: int, dtype: str, tokens: int = 8) -> tuple[dict | None, str]:
    """The header kv-compress writes for spec on the first head_dim it accepts; None and its last refusal
    when it refuses every one."""
    err = ""
    stem = "".join(c if c.isalnum() else "_" for c in label)
    for d in HEAD_DIMS:
        src, kvq = tmp / f"{stem}_{d}.safetensors", tmp / f"{stem}_{d}.kvq"
        _cache(src, layers, d, dtype, tokens)
        proc = subprocess.run([cli, "compress", "-input", str(src), "-output", str(kvq), "-scheme", spec],
                              capture_output=True, text=True)
        if proc.returncode in (0, 1) and kvq.exists():
            return _header(kvq), ""
        err = proc.stderr.strip()
    return None, err


def _validator(schema: dict):
    """A Draft 2020-12 validator of schema (itself checked against the metaschema)."""
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def written(cli, tmp_path_factory) -> dict:
    """Every format compressed once: the menus' rows (each with the layers its boundary rule needs to
    leave a layer quantized) and the grammar's specs."""
    tmp = tmp_path_factory.mktemp("kvq-schema")
    rows = []
    for args in (["schemes", "-engine", "all"], ["schemes"]):
        rows += json.loads(subprocess.run([cli, *args], capture_output=True, text=True, check=True).stdout)
    runs, refused = [], {}
    for r in rows:
        layers = max(2, 2 * r.get("boundary_layers", 0) + 1)
        header, err = _compress(cli, tmp, r["name"], r["scheme"], layers, "F32")
        if header is None:
            refused[r["name"]] = err
        else:
            runs.append({"label": r["name"], "row": r, "header": header})
    for spec, layers, dtype in GRAMMAR:
        header, err = _compress(cli, tmp, spec, spec, layers, dtype, tokens=64)  # enough for +lossless to pay
        if header is None:
            refused[spec] = err
        else:
            runs.append({"label": f"{spec} ({dtype}, {layers} layers)", "row": None, "header": header})
    for run in runs:
        run["records"] = json.loads(run["header"]["__metadata__"]["kvq.tensors"])
    return {"rows": rows, "runs": runs, "refused": refused}


def test_every_format_is_written(written):
    """Each row of both menus, and each grammar spec, compresses a synthetic cache at head_dim 64, 128
    or 256, and its records carry the row's key and value schemes (none only on an engine's boundary
    layers)."""
    assert {r["engine"] for r in written["rows"] if "engine" in r} == {
        "llama.cpp", "vllm", "sglang", "trtllm", "exllamav2", "exllamav3", "ocp", "lmcache"}
    assert not written["refused"], "kv-compress refuses for every head_dim tried: " + "; ".join(
        f"{name}: {err}" for name, err in written["refused"].items())
    for run in written["runs"]:
        row = run["row"]
        if row is None:
            continue
        got = {"key": set(), "value": set()}
        for rec in run["records"]:
            role = "key" if rec["name"].endswith("_key") else "value"
            assert rec["scheme"] in (row[f"{role}_scheme"], {"method": "none", "bits": 0, "group": 0, "axis": "token",
                                                            "rotate": False, "outliers": 0, "residual": 0, "sparsity": 0}), run["label"]
            got[role].add(rec["scheme"]["method"])
        assert row["key_scheme"]["method"] in got["key"] and row["value_scheme"]["method"] in got["value"], run["label"]
    # the grammar's specs reach every optional field and branch of a record
    recs = [rec for run in written["runs"] for rec in run["records"]]
    reached = {
        "bins 16": any(r.get("bins") == 16 for r in recs), "bins 32": any(r.get("bins") == 32 for r in recs),
        "rotation": any("rotation" in r for r in recs),
        "lossless": {p for r in recs for p in r.get("lossless", ())} == {".codes", ".scales", ".zeros"},
        "wire": any(".codes" in r.get("wire", ()) for r in recs),
        "outliers": any(r["outliers"] > 0 for r in recs), "scale other than 1": any(r["scheme"].get("scale", 1) != 1 for r in recs),
        "channel": any(r["scheme"]["axis"] == "channel" for r in recs), "residual": any(r["scheme"]["residual"] > 0 for r in recs),
        "sparsity": any(r["scheme"]["sparsity"] > 0 for r in recs),
        "kvlib /rot": any(r["scheme"]["rotate"] and ":" not in r["scheme"]["method"] for r in recs),
        "dtypes": {r["dtype"] for r in recs} == {"F32", "F16", "BF16"},
    }
    assert all(reached.values()), reached


def test_headers_follow_the_schema(written):
    """The whole header of every file, and its records (TensorRecords), are valid."""
    header_ok = _validator(SCHEMA)
    records_ok = _validator({"$defs": SCHEMA["$defs"], "$ref": "#/$defs/TensorRecords"})
    bad = []
    for run in written["runs"]:
        for what, validator, doc in (("header", header_ok, run["header"]), ("records", records_ok, run["records"])):
            errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
            if errors:
                e = errors[0]
                bad.append(f"{run['label']}: {what} at {list(e.absolute_path)}: {e.message}")
    assert not bad, "\n".join(bad)


def test_method_enum_is_what_kv_compress_writes(written):
    """The schema lists exactly the methods written: none missing, none that no spec writes."""
    written_methods = {rec["scheme"]["method"] for run in written["runs"] for rec in run["records"]}
    enum = set(SCHEMA["$defs"]["Scheme"]["properties"]["method"]["enum"])
    assert written_methods == enum, {"not in the schema": written_methods - enum, "never written": enum - written_methods}


def _wrong(rec: dict, rotating: set[str]) -> list[tuple[str, dict]]:
    """rec with one field made wrong, each way the schema's rules for its method must refuse."""
    s, m = rec["scheme"], rec["scheme"]["method"]

    def with_scheme(**kw):
        sc = dict(s, **kw)
        for k in [k for k, v in kw.items() if v is None]:
            del sc[k]
        return dict(rec, scheme=sc)

    out = [("group + 1", with_scheme(group=s["group"] + 1))]  # odd for kvlib's groups, another for every fixed one
    if m in PACKED:
        out.append(("bits past the method's range", with_scheme(bits=(4 if m == "lm" else 8) + 1)))
    else:
        out.append(("bits + 1", with_scheme(bits=s["bits"] + 1)))
    if "scale" in s:
        out += [("scale left out", with_scheme(scale=None)), ("scale -1", with_scheme(scale=-1.0)), ("scale 0", with_scheme(scale=0))]
    else:
        out.append(("a scale", with_scheme(scale=1)))
    if m not in PACKED and m not in {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0"}:  # none and the engine formats
        out += [("outliers", with_scheme(outliers=0.01)), ("residual", with_scheme(residual=1)),
                ("sparsity", with_scheme(sparsity=0.1)), ("channel axis", with_scheme(axis="channel"))]
        if m not in rotating:
            out.append(("rotate", with_scheme(rotate=True)))
    if "rotation" in rec:
        out.append(("rotation without rotate", with_scheme(rotate=False)))
    else:
        out.append(("a rotation", dict(rec, rotation=64)))
    if "wire" in rec:
        out.append(("wire-coded outliers", dict(rec, wire=[".codes", ".outlier_value"])))
        out.append(("a wire-coded part twice", dict(rec, wire=[".codes", ".codes"])))
    if m == "lmcache:cachegen":
        out += [("bins 8", dict(rec, bins=8)), ("bins left out", {k: v for k, v in rec.items() if k != "bins"})]
    else:
        out.append(("bins", dict(rec, bins=32)))
    return out


def test_wrong_records_fail(written):
    """A schema that let anything through would pass the tests above: every record, with one field made
    wrong for its method, fails."""
    record_ok = _validator({"$defs": SCHEMA["$defs"], "$ref": "#/$defs/TensorRecord"})
    rotating = {r["key_scheme"]["method"] for r in written["rows"] if r["key_scheme"]["rotate"] and ":" in r["key_scheme"]["method"]}
    assert rotating == {f"llama.cpp:{t}" for t in ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")}
    passed, seen = [], set()
    for run in written["runs"]:
        for rec in run["records"]:
            key = json.dumps([rec["scheme"], "rotation" in rec, "bins" in rec], sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            assert record_ok.is_valid(rec), (run["label"], rec)
            passed += [f"{run['label']}: {rec['name']} with {what}" for what, bad in _wrong(rec, rotating) if record_ok.is_valid(bad)]
    assert not passed, "the schema accepts:\n" + "\n".join(passed)

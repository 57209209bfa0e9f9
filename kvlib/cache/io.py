"""Step 1: take a model's KV cache (a transformers DynamicCache), save it as
safetensors for the Go codec, and load a (reconstructed) cache back.

Tensors are named ``layer_{i}_key`` / ``layer_{i}_value`` with shape
[batch=1, num_kv_heads, seq_len, head_dim] (GQA: KV heads, not query heads).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import DynamicCache  # noqa: F401  (the type callers get back)

from kvlib.cache.layout import FULL, CacheLayout, layout_of, make_cache, new_cache
from kvlib.cache.layout import cache_layers
from kvlib.dtypes import stored

# TinyLlama-1.1B-Chat geometry, the design documents' reference model.
TINYLLAMA_NUM_LAYERS = 22
TINYLLAMA_NUM_KV_HEADS = 4  # GQA: 4 KV heads, not 32
TINYLLAMA_NUM_QUERY_HEADS = 32
TINYLLAMA_HEAD_DIM = 64
TINYLLAMA_HIDDEN_SIZE = 2048
TINYLLAMA_VOCAB_SIZE = 32000



@dataclass
class KVCacheMetadata:
    """Geometry and provenance of a saved KV cache."""

    num_layers: int
    num_kv_heads: int
    seq_len: int
    head_dim: int
    dtype: str
    model_name: str
    layer_windows: str = ""  # per layer, 0 (full attention) or its sliding window: CacheLayout.to_string()

    @property
    def layout(self) -> CacheLayout:
        """The cache's layout; seq_len is the tokens it has seen (sliding layers store fewer)."""
        if not self.layer_windows:
            return CacheLayout((FULL,) * self.num_layers, self.seq_len)
        return CacheLayout.from_string(self.layer_windows, self.seq_len)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KVCacheMetadata":
        return cls(
            num_layers=int(d["num_layers"]),
            num_kv_heads=int(d["num_kv_heads"]),
            seq_len=int(d["seq_len"]),
            head_dim=int(d["head_dim"]),
            dtype=str(d["dtype"]),
            model_name=str(d["model_name"]),
            layer_windows=str(d.get("layer_windows", "")),
        )



def _check_cache(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    if not layers:
        raise ValueError("KV cache is empty: no layers")
    k0 = layers[0][0]
    if k0.dim() != 4:
        raise ValueError(f"KV cache tensors must be [batch, kv_heads, seq, head_dim], got shape {tuple(k0.shape)}")
    if k0.shape[0] != 1:
        raise ValueError(f"KV cache batch size must be 1, got {k0.shape[0]}")
    if k0.shape[2] == 0:
        raise ValueError("KV cache is empty: sequence length 0")


def metadata_of(cache: Any, model_name: str = "unknown") -> KVCacheMetadata:
    """Describe a cache's geometry (ValueError if empty or batch != 1)."""
    layers = cache_layers(cache)
    _check_cache(layers)
    k = layers[0][0]
    layout = layout_of(cache)
    return KVCacheMetadata(
        num_layers=len(layers),
        num_kv_heads=int(k.shape[1]),
        seq_len=layout.seen,
        head_dim=int(k.shape[3]),
        dtype=str(k.dtype).removeprefix("torch."),
        model_name=model_name,
        layer_windows=layout.to_string() if layout.sliding else "",
    )



@torch.no_grad()
def extract_kv_cache(
    model: Any,
    tokenizer: Any,
    prompt: str,
    max_length: int | None = None,
    device: str | None = None,
) -> tuple[DynamicCache, KVCacheMetadata]:
    """Run ``prompt`` through ``model`` once and return its KV cache and metadata."""
    device = device or str(next(model.parameters()).device)
    enc = tokenizer(prompt, return_tensors="pt", truncation=max_length is not None, max_length=max_length)
    input_ids = enc["input_ids"].to(device)
    if input_ids.shape[0] != 1:
        raise ValueError(f"batch size must be 1, got {input_ids.shape[0]}")
    if input_ids.shape[1] == 0:
        raise ValueError("prompt tokenized to zero tokens: the KV cache would be empty")
    out = model(input_ids=input_ids, past_key_values=new_cache(model), use_cache=True)
    cache = out.past_key_values
    name = getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "unknown")
    return cache, metadata_of(cache, name)


def _default_metadata_path(path: str | os.PathLike) -> Path:
    return Path(f"{path}.metadata.json")


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_metadata(meta: KVCacheMetadata, dtype: str) -> dict[str, str]:
    """The safetensors header a saved cache carries (``dtype``: what it is stored as, e.g. "float32");
    ``meta.dtype`` becomes that too."""
    meta.dtype = dtype
    return {k: str(v) for k, v in meta.to_dict().items() if v != ""}


def layer_metadata(layer: int, key: torch.Tensor, model_name: str = "unknown") -> dict[str, str]:
    """The header of a file (or shared segment) holding one layer's K and V: write mode sends
    each layer to the codec as it is written, named ``layer_{layer}_key``/``_value`` so per-layer
    schemes apply."""
    meta = KVCacheMetadata(num_layers=layer + 1, num_kv_heads=int(key.shape[1]), seq_len=int(key.shape[2]),
                           head_dim=int(key.shape[3]), dtype="", model_name=model_name)
    return file_metadata(meta, stored(key.dtype).name)


def save_kv_cache(
    cache: Any,
    path: str | os.PathLike,
    metadata_path: str | os.PathLike | None = None,
    model_name: str = "unknown",
) -> KVCacheMetadata:
    """Save a cache as safetensors (bfloat16 becomes float32) plus a metadata JSON beside it.

    Both files are written to a temp file and renamed, so a failure leaves nothing half-written.
    """
    layers = cache_layers(cache)
    meta = metadata_of(cache, model_name)
    tensors: dict[str, torch.Tensor] = {}
    for i, (k, v) in enumerate(layers):
        for kind, t in (("key", k), ("value", v)):
            t = t.to(stored(t.dtype).torch)
            tensors[f"layer_{i}_{kind}"] = t.detach().to("cpu").contiguous()
    header = file_metadata(meta, stored(tensors["layer_0_key"].dtype).name)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=header)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _atomic_write_text(Path(metadata_path or _default_metadata_path(path)), json.dumps(meta.to_dict(), indent=2) + "\n")
    return meta


def load_kv_cache(
    path: str | os.PathLike,
    metadata_path: str | os.PathLike | None = None,
    device: str = "cpu",
) -> tuple[DynamicCache, KVCacheMetadata]:
    """Load a cache saved by ``save_kv_cache`` (or restored by kv-compress) as a DynamicCache.

    Metadata comes from the JSON beside the file when present, else from the
    safetensors header, else from the tensors themselves.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such KV cache file")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            names = set(f.keys())
            header = f.metadata() or {}
            layers = []
            i = 0
            while f"layer_{i}_key" in names:
                if f"layer_{i}_value" not in names:
                    raise ValueError(f"{path}: layer {i} has a key but no value tensor")
                layers.append((f.get_tensor(f"layer_{i}_key").to(device), f.get_tensor(f"layer_{i}_value").to(device)))
                i += 1
    except ValueError:
        raise
    except Exception as e:  # safetensors raises its own error types for a corrupt file
        raise ValueError(f"{path}: not a readable safetensors file: {e}") from e
    if not layers:
        raise ValueError(f"{path}: no layer_0_key tensor: not a KV cache saved by kvlib")
    if len(names) != 2 * len(layers):
        extra = sorted(names - {f"layer_{j}_{k}" for j in range(len(layers)) for k in ("key", "value")})
        raise ValueError(f"{path}: unexpected tensors {extra[:5]} (layers must be numbered from 0 without gaps)")
    try:
        _check_cache(layers)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    mp = Path(metadata_path) if metadata_path else _default_metadata_path(path)
    if mp.exists():
        meta = KVCacheMetadata.from_dict(json.loads(mp.read_text()))
    elif "model_name" in header:
        meta = KVCacheMetadata.from_dict(header)
    else:
        meta = metadata_of(make_cache(layers))
    try:  # sliding-window layers come back as the model holds them
        cache = make_cache(layers, meta.layout if meta.layer_windows else None)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return cache, meta


def validate_kv_cache_shape(
    cache: Any,
    expected_layers: int = TINYLLAMA_NUM_LAYERS,
    expected_kv_heads: int = TINYLLAMA_NUM_KV_HEADS,
    expected_head_dim: int = TINYLLAMA_HEAD_DIM,
) -> tuple[bool, list[str]]:
    """Check a cache against a model's geometry; return (ok, list of problems)."""
    errors: list[str] = []
    layers = cache_layers(cache)
    if len(layers) != expected_layers:
        errors.append(f"expected {expected_layers} layers, got {len(layers)}")
    layout = layout_of(cache)
    for i, (k, v) in enumerate(layers):
        for kind, t in (("key", k), ("value", v)):
            if t.dim() != 4:
                errors.append(f"layer {i} {kind}: expected 4 dims [batch, kv_heads, seq, head_dim], got {tuple(t.shape)}")
                continue
            b, h, s, d = t.shape
            if b != 1:
                errors.append(f"layer {i} {kind}: batch size {b}, expected 1")
            if h != expected_kv_heads:
                hint = " (query heads instead of KV heads? GQA caches hold KV heads)" if h > expected_kv_heads else ""
                errors.append(f"layer {i} {kind}: {h} KV heads, expected {expected_kv_heads}{hint}")
            if d != expected_head_dim:
                errors.append(f"layer {i} {kind}: head_dim {d}, expected {expected_head_dim}")
            if i < len(layout.windows) and s != layout.stored(i):
                errors.append(f"layer {i} {kind}: seq_len {s}, its layout holds {layout.stored(i)} "
                              f"({layout.seen} tokens seen, window {layout.windows[i] or 'full'})")
    return not errors, errors


def expected_geometry(config: Any) -> dict[str, int]:
    """The KV geometry a model config implies: layers, KV heads, head_dim."""
    heads = config.num_attention_heads
    return {
        "expected_layers": config.num_hidden_layers,
        "expected_kv_heads": getattr(config, "num_key_value_heads", None) or heads,
        "expected_head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
    }


def compute_kv_cache_stats(cache: Any) -> dict[str, Any]:
    """Size and value statistics of a cache (over keys and values together)."""
    layers = cache_layers(cache)
    meta = metadata_of(cache)
    flat = torch.cat([t.detach().float().reshape(-1) for kv in layers for t in kv])
    total_bytes = sum(t.numel() * t.element_size() for kv in layers for t in kv)
    return {
        "num_layers": meta.num_layers,
        "num_kv_heads": meta.num_kv_heads,
        "seq_len": meta.seq_len,
        "head_dim": meta.head_dim,
        "total_elements": int(flat.numel()),
        "total_bytes": int(total_bytes),
        "total_mb": total_bytes / (1024 * 1024),
        "dtype": meta.dtype,
        "value_mean": float(flat.mean()),
        "value_std": float(flat.std()),
        "value_min": float(flat.min()),
        "value_max": float(flat.max()),
    }

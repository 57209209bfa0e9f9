"""Which schemes kv-compress refuses for a model's cache, and why, before any window runs.

An engine refuses some of its formats for some models (llama.cpp's blocks of 32 must divide
head_dim; vLLM's int4 Hadamard needs a power-of-two head size; ExLlama's chunks need a multiple of
64...). A sweep of an engine's menu lists such an option as unavailable with the engine's own
reason instead of failing on the first window or running something else: each scheme is tried once
on a small cache of the model's geometry (random values: a refusal depends on the shapes, the
dtype and the layer names, never on the values).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from kvlib.cache.io import KVCacheMetadata, file_metadata
from kvlib.codec.cli import KVCompressError, get_compression_metrics
from kvlib.codec.spec import CodecConfig

# Tokens of the probe cache: more than one block or group of every format along tokens (KIVI's
# per-channel groups of 128 tokens, ExLlamaV2's chunks) would cost time without adding a refusal,
# so a few groups' worth.
PROBE_TOKENS = 64


def probe_cache(geometry: dict[str, Any], path: Path, tokens: int = PROBE_TOKENS) -> Path:
    """A float32 cache of ``geometry``'s layers, KV heads and head_dim (kvlib.cache.layout.geometry),
    ``tokens`` long, of seeded normal values, saved as kv-compress reads it."""
    g = torch.Generator().manual_seed(0)
    layers, heads, dim = int(geometry["num_layers"]), int(geometry["num_kv_heads"]), int(geometry["head_dim"])
    shape = (1, heads, tokens, dim)
    tensors = {f"layer_{i}_{role}": torch.randn(shape, generator=g) for i in range(layers) for role in ("key", "value")}
    meta = KVCacheMetadata(num_layers=layers, num_kv_heads=heads, seq_len=tokens, head_dim=dim, dtype="",
                           model_name="preflight")
    save_file(tensors, str(path), metadata=file_metadata(meta, "float32"))
    return path


def _reason(err: KVCompressError, probe: Path) -> str:
    """kv-compress's one line without the command's prefix and the probe file's name: what it refused."""
    line = re.sub(r"^kv-compress \w+: ", "", str(err))
    return re.sub(re.escape(str(probe)) + r":?\s*", "", line).strip()


def refusals(codecs: list[CodecConfig], geometry: dict[str, Any]) -> dict[str, str]:
    """{scheme name: kv-compress's reason} for each of ``codecs`` it refuses on a cache of
    ``geometry``; the others are absent. One CLI call a scheme on a cache of PROBE_TOKENS tokens."""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kvlib-preflight-") as tmp:
        probe = probe_cache(geometry, Path(tmp) / "probe.safetensors")
        for c in codecs:
            try:
                get_compression_metrics(probe, codec=c)
            except KVCompressError as e:
                out[c.name] = _reason(e, probe)
    return out

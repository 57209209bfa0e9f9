"""Which schemes kv-compress refuses for a model's cache, and why, before any window runs.

An engine refuses some of its formats for some models (llama.cpp's blocks of 32 must divide
head_dim; vLLM's int4 Hadamard needs a power-of-two head size; ExLlama's chunks need a multiple of
64...). A sweep of an engine's menu lists such an option as unavailable with the engine's own
reason instead of failing on the first window or running something else: each scheme is tried once
on caches of the shapes the run will give it (random values: a refusal depends on the shapes and
the layer names, never on the values).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from kvlib.cache.io import KVCacheMetadata, file_metadata
from kvlib.codec.cli import KVCompressError, get_compression_metrics
from kvlib.codec.spec import CodecConfig

Shapes = list[tuple[int, str, tuple[int, ...]]]  # (layer, role, [batch, heads, tokens, head_dim])


def probe_layouts(shapes: Shapes) -> list[dict[int, tuple[int, ...]]]:
    """The caches that hold every (layer, shape) of ``shapes`` (the K and V a run's transforms get,
    kvlib.transforms.base.run_shapes) with a layer once per cache: as many as a layer has distinct
    shapes (a sliding layer's context and a full one's, the last window's shorter K/V)."""
    per_layer: dict[int, list[tuple[int, ...]]] = {}
    for layer, _, shape in shapes:
        if shape not in per_layer.setdefault(layer, []):
            per_layer[layer].append(shape)
    n = max((len(v) for v in per_layer.values()), default=0)
    return [{layer: v[k % len(v)] for layer, v in sorted(per_layer.items())} for k in range(n)]


def probe_cache(layout: dict[int, tuple[int, ...]], path: Path) -> Path:
    """A float32 cache of ``layout``'s layers and shapes (K and V alike), of seeded normal values,
    saved as kv-compress reads it."""
    g = torch.Generator().manual_seed(0)
    tensors = {f"layer_{i}_{role}": torch.randn(shape, generator=g) for i, shape in layout.items()
               for role in ("key", "value")}
    _, heads, tokens, dim = max(layout.values(), key=lambda shape: shape[2])
    meta = KVCacheMetadata(num_layers=len(layout), num_kv_heads=heads, seq_len=tokens, head_dim=dim, dtype="",
                           model_name="preflight")
    save_file(tensors, str(path), metadata=file_metadata(meta, "float32"))
    return path


def _reason(err: KVCompressError, probe: Path) -> str:
    """kv-compress's one line without the command's prefix and the probe file's name: what it refused."""
    line = re.sub(r"^kv-compress \w+: ", "", str(err))
    return re.sub(re.escape(str(probe)) + r":?\s*", "", line).strip()


def refusals(codecs: list[CodecConfig], shapes: Shapes) -> dict[str, str]:
    """{scheme name: kv-compress's reason} for each of ``codecs`` it refuses on a cache of the
    run's ``shapes`` (every K and V it will compress: a refusal can depend on the token count, a
    kvlib block format's elements per tensor); the others are absent. One CLI call a scheme and
    probe cache (random values: a refusal depends on shapes and layer names, never on values)."""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kvlib-preflight-") as tmp:
        for k, layout in enumerate(probe_layouts(shapes)):
            probe = probe_cache(layout, Path(tmp) / f"probe-{k}.safetensors")
            for c in codecs:
                if c.name in out:
                    continue
                try:
                    get_compression_metrics(probe, codec=c)
                except KVCompressError as e:
                    out[c.name] = _reason(e, probe)
            probe.unlink()
    return out

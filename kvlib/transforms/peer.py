"""The peer: transformers' own ``QuantizedCache`` (optimum-quanto backend),
run through the same windows and targets as kvlib's schemes, so a user sees
what they would otherwise get. Its residual length covers nothing, so the
whole context is quantized, as kvlib quantizes it.

Its storage and reconstruction error are measured from the quantized tensors
themselves and reported in the CLI's JSON shape, so the sweep pools them with
the same code. ``QuantizedCachePeer`` is what every backend's peer shares (the
HQQ backend's, opt-in: kvlib.transforms.hqq_peer).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from kvlib.cache.layout import cache_layers, cache_like
from kvlib.codec.metrics import CompressionMetrics, pooled_quality
from kvlib.transforms.base import CacheTransform, register_peer

PEER_BITS = (4, 2)
PEER_GROUP = 64


def peer_name(nbits: int) -> str:
    return f"hf-quanto-int{nbits}"


def package_version(name: str) -> str:
    """An installed distribution's version ("?" when absent), as a peer unit's key names it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def quanto_version() -> str:
    """optimum-quanto's version ("?" when absent)."""
    return package_version("optimum-quanto")


def peer_unavailable() -> str | None:
    """Why the peer cannot run here, or None when it can."""
    try:
        import optimum.quanto  # noqa: F401
        from transformers import QuantizedCache  # noqa: F401
    except Exception as e:  # ImportError, or a broken extension build
        return f"optimum-quanto cannot be imported ({type(e).__name__}: {e})"
    return None


def _sums(x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    x, y = x.double().reshape(-1), y.double().reshape(-1)
    e = y - x
    return {"n": x.numel(), "sum_x2": float(x @ x), "sum_y2": float(y @ y), "sum_xy": float(x @ y),
            "sum_e2": float(e @ e), "max_error": float(e.abs().max()) if e.numel() else 0.0}


def _nbytes(q: Any) -> int:
    """Bytes a quanto tensor stores: packed codes, scales and shifts."""
    total = 0
    for name in ("_data", "_scale", "_shift"):
        t = getattr(q, name, None)
        if t is None:
            continue
        t = getattr(t, "_data", t)  # PackedTensor keeps its bytes in _data
        total += t.numel() * t.element_size()
    return total


class QuantizedCachePeer(CacheTransform):
    """A cache transform: ``(cache) -> (DynamicCache, CompressionMetrics)``, one of transformers'
    ``QuantizedCache`` layers per cache layer (a backend's subclass says which, in ``_layer``).

    The returned cache holds QuantizedCache's dequantized context, which is
    exactly what its attention reads for the next tokens; tokens added after
    it stay exact, as with kvlib's codecs (a QuantizedCache with residual 0
    would re-quantize every generated token, a different experiment)."""

    kind = "peer"

    def __init__(self, nbits: int, q_group_size: int = PEER_GROUP) -> None:
        self.nbits, self.q_group_size = nbits, q_group_size

    def _layer(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[list[torch.Tensor], list[dict], int]:
        """One layer through the backend's quantized layer: (reconstructions, tensor entries, bytes)."""
        raise NotImplementedError

    def _read(self, layer: Any, i: int, k: torch.Tensor, v: torch.Tensor, nbytes: Any
              ) -> tuple[list[torch.Tensor], list[dict], int]:
        """Layer ``i``'s K and V through a transformers quantized cache layer: the reconstruction,
        each tensor's entry, and the bytes ``nbytes`` counts in the quantized tensors."""
        layer.update(k, v)
        pair, tensors, stored = [], [], 0
        for role, x, q in (("key", k, layer._quantized_keys), ("value", v, layer._quantized_values)):
            y = layer._dequantize(q).to(x.dtype)
            pair.append(y)
            tensors.append(self._entry(i, role, x, y))
            stored += nbytes(q)
        return pair, tensors, stored

    @staticmethod
    def _entry(i: int, role: str, x: torch.Tensor, y: torch.Tensor) -> dict:
        s = _sums(x.float(), y.float())
        return {"name": f"layer_{i}_{role}", "sums": s, "head_sums": [], "error_histogram": [], **pooled_quality(s)}

    def _metrics(self, tensors: list[dict], stored: int, n: int) -> CompressionMetrics:
        total = {key: sum(t["sums"][key] for t in tensors) for key in ("n", "sum_x2", "sum_y2", "sum_xy", "sum_e2")}
        total["max_error"] = max((t["sums"]["max_error"] for t in tensors), default=0.0)
        return CompressionMetrics.from_dict({
            "command": "peer", "scheme": self.name, "scheme_name": self.name,
            "compression_ratio": 2 * n / stored if stored else 0.0, "original_size_bytes": 2 * n,
            "compressed_size_bytes": stored, "bits_per_element": 8 * stored / n if n else 0.0,
            "num_elements": n, "num_tensors": len(tensors), "passed": True, "violations": [],
            "sums": total, "tensors": tensors, **pooled_quality(total),
        })

    def _announce(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Say what a first call will take, when it is long and silent (nothing by default)."""

    def __call__(self, cache: Any) -> tuple[Any, CompressionMetrics]:
        layers = cache_layers(cache)
        self._announce(layers)
        tensors, stored, n, restored = [], 0, 0, []
        for i, (k, v) in enumerate(layers):
            pair, ts, nbytes = self._layer(i, k, v)
            tensors += ts
            stored += nbytes
            n += k.numel() + v.numel()
            restored.append((pair[0], pair[1]))
        return cache_like(cache, restored), self._metrics(tensors, stored, n)

    def roundtrip_layer(self, layer: int, key: Any, value: Any) -> tuple[Any, Any, CompressionMetrics]:
        pair, tensors, stored = self._layer(layer, key, value)
        return pair[0], pair[1], self._metrics(tensors, stored, key.numel() + value.numel())


class QuantoPeer(QuantizedCachePeer):
    """transformers' QuantizedCache with the optimum-quanto backend (its layer's defaults: axis 0,
    that is groups of ``q_group_size`` consecutive elements along head_dim)."""

    _announced = False  # the CUDA build note is printed once per process

    def __init__(self, nbits: int, q_group_size: int = PEER_GROUP) -> None:
        super().__init__(nbits, q_group_size)
        self.name = peer_name(nbits)

    @property
    def spec(self) -> str:
        return f"transformers QuantizedCache, quanto int{self.nbits}, group {self.q_group_size}, residual 0"

    @property
    def key(self) -> str:
        return f"{self.spec}, optimum-quanto {quanto_version()}"

    def _layer(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[list[torch.Tensor], list[dict], int]:
        from transformers.cache_utils import QuantoQuantizedLayer

        # QuantizedCache(backend="quanto") holds one of these per layer, built with these settings. It is
        # used layer by layer because QuantizedCache refuses models with sliding-window layers; here each
        # layer quantizes exactly what it stores, as kvlib's codecs do.
        layer = QuantoQuantizedLayer(nbits=self.nbits, q_group_size=self.q_group_size, residual_length=0)
        return self._read(layer, i, k, v, _nbytes)

    def _announce(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if layers and layers[0][0].is_cuda and not QuantoPeer._announced:
            QuantoPeer._announced = True  # its first CUDA call is silent for minutes otherwise
            print("kvlib: optimum-quanto builds its CUDA extension on first use (about 2 minutes, once per machine); "
                  "--no-peers skips the peer", file=sys.stderr, flush=True)


@register_peer("hf-quanto", lambda: peer_unavailable())  # looked up when asked
def quanto_peers() -> list[CacheTransform]:
    """transformers' QuantizedCache at each of PEER_BITS."""
    return [QuantoPeer(b) for b in PEER_BITS]

"""What each layer of a model's KV cache holds, and caches built in that layout.

Transformers lays a decoder's cache out per layer: full-attention layers keep
every token, sliding-window layers (Gemma 2/3, Mistral, gpt-oss, ...) keep only
the last ``window - 1`` and count the tokens they have seen. kvlib compresses
exactly what each layer stores, so a reconstruction must go back into a cache of
the same layout: ``cache_like`` rebuilds one around new tensors, ``new_cache``
gives an empty one for a model, ``context_cache`` the first n tokens of a
forward pass as the model would hold them. Caches that are not key/value
tensors per layer (Mamba and linear-attention states, encoder-decoder caches)
are refused with one line naming the layer type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

FULL = 0  # the window of a full-attention layer


@dataclass(frozen=True)
class CacheLayout:
    """Per layer, its attention window (0: full attention; W: keeps the last W-1 tokens),
    and how many tokens the cache has seen."""

    windows: tuple[int, ...]
    seen: int

    def stored(self, layer: int) -> int:
        """Tokens layer ``layer`` holds after ``seen`` tokens."""
        w = self.windows[layer]
        return self.seen if w == FULL else min(self.seen, w - 1)

    @property
    def sliding(self) -> bool:
        return any(w != FULL for w in self.windows)

    def describe(self) -> str:
        """E.g. '15 sliding (window 512) + 3 full-attention layers'."""
        full = sum(w == FULL for w in self.windows)
        slid = sorted({w for w in self.windows if w != FULL})
        if not slid:
            return f"{full} full-attention layers"
        ws = ", ".join(str(w) for w in slid)
        return f"{len(self.windows) - full} sliding (window {ws}) + {full} full-attention layers"

    def to_string(self) -> str:
        """'0,512,512,...' (the safetensors metadata form; 0 is full attention)."""
        return ",".join(str(w) for w in self.windows)

    @classmethod
    def from_string(cls, s: str, seen: int) -> "CacheLayout":
        return cls(tuple(int(x) for x in s.split(",")), seen)


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(key, value) per layer of a DynamicCache (transformers 4.x or 5.x) or a legacy tuple cache."""
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return [(layer.keys, layer.values) for layer in cache.layers if getattr(layer, "keys", None) is not None]
    if hasattr(cache, "key_cache"):  # older DynamicCache
        return list(zip(cache.key_cache, cache.value_cache))
    return [(k, v) for k, v, *_ in cache]


def unsupported_layer(layer: Any, index: int) -> str | None:
    """Why a cache layer is not key/value tensors kvlib can compress (None if it is)."""
    if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer):
        return None
    return (f"layer {index} of the model's cache is a {type(layer).__name__}, not key/value tensors per token: "
            f"kvlib compresses key/value caches (full or sliding-window attention) only")


def _check_supported(cache: Any) -> None:
    if not isinstance(cache, DynamicCache):
        raise ValueError(f"the model's cache is a {type(cache).__name__}, not a DynamicCache of key/value tensors: "
                         f"kvlib compresses decoder-only key/value caches only")
    for i, layer in enumerate(cache.layers):
        why = unsupported_layer(layer, i)
        if why:
            raise ValueError(why)


def new_cache(model: Any, record_past: bool = False) -> DynamicCache:
    """An empty cache in the model's own layout; with ``record_past`` its sliding layers keep
    every token of the next forward pass (so ``context_cache`` can cut any prefix out of it).
    ValueError, naming the layer type, for a cache kvlib cannot compress."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{config.model_type} is an encoder-decoder model: kvlib validates decoder-only caches")
    cache = DynamicCache(config=config)
    _check_supported(cache)
    for layer in cache.layers:
        if record_past and isinstance(layer, DynamicSlidingWindowLayer):
            layer.activate_past_recording()
    return cache


def layout_of(cache: Any) -> CacheLayout:
    """The layout a cache has now (a plain DynamicCache is all full attention)."""
    if not hasattr(cache, "layers"):
        layers = list(cache)
        return CacheLayout((FULL,) * len(layers), int(layers[0][0].shape[2]))
    windows, seen = [], 0
    for layer in cache.layers:
        if isinstance(layer, DynamicSlidingWindowLayer):
            windows.append(int(layer.sliding_window))
            seen = max(seen, int(layer.cumulative_length))
        else:
            windows.append(FULL)
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                seen = max(seen, int(layer.keys.shape[2]))
    return CacheLayout(tuple(windows), seen)


class AppendLayer(DynamicLayer):
    """A full-attention layer that appends in place: its keys and values are the filled prefix of
    buffers with room for ``reserve`` more tokens, so decoding writes each new token once instead
    of copying the whole cache per step (``DynamicLayer.update`` concatenates). The same tensors
    reach attention; the buffers are (re)made only when the room runs out or the prefix was
    replaced (reorder, repeat), and rows leaving the batch are compacted within them."""

    def __init__(self, reserve: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reserve = int(reserve)
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def _room(self, n: int, t: int) -> bool:
        if self._buffers is None:
            return False
        kb, vb = self._buffers
        return (n + t <= kb.shape[-2] and self.keys.data_ptr() == kb.data_ptr()
                and self.values.data_ptr() == vb.data_ptr() and self.keys.shape[:2] == kb.shape[:2])

    def hold(self, keys: torch.Tensor, values: torch.Tensor, adopt: bool = False) -> None:
        """Hold ``keys`` and ``values`` [B, H, n, D]. With ``adopt`` they are the cache's own, made by
        ``room_for``: appending writes into their buffers. Without, nothing is ever written into
        them (the first append copies them into new buffers)."""
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values
        bufs = [_whole(t) for t in (keys, values)] if adopt else [None, None]
        self._buffers = (bufs[0], bufs[1]) if bufs[0] is not None and bufs[1] is not None else None

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` (increasing), moved to the front of the same buffers: no new
        allocation, and rows already in place are not copied."""
        n = self.keys.shape[-2] if self.is_initialized and self.keys.numel() else 0
        if n == 0 or self._buffers is None or not self._room(n, 0):
            return super().batch_select_indices(indices)
        rows = [int(i) for i in indices.tolist()]
        if indices.dtype == torch.bool or any(b <= a for a, b in zip(rows, rows[1:])):
            return super().batch_select_indices(indices)
        kb, vb = self._buffers
        for j, r in enumerate(rows):
            if j != r:
                kb[j, :, :n], vb[j, :, :n] = kb[r, :, :n], vb[r, :, :n]
        self._buffers = (kb[:len(rows)], vb[:len(rows)])
        self.keys, self.values = self._buffers[0][:, :, :n], self._buffers[1][:, :, :n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.keys.shape[-2] if self.keys.numel() else 0
        t = key_states.shape[-2]
        if not self._room(n, t):
            cap = n + t + self.reserve
            kb = key_states.new_empty((*key_states.shape[:2], cap, key_states.shape[-1]))
            vb = value_states.new_empty((*value_states.shape[:2], cap, value_states.shape[-1]))
            if n:
                kb[:, :, :n], vb[:, :, :n] = self.keys, self.values
            self._buffers = (kb, vb)
        kb, vb = self._buffers  # type: ignore[misc]
        kb[:, :, n:n + t], vb[:, :, n:n + t] = key_states, value_states
        self.keys, self.values = kb[:, :, :n + t], vb[:, :, :n + t]
        return self.keys, self.values


def room_for(like: torch.Tensor, rows: int, tokens: int, reserve: int) -> torch.Tensor:
    """A [rows, H, tokens, D] tensor shaped like ``like`` whose storage has room for ``reserve``
    more tokens, which an ``AppendLayer`` holding it appends into without copying."""
    buf = like.new_empty((rows, like.shape[1], tokens + reserve, like.shape[3]))
    return buf[:, :, :tokens]


def _whole(t: torch.Tensor) -> torch.Tensor | None:
    """The buffer [B, H, cap, D] that ``t`` [B, H, n, D] is the first n tokens of, if it is one."""
    b, h, n, d = t.shape
    if t.stride(3) != 1 or t.stride(2) != d or t.stride(1) % d or t.storage_offset() != 0:
        return None
    cap = t.stride(1) // d
    if cap < n or t.stride(0) != h * cap * d or t.untyped_storage().nbytes() < b * h * cap * d * t.element_size():
        return None
    return t.as_strided((b, h, cap, d), (h * cap * d, cap * d, d, 1))


def make_cache(layers: list[tuple[torch.Tensor, torch.Tensor]], layout: CacheLayout | None = None,
               reserve: int = 0, adopt: bool = False) -> DynamicCache:
    """A cache holding the given (key, value) tensors, in ``layout`` (default: all full attention).

    A sliding layer's tensors must hold what it stores (``layout.stored(i)`` tokens);
    it counts ``layout.seen`` tokens, so the next forward masks and positions as the
    model's own cache would. ``reserve`` > 0: full-attention layers append in place
    (``AppendLayer``), with room for that many tokens past the first ones fed; ``adopt``: the
    full layers' tensors come from ``room_for`` and are the cache's to append into."""
    cache = DynamicCache()
    if layout is None and reserve:
        layout = CacheLayout((FULL,) * len(layers), int(layers[0][0].shape[2]) if layers else 0)
    if layout is None:
        for i, (k, v) in enumerate(layers):
            cache.update(k, v, i)
        return cache
    if len(layout.windows) != len(layers):
        raise ValueError(f"a layout of {len(layout.windows)} layers for {len(layers)} (key, value) pairs")
    built = []
    for i, ((k, v), w) in enumerate(zip(layers, layout.windows)):
        if k.shape[2] != layout.stored(i) or v.shape[2] != k.shape[2]:
            raise ValueError(f"layer {i}: {k.shape[2]} key / {v.shape[2]} value tokens, its layout stores "
                             f"{layout.stored(i)} (window {w or 'full'}, {layout.seen} tokens seen)")
        layer: DynamicLayer = (DynamicSlidingWindowLayer(sliding_window=w) if w != FULL
                               else AppendLayer(reserve) if reserve else DynamicLayer())
        if isinstance(layer, AppendLayer):
            layer.hold(k, v, adopt)
        else:
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
        if w != FULL:
            layer.cumulative_length = layout.seen
        built.append(layer)
    cache.layers = built
    return cache


def cache_like(template: Any, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A new cache in ``template``'s layout holding the given tensors (a reconstruction of it)."""
    return make_cache(layers, layout_of(template))


def context_cache(cache: Any, n: int) -> DynamicCache:
    """The cache of the first ``n`` tokens, cut from a ``new_cache`` that saw more, laid out
    as the model would hold it after seeing exactly those n tokens."""
    layout = CacheLayout(layout_of(cache).windows, n)
    cut = []
    for i, (k, v) in enumerate(cache_layers(cache)):
        keep = layout.stored(i)
        if k.shape[2] < n:
            raise ValueError(f"layer {i} holds {k.shape[2]} tokens, fewer than the {n} to keep "
                             f"(a sliding layer that did not record its past: build the cache with new_cache)")
        cut.append((k[:, :, n - keep:n], v[:, :, n - keep:n]))
    return make_cache(cut, layout)


def model_layout(model: Any) -> CacheLayout:
    """The layout of ``model``'s cache (no tokens seen yet): run before any window, it is
    where a model kvlib cannot compress fails, with the layer type named."""
    return layout_of(new_cache(model))


def geometry(model: Any) -> dict[str, Any]:
    """What a report shows of a model's cache: layers, KV heads, head_dim, and each layer's window."""
    c = model.config.get_text_config(decoder=True)
    heads = c.num_attention_heads
    lay = model_layout(model)
    return {"num_layers": len(lay.windows), "num_kv_heads": getattr(c, "num_key_value_heads", None) or heads,
            "head_dim": getattr(c, "head_dim", None) or c.hidden_size // heads, "num_query_heads": int(heads),
            "layer_windows": list(lay.windows), "layers": lay.describe()}

"""Eviction peers: keep a fraction of the context's tokens per (layer, KV head), drop the rest —
the other family users weigh against quantization, compared at equal bytes.

The presses follow NVIDIA kvpress 0.5.5 (``kvpress/presses/scorer_press.py``,
``streaming_llm_press.py``, ``knorm_press.py``, ``snapkv_press.py``; docs/research/kvpress-presses.md
quotes the lines): a press scores every context token of every KV head, and each head keeps its
``max(1, int(T * (1 - compression_ratio)))`` best. Kept keys carry the
RoPE of their original positions, so whoever decodes after an evicted cache must give the new
tokens their original positions (``EvictedCache.seen``). Registry: ``PRESSES`` (name → class).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from kvlib.cache.layout import FULL, cache_layers, layout_of, make_cache
from kvlib.transforms.base import CacheTransform

PRESSES: dict[str, type["Press"]] = {}


def register_press(cls: type["Press"]) -> type["Press"]:
    """Class decorator: a press under its ``name`` (kvpress's name → press dict)."""
    if cls.name in PRESSES:
        raise ValueError(f"press {cls.name!r} registered twice")
    PRESSES[cls.name] = cls
    return cls


@dataclass(frozen=True)
class EvictionMetrics:
    """What an evicted cache holds: kept tokens of the context, and its bytes at 16 bits."""

    context_tokens: int
    kept_tokens: int  # per (layer, KV head)
    bytes_bf16: int  # keys and values of every layer at 2 bytes an element

    @property
    def keep(self) -> float:
        return self.kept_tokens / self.context_tokens if self.context_tokens else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"context_tokens": self.context_tokens, "kept_tokens": self.kept_tokens,
                "bytes_bf16": self.bytes_bf16, "keep": self.keep}


def kept_count(tokens: int, ratio: float) -> int:
    """kvpress 0.5.5's ``compute_n_kept`` (utils.py 104-114): ``max(1, int(k_len * (1 - ratio)))``,
    float truncation included (90 tokens at 0.3 keep 62)."""
    return max(1, int(tokens * (1 - ratio)))


class Press(CacheTransform):
    """Scores each context token of each KV head; each head keeps its ``kept_count`` best."""

    kind: ClassVar[str] = "evict"
    name: ClassVar[str] = ""
    needs_queries: ClassVar[bool] = False  # SnapKV reads the observation window's queries

    def __init__(self, ratio: float) -> None:
        """``ratio``: kvpress's compression_ratio, the fraction of tokens dropped."""
        if not 0 <= ratio < 1:
            raise ValueError(f"press {self.name}: compression ratio {ratio} must be in [0, 1)")
        self.ratio = float(ratio)

    @property
    def keep(self) -> float:
        return 1 - self.ratio

    def score(self, layer: int, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor | None) -> torch.Tensor:
        """[B, H_kv, T] scores (higher is kept)."""
        raise NotImplementedError

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.ratio:.4g}"

    @property
    def key(self) -> str:
        return f"press:{self.spec} (kvpress 0.5.5 definitions)"

    def __call__(self, cache: Any, queries: list[torch.Tensor] | None = None) -> tuple[Any, EvictionMetrics]:
        """The evicted cache and what it keeps; ``queries`` (per layer, [B, H_q, W, D] after RoPE)
        for presses that need them. Sliding-window layers are refused: their masks count tokens."""
        layout = layout_of(cache)
        if any(w != FULL for w in layout.windows):
            raise ValueError(f"press {self.name}: a sliding-window layout ({layout.describe()}) cannot be evicted "
                             "here (its layers' masks count the tokens they hold)")
        if self.needs_queries and queries is None:
            raise ValueError(f"press {self.name} needs the observation window's queries (prefill with observe)")
        layers, out = cache_layers(cache), []
        tokens = layers[0][0].shape[2]
        nbytes = 0
        for (k, v), idx in zip(layers, self.kept(cache, queries)):
            g = idx.unsqueeze(-1)
            k2 = k.gather(2, g.expand(-1, -1, -1, k.shape[-1])).contiguous()
            v2 = v.gather(2, g.expand(-1, -1, -1, v.shape[-1])).contiguous()  # V's head_dim may differ
            nbytes += 2 * (k2.numel() + v2.numel()) // k2.shape[0]
            out.append((k2, v2))
        return EvictedCache(make_cache(out), tokens), EvictionMetrics(tokens, kept_count(tokens, self.ratio), nbytes)

    def kept(self, cache: Any, queries: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Per layer, the kept token positions [B, H_kv, n], ascending (kvpress gathers in top-k
        order; attention does not depend on it, and sorted positions make the cache reproducible)."""
        layers = cache_layers(cache)
        n = kept_count(layers[0][0].shape[2], self.ratio)
        return [self.score(i, k, v, queries[i] if queries is not None else None).topk(n, dim=-1).indices.sort(dim=-1).values
                for i, (k, v) in enumerate(layers)]


class EvictedCache:
    """An evicted cache and how many tokens the context had (``seen``): the next token's position."""

    def __init__(self, cache: Any, seen: int) -> None:
        self.cache, self.seen = cache, seen


@register_press
class StreamingLLM(Press):
    """Attention sinks and the recent window: the first ``n_sink`` tokens and the last ones
    (kvpress ``StreamingLLMPress``, n_sink = 4)."""

    name = "streaming_llm"
    n_sink: ClassVar[int] = 4

    def score(self, layer, keys, values, queries):
        t = keys.shape[2]
        if t <= self.n_sink:
            raise ValueError(f"press {self.name}: {t} tokens, not more than its {self.n_sink} sinks")
        pruned = t - int(t * (1 - self.ratio))  # a plain int(), not compute_n_kept (streaming_llm_press.py)
        s = torch.ones_like(keys[..., 0])
        s[:, :, self.n_sink:self.n_sink + pruned] = 0
        return s


@register_press
class Knorm(Press):
    """The keys of smallest L2 norm (kvpress ``KnormPress``: score = -‖k‖)."""

    name = "knorm"

    def score(self, layer, keys, values, queries):
        return -keys.norm(dim=-1)


@register_press
class SnapKV(Press):
    """Attention of the context's last ``window`` queries, averaged over them, pooled over
    ``kernel`` neighbouring tokens, averaged over the query heads of a KV head; the window itself
    is always kept (kvpress ``SnapKVPress``: window_size 64, kernel_size 5)."""

    name = "snapkv"
    needs_queries = True
    window: ClassVar[int] = 64
    kernel: ClassVar[int] = 5

    def score(self, layer, keys, values, queries):
        b, h_kv, t, d = keys.shape
        w = self.window
        if t <= w:
            raise ValueError(f"press {self.name}: {t} tokens, not more than its window of {w}")
        q = queries[:, :, -w:]
        groups = q.shape[1] // h_kv
        k = keys.repeat_interleave(groups, dim=1)
        a = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)
        a = a + torch.full_like(a, float("-inf")).triu(diagonal=t - w + 1)
        a = F.softmax(a, dim=-1, dtype=torch.float32).to(q.dtype)[..., :-w]
        s = F.avg_pool1d(a.mean(dim=-2), kernel_size=self.kernel, padding=self.kernel // 2, stride=1)
        s = s.view(b, h_kv, groups, t - w).mean(2)
        return F.pad(s, (0, w), value=s.max().item() + 1)  # snapkv_press.py 103: the window is kept


def make_press(name: str, ratio: float) -> Press:
    """The press ``name`` dropping ``ratio`` of the tokens (ValueError naming the known ones)."""
    if name not in PRESSES:
        raise ValueError(f"{name!r} is not an eviction press (known: {', '.join(PRESSES)})")
    return PRESSES[name](ratio)


def ratio_at_bits(bits: float, cache_bits: int = 16) -> float:
    """kvpress's compression ratio whose kept 16-bit tokens take the bytes of a ``bits``-per-element
    cache (int4 at 4.25 bits keeps 26.6 %: ratio 0.734)."""
    return max(0.0, 1 - bits / cache_bits)

"""The kvq arithmetic as a torch cache transform, for the benchmark only:
it lets ``make bench`` run the same perplexity pair in-process, with no files
and no CLI, to measure what the bridge costs. Production uses the Go codec;
tests/test_vectors.py pins this copy to the shared test vectors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvlib.cache.layout import cache_layers, make_cache


def quantize_dequantize(x: torch.Tensor, bits: int = 4, group_size: int = 64) -> torch.Tensor:
    """Per-group symmetric quantization and reconstruction, bit-exact with kv-compress."""
    flat = x.float().reshape(-1)
    n = flat.numel()
    pad = (-n) % group_size
    groups = F.pad(flat, (0, pad)).view(-1, group_size)
    qmax = 2 ** (bits - 1) - 1
    scale = groups.abs().amax(dim=1) / qmax  # float32 division
    s = scale.half()  # FP16, round to nearest even
    if torch.isinf(s).any():
        raise ValueError("group scale overflows FP16")
    s = s.float()[:, None]
    q = torch.clamp(torch.round(groups / s), -qmax - 1, qmax)  # torch.round: half to even
    q = torch.where(s > 0, q, torch.zeros_like(q)) + 0.0  # + 0.0 turns -0 into +0, as integer codes are
    return (q * s).view(-1)[:n].view_as(x).to(x.dtype)


class TorchCacheRoundtrip:
    """Cache transform quantizing every layer in memory: (cache) -> (cache, None)."""

    def __init__(self, bits: int = 4, group_size: int = 64) -> None:
        self.bits, self.group_size = bits, group_size

    def __call__(self, cache):
        q = lambda t: quantize_dequantize(t, self.bits, self.group_size)  # noqa: E731
        return make_cache([(q(k), q(v)) for k, v in cache_layers(cache)]), None

"""The single-scheme window loop as it was before the sweep (full logits on
every position, one transform): kept only as make bench's baseline for the
sweep's speed-up, measured in the same run."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from kvlib.cache.layout import cache_layers, make_cache
from kvlib.scoring.perplexity import plan_windows


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return float(F.cross_entropy(logits.float(), targets, reduction="none").double().sum())


@torch.no_grad()
def legacy_pair(model, input_ids, max_length, stride, transform, max_windows) -> tuple[float, float, float]:
    """(seconds, summed baseline NLL, summed compressed NLL) of the previous loop."""
    start = time.perf_counter()
    base = comp = 0.0
    for w in plan_windows(input_ids.shape[1], max_length, stride, max_windows):
        ids = input_ids[:, w.begin : w.end]
        first = w.length - w.num_targets
        use_context = w.context_tokens > 0
        out = model(input_ids=ids, use_cache=use_context)
        b = _nll(out.logits[0, first - 1 : -1], ids[0, first:])
        c = b
        if use_context:
            n = w.context_tokens
            cache = make_cache([(k[:, :, :n], v[:, :, :n]) for k, v in cache_layers(out.past_key_values)])
            del out
            cache, _ = transform(cache)
            suffix = ids[:, n:]
            out2 = model(input_ids=suffix, past_key_values=cache, use_cache=True)
            c = _nll(out2.logits[0, :-1], suffix[0, 1:])
        base, comp = base + b, comp + c
    return time.perf_counter() - start, base, comp

"""Greedy decoding from a context cache, exact or compressed: the step the
retrieval and agreement checks share.

A batch stacks equally long sequences (one per haystack or prompt), so there
is no padding and no attention mask; the exact cache and every scheme decode
the same batch, so their tokens differ only because their caches do.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Sequence

import torch

from kvlib.cache.layout import cache_layers
from kvlib.cache.layout import layout_of, make_cache, new_cache


def model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def prefill(model: Any, ids: Sequence[int]) -> Any:
    """The KV cache of one token sequence (the LM head runs on its last position only)."""
    x = torch.tensor([list(ids)], device=model_device(model))
    return model(input_ids=x, past_key_values=new_cache(model), use_cache=True, logits_to_keep=1).past_key_values


def stack_caches(caches: Iterable[Any], rows: int | None = None) -> Any:
    """One DynamicCache holding the given caches as rows (new tensors: the inputs are untouched).

    The batch is allocated once and filled cache by cache, so an iterable that
    makes each cache on demand (a codec's reconstruction) holds one at a time;
    ``rows`` is then the number of rows it yields (default ``len(caches)``)."""
    it = iter(caches)
    first = next(it, None)
    if first is None:
        raise ValueError("no caches to stack")
    n = rows if rows is not None else len(caches)  # type: ignore[arg-type]
    batch = [(k.new_empty((n, *k.shape[1:])), v.new_empty((n, *v.shape[1:]))) for k, v in cache_layers(first)]
    layout, filled = layout_of(first), 0
    rest = itertools.chain([first], it)
    del first
    for cache in rest:
        layers = cache_layers(cache)
        b = layers[0][0].shape[0]
        shapes = [k.shape[1:] for k, _ in layers]
        if shapes != [k.shape[1:] for k, _ in batch]:
            i = next((i for i, (s, (k, _)) in enumerate(zip(shapes, batch)) if s != k.shape[1:]), len(shapes))
            raise ValueError(f"caches of different lengths or shapes cannot share a batch (layer {i}: "
                             f"{tuple(shapes[i]) if i < len(shapes) else None} and "
                             f"{tuple(batch[i][0].shape[1:]) if i < len(batch) else None})")
        if filled + b > n:
            raise ValueError(f"more than {n} rows to stack")
        for (bk, bv), (k, v) in zip(batch, layers):
            bk[filled:filled + b] = k
            bv[filled:filled + b] = v
        filled += b
        del cache, layers
    if filled != n:
        raise ValueError(f"{filled} rows to stack, expected {n}")
    return make_cache(batch, layout)


@torch.no_grad()
def greedy_continue(model: Any, cache: Any, input_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Feed ``input_ids`` [B, T] after ``cache`` (which grows), then take the argmax
    ``new_tokens`` times; returns the new tokens [B, new_tokens]. No early stop,
    so every row has the same length and rows compare position by position."""
    if new_tokens < 1:
        raise ValueError(f"new_tokens {new_tokens} must be at least 1")
    x = input_ids.to(model_device(model))
    out = []
    for _ in range(new_tokens):
        logits = model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        x = logits[:, -1].argmax(-1, keepdim=True)
        out.append(x)
    return torch.cat(out, dim=1).cpu()

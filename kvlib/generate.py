"""Greedy decoding from a context cache, exact or compressed: the step the
retrieval and agreement checks share.

A batch stacks equally long sequences (one per haystack or prompt), so there
is no padding and no attention mask; the exact cache and every scheme decode
the same batch, so their tokens differ only because their caches do.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from kvlib.cache import cache_layers, make_cache


def model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def prefill(model: Any, ids: Sequence[int]) -> Any:
    """The KV cache of one token sequence (the LM head runs on its last position only)."""
    x = torch.tensor([list(ids)], device=model_device(model))
    return model(input_ids=x, use_cache=True, logits_to_keep=1).past_key_values


def stack_caches(caches: Sequence[Any]) -> Any:
    """One DynamicCache holding the given batch-1 caches as rows (new tensors: the inputs are untouched)."""
    layers = [cache_layers(c) for c in caches]
    lengths = {int(ls[0][0].shape[2]) for ls in layers}
    if len(lengths) != 1:
        raise ValueError(f"caches of different lengths {sorted(lengths)} cannot share a batch")
    return make_cache([(torch.cat([ls[i][0] for ls in layers]), torch.cat([ls[i][1] for ls in layers]))
                       for i in range(len(layers[0]))])


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

"""Greedy decoding from a context cache, exact or compressed: the step the
retrieval and agreement checks share.

A batch stacks equally long sequences (one per haystack or prompt), so there
is no padding and no attention mask; the exact cache and every scheme decode
the same batch, so their tokens differ only because their caches do.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from typing import Any, Iterable, Iterator, Sequence

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

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


def register_attention(implementation: str, function: Any) -> None:
    """Register an SDPA-based attention ``function`` under ``implementation``, with SDPA's masks:
    transformers builds no mask for an attention name its mask table lacks (masking_utils,
    _preprocess_mask_arguments: "custom attention without equivalent mask creation"), so SDPA would
    fall back to a plain causal mask and sliding-window layers would see the whole window."""
    AttentionInterface.register(implementation, function)
    ALL_MASK_ATTENTION_FUNCTIONS.register(implementation, sdpa_mask)


@contextlib.contextmanager
def attention_through(model: Any, implementation: str, var: contextvars.ContextVar, value: Any) -> Iterator[None]:
    """Within: the model's attention is the registered ``implementation``, with ``var`` set to
    ``value`` for it to read (write mode's query conversion, the observation window's queries)."""
    config = model.config
    before, token = config._attn_implementation, var.set(value)
    config._attn_implementation = implementation
    try:
        yield
    finally:
        config._attn_implementation = before
        var.reset(token)


# Queries of the last tokens of a prefill, per layer (set around one observed forward).
_OBSERVED: contextvars.ContextVar[Any] = contextvars.ContextVar("kvlib_observed_queries", default=None)
OBSERVE = "kvlib_observe"


def _observe(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
             **kw: Any) -> Any:
    """SDPA, keeping the last ``window`` queries (after RoPE, as attention reads them)."""
    seen = _OBSERVED.get()
    if seen is not None:
        window, out = seen
        out[module.layer_idx] = query[:, :, -window:].detach().clone()
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)


register_attention(OBSERVE, _observe)


@torch.no_grad()
def prefill_observed(model: Any, ids: Sequence[int], window: int) -> tuple[Any, list[torch.Tensor]]:
    """The KV cache of one sequence and each layer's last ``window`` queries ([1, H_q, window, D],
    after RoPE): what SnapKV-style presses score the context with (kvpress's observation window)."""
    queries: dict[int, torch.Tensor] = {}
    with attention_through(model, OBSERVE, _OBSERVED, (window, queries)):
        cache = prefill(model, ids)
    return cache, [queries[i] for i in sorted(queries)]


@torch.no_grad()
def greedy_answers(model: Any, cache: Any, question: Sequence[int], new_tokens: int, position: int,
                   stop: Sequence[int] = (), finished: Any = None) -> list[list[int]]:
    """Greedy tokens of every row of ``cache`` after ``question`` fed at positions ``position``,
    ``position + 1``, ... (the context's length, also when an eviction left fewer tokens in
    ``cache``): at most ``new_tokens`` a row, a row ending at its first token of ``stop`` (kvpress's
    ``generate_answer``) or as soon as ``finished(tokens)`` says more tokens cannot change what is
    read from them. The rows decode as one batch until every row has ended."""
    dev = model_device(model)
    rows = cache_layers(cache)[0][0].shape[0]
    x = torch.tensor([list(question)] * rows, device=dev)
    pos = torch.arange(position, position + x.shape[1], device=dev)[None].expand(rows, -1)
    out: list[list[int]] = [[] for _ in range(rows)]
    live = [True] * rows
    for _ in range(new_tokens):
        logits = model(input_ids=x, past_key_values=cache, position_ids=pos, use_cache=True, logits_to_keep=1).logits
        nxt = logits[:, -1].argmax(-1)
        for r, t in enumerate(nxt.tolist()):
            if live[r]:
                out[r].append(t)
                live[r] = t not in stop and not (finished is not None and finished(out[r]))
        if not any(live):
            break
        x, pos = nxt[:, None], pos[:, -1:] + 1
    return out

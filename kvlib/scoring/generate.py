"""Greedy decoding from a context cache, exact or compressed: the step the
retrieval, agreement and RULER checks share.

A batch stacks equally long sequences (one per haystack or prompt), so there
is no padding and no attention mask; the exact cache and every scheme decode
the same batch, so their tokens differ only because their caches do. Caches of
different lengths (an eviction's beside the exact one) decode as one left-padded
batch whose rows attend over their own tokens only (``stack_padded``).
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
from kvlib.cache.layout import FULL, layout_of, make_cache, new_cache, room_for


def model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def prefill(model: Any, ids: Sequence[int]) -> Any:
    """The KV cache of one token sequence (the LM head runs on its last position only)."""
    x = torch.tensor([list(ids)], device=model_device(model))
    return model(input_ids=x, past_key_values=new_cache(model), use_cache=True, logits_to_keep=1).past_key_values


def stack_caches(caches: Iterable[Any], rows: int | None = None, reserve: int = 0) -> Any:
    """One DynamicCache holding the given caches as rows (new tensors: the inputs are untouched);
    ``reserve`` > 0: its full-attention layers append that many tokens in place (decoding).

    The batch is allocated once and filled cache by cache, so an iterable that
    makes each cache on demand (a codec's reconstruction) holds one at a time;
    ``rows`` is then the number of rows it yields (default ``len(caches)``)."""
    it = iter(caches)
    first = next(it, None)
    if first is None:
        raise ValueError("no caches to stack")
    n = rows if rows is not None else len(caches)  # type: ignore[arg-type]
    layout = layout_of(first)
    spare = [reserve if w == FULL else 0 for w in layout.windows]  # room to append in place
    batch = [(room_for(k, n, k.shape[2], r), room_for(v, n, v.shape[2], r))
             for (k, v), r in zip(cache_layers(first), spare)]
    filled = 0
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
    return make_cache(batch, layout, reserve, adopt=True)


def stack_padded(caches: Sequence[Any], reserve: int = 0) -> tuple[Any, torch.Tensor]:
    """One batch of full-attention caches of different lengths (an eviction's beside the exact
    one's), so they decode together: zeros first, each row's tokens last, and the [rows, T] mask
    of the tokens that are there, for ``greedy_answers`` to attend through."""
    if not caches:
        raise ValueError("no caches to stack")
    for c in caches:
        if layout_of(c).sliding:
            raise ValueError("caches with sliding-window layers cannot be padded into one batch")
    lengths = [cache_layers(c)[0][0].shape[2] for c in caches]
    rows, t = sum(cache_layers(c)[0][0].shape[0] for c in caches), max(lengths)
    first = cache_layers(caches[0])
    batch = [(room_for(k, rows, t, reserve), room_for(v, rows, t, reserve)) for k, v in first]
    mask = torch.zeros((rows, t), dtype=torch.long, device=first[0][0].device)
    r = 0
    for c, n in zip(caches, lengths):
        layers = cache_layers(c)
        b = layers[0][0].shape[0]
        if [k.shape[1] for k, _ in layers] != [k.shape[1] for k, _ in batch]:
            raise ValueError("caches of different layer or head counts cannot share a batch")
        for (bk, bv), (k, v) in zip(batch, layers):
            bk[r:r + b, :, :t - n], bv[r:r + b, :, :t - n] = 0, 0  # never attended to; zeros, not garbage
            bk[r:r + b, :, t - n:], bv[r:r + b, :, t - n:] = k, v
        mask[r:r + b, t - n:] = 1
        r += b
    return make_cache(batch, None, reserve, adopt=True), mask


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


# Rows of a left-padded batch that share their padding: (first row, end row, padded tokens).
_RAGGED: contextvars.ContextVar[Any] = contextvars.ContextVar("kvlib_ragged_rows", default=None)
RAGGED = "kvlib_ragged"


def _ragged(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
            **kw: Any) -> Any:
    """SDPA per group of rows, each on its own tokens (the padding sliced off), so a row attends
    over what it holds and a decoding step needs no mask (SDPA on CPU is several times slower with
    one); a multi-token step slices the causal mask the same way."""
    groups = _RAGGED.get()
    if groups is None or len(groups) == 1 and groups[0][2] == 0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)
    outs = []
    for a, b, pad in groups:
        m = None if attention_mask is None or query.shape[2] == 1 else attention_mask[a:b, ..., pad:]
        o, _ = sdpa_attention_forward(module, query[a:b], key[a:b, :, pad:], value[a:b, :, pad:], m, **kw)
        outs.append(o)
    return torch.cat(outs, dim=0), None


register_attention(RAGGED, _ragged)


def _row_groups(mask: torch.Tensor) -> list[tuple[int, int, int]]:
    """Runs of consecutive rows with the same left padding in ``mask`` [rows, T]."""
    pads = (mask.shape[1] - mask.sum(dim=1)).tolist()
    if any(mask[r, :p].any() or not mask[r, p:].all() for r, p in enumerate(pads)):
        raise ValueError("a padded batch's mask must be zeros then ones in every row (stack_padded)")
    groups: list[tuple[int, int, int]] = []
    for r, p in enumerate(pads):
        if groups and groups[-1][2] == p:
            groups[-1] = (groups[-1][0], r + 1, p)
        else:
            groups.append((r, r + 1, p))
    return groups


def padded_batches(model: Any) -> bool:
    """Whether ``model`` can decode a padded batch (``stack_padded``): its attention is SDPA, which
    the per-row attention wraps (an eager-only feature, a softcap or sinks, would be lost)."""
    return getattr(model.config, "_attn_implementation", None) == "sdpa"


@torch.no_grad()
def greedy_answers(model: Any, cache: Any, question: Sequence[int], new_tokens: int, position: int,
                   stop: Sequence[int] = (), finished: Any = None, mask: torch.Tensor | None = None) -> list[list[int]]:
    """Greedy tokens of every row of ``cache`` after ``question`` fed at positions ``position``,
    ``position + 1``, ... (the context's length, also when an eviction left fewer tokens in
    ``cache``): at most ``new_tokens`` a row, a row ending at its first token of ``stop`` (kvpress's
    ``generate_answer``) or as soon as ``finished(tokens)`` says more tokens cannot change what is
    read from them. The rows decode as one batch until every row has ended; ``mask`` [rows, T]
    marks the cache's tokens that are there (``stack_padded``'s left padding; default all)."""
    if mask is None:
        return _greedy(model, cache, question, new_tokens, position, stop, finished, None)
    if not padded_batches(model):
        raise ValueError(f"a padded batch decodes through SDPA; this model attends with "
                         f"{model.config._attn_implementation!r}")
    with attention_through(model, RAGGED, _RAGGED, _row_groups(mask)):
        return _greedy(model, cache, question, new_tokens, position, stop, finished, mask)


@torch.no_grad()
def _greedy(model: Any, cache: Any, question: Sequence[int], new_tokens: int, position: int,
            stop: Sequence[int], finished: Any, mask: torch.Tensor | None) -> list[list[int]]:
    """The decoding loop: a row that has ended leaves the batch (its cache rows dropped), so the
    rows still decoding do not pay for its attention."""
    dev = model_device(model)
    rows = cache_layers(cache)[0][0].shape[0]
    x = torch.tensor([list(question)] * rows, device=dev)
    pos = torch.arange(position, position + x.shape[1], device=dev)[None].expand(rows, -1)
    out: list[list[int]] = [[] for _ in range(rows)]
    here = list(range(rows))  # the original row of each batch row
    seen = None if mask is None else mask.to(dev)
    for _ in range(new_tokens):
        if seen is not None:
            seen = torch.cat([seen, seen.new_ones((len(here), x.shape[1]))], dim=1)
        logits = model(input_ids=x, past_key_values=cache, position_ids=pos, attention_mask=seen, use_cache=True,
                       logits_to_keep=1).logits
        nxt = logits[:, -1].argmax(-1)
        keep = []
        for j, (r, t) in enumerate(zip(here, nxt.tolist())):
            out[r].append(t)
            if t not in stop and not (finished is not None and finished(out[r])):
                keep.append(j)
        if not keep:
            break
        x, pos = nxt[:, None], pos[:, -1:] + 1
        if len(keep) < len(here):
            sel = torch.tensor(keep, device=dev)
            cache.batch_select_indices(sel)
            x, pos, here = x[sel], pos[sel], [here[j] for j in keep]
            if seen is not None:
                seen = seen[sel]
                _RAGGED.get()[:] = _row_groups(seen)
    return out

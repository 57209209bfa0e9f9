"""Write mode: K and V quantized as the engine writes them. Inside the forward, each layer's keys
and values pass through the transform before attention reads them, every token of the window,
every layer — so a token attends to the quantized keys and values of every earlier token of its
own window (and its own), as in llama.cpp and vLLM, not only to a compressed prefix.

One codec round trip per layer and window (the codec server's, or the file CLI's): the same Go
codec as prefix mode, no second implementation. Queries stay exact here; a format whose engine
converts them (llama.cpp's Q to the K type's dot-product format) says so itself.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from kvlib.cache.layout import new_cache
from kvlib.scoring.generate import attention_through, register_attention
from kvlib.codec.metrics import join_metrics


# The transform whose query path the attention below applies (set around one written forward).
_QUERIES: contextvars.ContextVar[Any] = contextvars.ContextVar("kvlib_write_queries", default=None)
ATTENTION = "kvlib_write"


def _attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
               **kw: Any) -> Any:
    """SDPA on the query as the engine converts it (``transform.query_layer``)."""
    t = _QUERIES.get()
    if t is not None:
        query = t.query_layer(module.layer_idx, query)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)


register_attention(ATTENTION, _attention)


@contextlib.contextmanager
def queries_through(model: Any, transform: Any) -> Iterator[None]:
    """Within: the model's attention converts Q as ``transform`` says (only when it converts any)."""
    if not getattr(transform, "converts_queries", False):
        yield
        return
    with attention_through(model, ATTENTION, _QUERIES, transform):
        yield


class NonFiniteWrite(ArithmeticError):
    """A layer's K or V reached the cache as NaN or Inf: an engine format made them upstream (an e4m3
    cast past its range gives NaN, which attention spreads to every later layer), so the window's
    output is NaN, as the engine's would be."""


def write_cache(model: Any, transform: Any, sink: list) -> Any:
    """An empty cache of the model's layout whose writes go through ``transform.roundtrip_layer``:
    attention gets (and the cache keeps) the reconstructions. Each layer's metrics go to ``sink``.
    NonFiniteWrite when a layer's K or V is already NaN or Inf."""
    cache = new_cache(model)
    set_layers = getattr(transform, "set_num_layers", None)
    if set_layers is not None:  # an engine write path that keeps the model's boundary layers exact
        set_layers(len(cache.layers))
    update = cache.update

    def write(key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kw: Any) -> Any:
        if not (torch.isfinite(key_states).all() and torch.isfinite(value_states).all()):
            raise NonFiniteWrite(f"layer {layer_idx}: K or V is NaN or Inf before its write")
        k, v, m = transform.roundtrip_layer(layer_idx, key_states, value_states)
        sink.append(m)
        return update(k, v, layer_idx, *args, **kw)

    cache.update = write
    return cache


def score_write(model: Any, ids: torch.Tensor, num_targets: int, targets: torch.Tensor, logp_base: torch.Tensor,
                transform: Any) -> tuple[float, list[float], int, Any, float]:
    """One window's forward with every K and V written through ``transform``, scored against the
    exact forward's log-probabilities: (summed NLL, KL per target, top-1 agreements, the window's
    metrics joined over its layers, seconds in the transform)."""
    sink: list = []
    seconds0 = sum(getattr(transform, "seconds", {}).values())
    t0 = time.perf_counter()
    try:
        with queries_through(model, transform):
            out = model(input_ids=ids, past_key_values=write_cache(model, transform, sink), use_cache=True,
                        logits_to_keep=num_targets + 1)
    except NonFiniteWrite:  # the engine's output is NaN: no number survives, the window fails
        return math.nan, [math.nan] * num_targets, 0, None, time.perf_counter() - t0
    wall = time.perf_counter() - t0
    spent = sum(getattr(transform, "seconds", {}).values()) - seconds0 if hasattr(transform, "seconds") else wall
    logp = F.log_softmax(out.logits[0, :-1].float(), dim=-1)
    del out
    nll = float(-logp.gather(1, targets[:, None])[:, 0].double().sum())
    top1 = int((logp.argmax(-1) == logp_base.argmax(-1)).sum())
    kld = logp.neg_().add_(logp_base).mul_(logp_base.exp()).sum(-1).clamp_min(0)  # KL(exact || written)
    parts = [m for m in sink if m is not None]
    return nll, kld.double().tolist(), top1, join_metrics(parts) if parts else None, spent

"""Step 3: sliding-window perplexity, exact and through a compressed KV cache.

Windows follow the Hugging Face recipe: length L = min(2048, model context),
stride S; window w covers tokens [w*S, min(w*S + L, N)) and scores the
tokens no earlier window scored (all of window 0 but its first token, the
last <= S tokens of later windows). Every target token is counted once.

Baseline: each window's full forward pass, exactly that recipe.
Compressed: in a window with targets t0..t1, the tokens before t0 - 1 are
the *context*. Their KV cache (cropped from the same forward pass: causal
attention makes it identical to running the context alone) goes through
``transform`` -- for kvlib, safetensors -> kv-compress -> safetensors -> a
new DynamicCache -- and the last context token plus the targets are run
against it, so every target is predicted by a step attending to the
compressed context. Window 0 has no context and counts the same in both.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from kvlib.bridge import CompressionMetrics, pool_metrics
from kvlib.cache import cache_layers, make_cache

# A cache transform returns the cache to attend to and, optionally, the codec's metrics.
CacheTransform = Callable[[Any], "tuple[Any, CompressionMetrics | None]"]


@dataclass
class Window:
    """One sliding window: tokens [begin, end), of which the last ``num_targets`` are scored."""

    index: int
    begin: int
    end: int
    num_targets: int

    @property
    def length(self) -> int:
        return self.end - self.begin

    @property
    def context_tokens(self) -> int:
        """Tokens before the last context token: the part whose cache gets compressed (0: none)."""
        return max(0, self.length - self.num_targets - 1)


def plan_windows(num_tokens: int, max_length: int, stride: int, max_windows: int | None = None) -> list[Window]:
    """The Hugging Face sliding-window plan over ``num_tokens`` tokens."""
    if not 0 < stride <= max_length:
        raise ValueError(f"stride {stride} must be in (0, max_length={max_length}]")
    if num_tokens < 2:
        raise ValueError(f"need at least 2 tokens, got {num_tokens}")
    windows: list[Window] = []
    prev_end = 0
    for begin in range(0, num_tokens, stride):
        end = min(begin + max_length, num_tokens)
        # New tokens since the last window; a window's first token has no
        # prediction, so at most length - 1 of them are scored.
        trg = min(end - prev_end, end - begin - 1)
        windows.append(Window(len(windows), begin, end, trg))
        prev_end = end
        if end == num_tokens or (max_windows is not None and len(windows) >= max_windows):
            break
    return windows


@dataclass
class WindowResult:
    """Summed negative log-likelihoods of one window's targets."""

    index: int
    begin: int
    end: int
    num_targets: int
    context_tokens: int
    baseline_nll: float
    compressed_nll: float
    compressed: bool  # whether this window's context went through the transform
    transform_seconds: float = 0.0

    @property
    def baseline_ppl(self) -> float:
        return math.exp(self.baseline_nll / self.num_targets)

    @property
    def compressed_ppl(self) -> float:
        return math.exp(self.compressed_nll / self.num_targets)


@dataclass
class PerplexityResult:
    """Baseline and compressed-cache perplexity over the same targets."""

    baseline_perplexity: float
    compressed_perplexity: float
    delta: float
    delta_percent: float
    context_baseline_perplexity: float  # over windows that had a compressed context
    context_compressed_perplexity: float
    context_delta: float
    scored_tokens: int
    context_scored_tokens: int
    context_length: int
    stride: int
    windows: list[WindowResult]
    seconds: float
    transform_seconds: float
    compression: CompressionMetrics | None = None  # pooled over every window's context cache
    window_metrics: list[CompressionMetrics] = field(default_factory=list)

    @property
    def num_windows(self) -> int:
        return len(self.windows)


def _ppl(nll: float, n: int) -> float:
    return math.exp(nll / n) if n else math.nan


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Summed cross-entropy of targets under logits (float32 softmax, float64 sum)."""
    return float(F.cross_entropy(logits.float(), targets, reduction="none").double().sum())


@torch.no_grad()
def evaluate_windows(
    model: Any,
    input_ids: torch.Tensor,
    max_length: int,
    stride: int = 512,
    transform: CacheTransform | None = None,
    max_windows: int | None = None,
    progress: bool = True,
) -> PerplexityResult:
    """Score ``input_ids`` [1, N] window by window; with ``transform``, also through the transformed cache."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be [1, N], got {tuple(input_ids.shape)}")
    device = next(model.parameters()).device
    windows = plan_windows(input_ids.shape[1], max_length, stride, max_windows)
    iterator: Any = windows
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(windows, desc="perplexity windows", unit="window")
    start = time.perf_counter()
    results: list[WindowResult] = []
    metrics: list[CompressionMetrics] = []
    for w in iterator:
        ids = input_ids[:, w.begin : w.end].to(device)
        first = w.length - w.num_targets  # window-relative index of the first target
        use_context = transform is not None and w.context_tokens > 0
        out = model(input_ids=ids, use_cache=use_context)
        baseline = _nll(out.logits[0, first - 1 : -1], ids[0, first:])
        compressed, seconds = baseline, 0.0
        if use_context:
            n = w.context_tokens
            cache = make_cache([(k[:, :, :n], v[:, :, :n]) for k, v in cache_layers(out.past_key_values)])
            del out
            t0 = time.perf_counter()
            cache, m = transform(cache)
            seconds = time.perf_counter() - t0
            if m is not None:
                metrics.append(m)
            suffix = ids[:, w.context_tokens :]  # the last context token, then the targets
            out2 = model(input_ids=suffix, past_key_values=cache, use_cache=True)
            compressed = _nll(out2.logits[0, :-1], suffix[0, 1:])
        results.append(
            WindowResult(w.index, w.begin, w.end, w.num_targets, w.context_tokens if use_context else 0,
                         baseline, compressed, use_context, seconds)
        )
    n = sum(r.num_targets for r in results)
    base = _ppl(sum(r.baseline_nll for r in results), n)
    comp = _ppl(sum(r.compressed_nll for r in results), n)
    ctx = [r for r in results if r.compressed]
    nc = sum(r.num_targets for r in ctx)
    cbase = _ppl(sum(r.baseline_nll for r in ctx), nc)
    ccomp = _ppl(sum(r.compressed_nll for r in ctx), nc)
    return PerplexityResult(
        baseline_perplexity=base,
        compressed_perplexity=comp,
        delta=comp - base,
        delta_percent=100 * (comp - base) / base,
        context_baseline_perplexity=cbase,
        context_compressed_perplexity=ccomp,
        context_delta=ccomp - cbase,
        scored_tokens=n,
        context_scored_tokens=nc,
        context_length=max_length,
        stride=stride,
        windows=results,
        seconds=time.perf_counter() - start,
        transform_seconds=sum(r.transform_seconds for r in results),
        compression=pool_metrics(metrics) if metrics else None,
        window_metrics=metrics,
    )


def compute_perplexity(
    model: Any,
    tokenizer: Any,
    dataset_name: str = "wikitext",
    dataset_config: str = "wikitext-2-raw-v1",
    split: str = "test",
    stride: int = 512,
    max_samples: int | None = None,
    verbose: bool = True,
    max_windows: int | None = None,
) -> float:
    """Baseline sliding-window perplexity of a dataset (the design documents' signature).

    ``dataset_config`` may also be "embedded" or a text file path; ``max_samples``
    and ``max_windows`` both limit the number of windows.
    """
    from kvlib.corpus import load_corpus, tokenize
    from kvlib.models import context_length

    corpus = load_corpus(dataset_config, dataset_name=dataset_name, split=split)
    ids = tokenize(tokenizer, corpus)
    limit = max_windows if max_windows is not None else max_samples
    res = evaluate_windows(model, ids, context_length(model), stride, None, limit, progress=verbose)
    if verbose:
        print(f"Perplexity of {corpus.name}: {res.baseline_perplexity:.4f} "
              f"({res.scored_tokens} tokens, {res.num_windows} windows)")
    return res.baseline_perplexity

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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from kvlib.models.corpus import load_corpus, tokenize
from kvlib.models.sources import context_length
from kvlib.codec.metrics import CompressionMetrics, pool_metrics
from kvlib.cache.layout import context_cache, new_cache
from kvlib.scoring.write import score_write

# A cache transform returns the cache to attend to and, optionally, the codec's metrics.
CacheTransform = Callable[[Any], "tuple[Any, CompressionMetrics | None]"]
# Told each finished window: its index and, per transform name, its result and codec metrics.
WindowCallback = Callable[[int, "dict[str, tuple[WindowResult, CompressionMetrics | None]]"], None]


# How a scheme meets the model: the context compressed once ("prefix", the gate's default) or
# every K and V as it is written ("write", the engines' arithmetic; kvlib.scoring.write).
MODES = ("prefix", "write")

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


def plan_chunks(num_tokens: int, n_ctx: int, max_chunks: int | None = None) -> list[Window]:
    """llama.cpp's perplexity plan (tools/perplexity/perplexity.cpp, perplexity(), llama.cpp
    0c1e57098): non-overlapping chunks of ``n_ctx`` tokens, as many as fit whole, each scoring its
    second half: the logits at positions n_ctx/2 .. n_ctx-2 predict tokens n_ctx/2+1 .. n_ctx-1,
    n_ctx - n_ctx/2 - 1 targets a chunk."""
    if n_ctx < 4:
        raise ValueError(f"n_ctx {n_ctx} must be at least 4")
    n = num_tokens // n_ctx if max_chunks is None else min(max_chunks, num_tokens // n_ctx)
    if n < 1:
        raise ValueError(f"need at least one chunk of {n_ctx} tokens, got {num_tokens} tokens")
    return [Window(i, i * n_ctx, (i + 1) * n_ctx, n_ctx - n_ctx // 2 - 1) for i in range(n)]


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
    """Summed negative log-likelihoods of one window's targets, and how far the
    compressed model's next-token distributions moved from the exact ones."""

    index: int
    begin: int
    end: int
    num_targets: int
    context_tokens: int
    baseline_nll: float
    compressed_nll: float
    compressed: bool  # whether this window's context went through the transform
    transform_seconds: float = 0.0
    kld: list[float] = field(default_factory=list)  # per target: KL(exact || compressed), nats
    top1_agree: int = 0  # targets whose argmax prediction is unchanged

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


def _token_nll(logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-target cross-entropy from float32 log-probabilities."""
    return -logp.gather(1, targets[:, None])[:, 0]


def summarize(results: list[WindowResult], metrics: list[CompressionMetrics], max_length: int, stride: int,
               seconds: float) -> PerplexityResult:
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
        seconds=seconds,
        transform_seconds=sum(r.transform_seconds for r in results),
        compression=pool_metrics(metrics) if metrics else None,
        window_metrics=metrics,
    )


@dataclass
class _Baseline:
    """One window's exact forward: what every transform's suffix forward is scored against."""

    window: Window
    ids: torch.Tensor
    targets: torch.Tensor
    baseline: float  # summed NLL of the targets
    logp: torch.Tensor
    context: Any = None  # the context's cache, in the model's layout (None: no context)


def _baseline(model: Any, w: Window, ids: torch.Tensor, with_context: bool) -> _Baseline:
    """The window's full forward (the LM head on the scored positions only) and, when asked, its
    context's cache, cut out of the same pass."""
    first = w.length - w.num_targets  # window-relative index of the first target
    targets = ids[0, first:]
    # The model's own cache layout, its sliding-window layers recording every token so the
    # context's cache can be cut out of this one forward pass.
    out = model(input_ids=ids, past_key_values=new_cache(model, record_past=True) if with_context else None,
                use_cache=with_context, logits_to_keep=w.num_targets + 1)
    logp = F.log_softmax(out.logits[0, :-1].float(), dim=-1)
    b = _Baseline(w, ids, targets, float(_token_nll(logp, targets).double().sum()), logp)
    if with_context:
        b.context = context_cache(out.past_key_values, w.context_tokens)
    return b


def _run_one(transform: CacheTransform, context: Any) -> tuple[Any, Any, float]:
    t0 = time.perf_counter()
    cache, m = transform(context)
    return cache, m, time.perf_counter() - t0


def _reconstruct(transforms: dict[str, CacheTransform], context: Any, lazy: bool = False) -> dict[str, Any]:
    """Every transform's (cache, metrics, seconds) of one context, in order. Transforms that can
    share one request (a ``batch_with`` key and a ``run_batch``, as the codec server's) make it
    now; with ``lazy`` the others are left as calls made when scored, so only one of their
    reconstructions is alive at a time."""
    groups: dict[Any, list[str]] = {}
    for k, t in transforms.items():
        key = getattr(t, "batch_with", None)
        groups.setdefault(("alone", k) if key is None else key, []).append(k)
    done: dict[str, Any] = {}
    for key, ks in groups.items():
        if key[0] == "alone":
            t = transforms[ks[0]]
            done[ks[0]] = (lambda t=t: _run_one(t, context)) if lazy else _run_one(t, context)
        else:
            ts = [transforms[k] for k in ks]
            done.update(zip(ks, type(ts[0]).run_batch(ts, context)))
    return {k: done[k] for k in transforms}


def _score_suffixes(model: Any, b: _Baseline, caches: dict[str, Any],
                    results: dict[str, list[WindowResult]], metrics: dict[str, list[CompressionMetrics]],
                    on_window: WindowCallback | None = None) -> None:
    """The suffix forward against each reconstruction, scored against the exact forward; each
    reconstruction is released once scored. ``on_window`` gets the window's results."""
    w, n = b.window, b.window.context_tokens
    p_base, top1_base = b.logp.exp(), b.logp.argmax(-1)
    done: dict[str, tuple[WindowResult, CompressionMetrics | None]] = {}
    suffix = b.ids[:, n:]  # the last context token, then the targets
    for k in list(caches):
        made = caches.pop(k)
        cache, m, seconds = made() if callable(made) else made
        if m is not None:
            metrics[k].append(m)
        out2 = model(input_ids=suffix, past_key_values=cache, use_cache=True)
        logp = F.log_softmax(out2.logits[0, :-1].float(), dim=-1)
        del out2, cache
        nll = float(_token_nll(logp, b.targets).double().sum())
        top1 = int((logp.argmax(-1) == top1_base).sum())
        # KL(exact || compressed) = sum p_base * (logp_base - logp), in place in logp's memory: the
        # same bits as the plain expression, without two more [targets, vocab] temporaries.
        kld = logp.neg_().add_(b.logp).mul_(p_base).sum(-1).clamp_min(0)  # >= 0 up to rounding
        results[k].append(WindowResult(w.index, w.begin, w.end, w.num_targets, n, b.baseline, nll, True, seconds,
                                       kld=kld.double().tolist(), top1_agree=top1))
        done[k] = (results[k][-1], m)
    if on_window is not None:
        on_window(w.index, done)


@torch.no_grad()
def score_windows(
    model: Any,
    input_ids: torch.Tensor,
    max_length: int,
    stride: int = 512,
    transforms: dict[str, CacheTransform] | None = None,
    max_windows: int | None = None,
    progress: bool = True,
    overlap: bool | None = None,
    select: set[int] | None = None,
    on_window: WindowCallback | None = None,
    mode: str = "prefix",
    windows: list[Window] | None = None,
) -> dict[str, PerplexityResult]:
    """Score ``input_ids`` [1, N] window by window, exactly and through every transform.

    Per window: one full forward, whose LM head runs only on the positions that
    predict a target (``logits_to_keep``), gives the baseline and the context
    cache; then each transform gets that same cache (save it once, compress it
    once per scheme) and one forward of the suffix against its result. Returns
    one PerplexityResult per transform name, all over the same targets; with no
    transforms, one under "" with the baseline alone.

    With ``overlap`` (default: on CUDA) the transforms of window w run in a second thread while
    the model scores window w-1's suffixes and runs window w+1's forward: the same operations on
    the same values, so the same results to the bit, in less time when the codec and the model do
    not share the same cores. Two windows' reconstructions are then alive at once.

    ``select``: the indices of the windows to score (default all; the results cover those only).
    ``on_window`` is told each window's results as soon as they are complete, in window order.

    ``windows``: another plan than the sliding one (``plan_chunks``: llama.cpp's protocol).

    ``mode``: "prefix" (the above: the context compressed once, the scored tokens attending to
    their own window exactly; the KVQuant-style gate) or "write" (``kvlib.scoring.write``: every
    K and V of the window written through the transform inside one forward, as engines do; every
    window counts as compressed, window 0 included).
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: choose one of {', '.join(MODES)}")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be [1, N], got {tuple(input_ids.shape)}")
    transforms = dict(transforms or {})
    names = list(transforms) or [""]
    device = next(model.parameters()).device
    overlap = device.type == "cuda" if overlap is None else overlap
    if windows is None:
        windows = plan_windows(input_ids.shape[1], max_length, stride, max_windows)
    if select is not None:
        windows = [w for w in windows if w.index in select]
    iterator: Any = windows
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(windows, desc="perplexity windows", unit="window")
    start = time.perf_counter()
    results: dict[str, list[WindowResult]] = {k: [] for k in names}
    metrics: dict[str, list[CompressionMetrics]] = {k: [] for k in names}
    if mode == "write":
        return _score_windows_write(model, input_ids, windows, iterator, transforms, device, max_length, stride,
                                    on_window)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvlib-codec") if overlap and transforms else None
    pending: tuple[_Baseline, Future] | None = None
    try:
        for w in iterator:
            use_context = bool(transforms) and w.context_tokens > 0
            b = _baseline(model, w, input_ids[:, w.begin: w.end].to(device), use_context)
            context, b.context = b.context, None
            made = pool.submit(_reconstruct, transforms, context) if pool is not None and use_context else None
            if pending is not None:  # window w-1's suffixes while window w's codec runs
                _score_suffixes(model, pending[0], pending[1].result(), results, metrics, on_window)
                pending = None
            if not use_context:
                for k in names:
                    results[k].append(WindowResult(w.index, w.begin, w.end, w.num_targets, 0, b.baseline, b.baseline,
                                                   False, kld=[0.0] * w.num_targets, top1_agree=w.num_targets))
                if on_window is not None:
                    on_window(w.index, {k: (results[k][-1], None) for k in names})
            elif made is None:
                _score_suffixes(model, b, _reconstruct(transforms, context, lazy=True), results, metrics, on_window)
            else:
                pending = (b, made)
            del context
        if pending is not None:
            _score_suffixes(model, pending[0], pending[1].result(), results, metrics, on_window)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    seconds = time.perf_counter() - start
    return {k: summarize(results[k], metrics[k], max_length, stride, seconds) for k in names}


def _score_windows_write(model: Any, input_ids: torch.Tensor, windows: list[Window], iterator: Any,
                         transforms: dict[str, CacheTransform], device: Any, max_length: int, stride: int,
                         on_window: WindowCallback | None) -> dict[str, PerplexityResult]:
    """score_windows in write mode: per window, the exact forward, then one written forward per
    transform, scored against it."""
    names = list(transforms) or [""]
    start = time.perf_counter()
    results: dict[str, list[WindowResult]] = {k: [] for k in names}
    metrics: dict[str, list[CompressionMetrics]] = {k: [] for k in names}
    for w in iterator:
        b = _baseline(model, w, input_ids[:, w.begin: w.end].to(device), False)
        done = {}
        for k, t in transforms.items():
            nll, kld, top1, m, seconds = score_write(model, b.ids, w.num_targets, b.targets, b.logp, t)
            results[k].append(WindowResult(w.index, w.begin, w.end, w.num_targets, w.context_tokens, b.baseline, nll,
                                           True, seconds, kld=kld, top1_agree=top1))
            if m is not None:
                metrics[k].append(m)
            done[k] = (results[k][-1], m)
        if on_window is not None and transforms:
            on_window(w.index, done)
    seconds = time.perf_counter() - start
    return {k: summarize(results[k], metrics[k], max_length, stride, seconds) for k in names}


def evaluate_windows(
    model: Any,
    input_ids: torch.Tensor,
    max_length: int,
    stride: int = 512,
    transform: CacheTransform | None = None,
    max_windows: int | None = None,
    progress: bool = True,
) -> PerplexityResult:
    """Score ``input_ids`` [1, N] window by window; with ``transform``, also through the transformed cache
    (score_windows with one transform)."""
    res = score_windows(model, input_ids, max_length, stride, {"": transform} if transform else None,
                        max_windows, progress)
    return res[""]


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
    corpus = load_corpus(dataset_config, dataset_name=dataset_name, split=split)
    ids = tokenize(tokenizer, corpus)
    limit = max_windows if max_windows is not None else max_samples
    res = evaluate_windows(model, ids, context_length(model), stride, None, limit, progress=verbose)
    if verbose:
        print(f"Perplexity of {corpus.name}: {res.baseline_perplexity:.4f} "
              f"({res.scored_tokens} tokens, {res.num_windows} windows)")
    return res.baseline_perplexity

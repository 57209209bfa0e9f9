"""What every run resolves once, at the edge, and passes whole: the parameters checked, the
device and dtype, the corpus and its token ids, the results store, the model's source, its
tokenizer and config, the run's identity, and the model itself loaded only when a unit needs it.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kvlib.codec.binary import find_cli_binary
from kvlib.dtypes import dtype_name, resolve_dtype
from kvlib.env import default_device
from kvlib.models.corpus import Corpus, load_corpus, tokenize
from kvlib.models import sources
from kvlib.models.sources import (LazyModel, ModelSource, context_length, load_tokenizer_and_config, model_display_name,
                                  resolve_model)
from kvlib.scoring.perplexity import plan_windows
from kvlib.scoring.provenance import RunIdentity, identify
from kvlib.scoring.store import ResultsStore


@dataclass(frozen=True)
class RunParams:
    """A run's parameters as the user gave them (hashable; ``None`` means the default)."""

    model: str = "embedded"
    corpus: str = "embedded"
    device: str | None = None
    dtype: str | None = None
    threshold: float = 0.5
    stride: int = 512
    max_windows: int | None = None
    context_length: int | None = None
    results: str | os.PathLike | None | bool = None
    fresh: bool = False


@dataclass
class RunSetup:
    """A run, resolved: everything its units are computed from, and a model loaded on demand."""

    params: RunParams
    src: ModelSource
    name: str  # how reports name the model
    device: str
    dtype: torch.dtype
    text: Corpus
    tokenizer: Any
    config: Any
    ids: torch.Tensor
    context_length: int
    store: ResultsStore | None
    identity: RunIdentity
    say: Callable[..., None]
    loaded: dict[str, Any] = field(default_factory=dict)

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)

    def load(self) -> Any:
        """The model (loaded once, the first time a unit needs it; its load time is kept)."""
        if "lm" not in self.loaded:
            self.say(f"Loading {self.name} ({self.dtype_name}, {self.device})...")
            t = time.perf_counter()
            # Through the module, so a test that forbids loading (monkeypatch) sees every load.
            self.loaded["lm"], _ = sources.load_model_and_tokenizer(self.params.model, device=self.device,
                                                                    dtype=self.dtype)
            self.loaded["t"] = time.perf_counter() - t
        return self.loaded["lm"]

    @property
    def model_load_s(self) -> float:
        return self.loaded.get("t", 0.0)

    def lazy(self) -> LazyModel:
        """The model as the checks take it: its config now, its weights when a unit is missing."""
        return LazyModel(self.load, self.config)


def prepare_run(params: RunParams, verbose: bool = True) -> RunSetup:
    """Check ``params`` and resolve everything a run needs but the model's weights; what is wrong
    fails here, in one line, before anything slow starts."""
    check_parameters(params.threshold, params.stride, params.max_windows, params.context_length)
    device = params.device or default_device()
    dtype = resolve_dtype(params.dtype, device)
    text = load_corpus(params.corpus)
    store = None if params.results is False else ResultsStore.open(
        None if params.results in (None, True) else params.results, params.fresh)
    src = resolve_model(params.model)  # a bad model path fails now; a zoo model is fetched now
    tok, config = load_tokenizer_and_config(params.model)
    ids = tokenize(tok, text)
    L = params.context_length or context_length(config)
    check_corpus_length(text.name, ids.shape[1], L, params.stride, params.max_windows)
    identity = identify(src, tok, ids, dtype, device, L, params.stride, find_cli_binary())
    say = print if verbose else (lambda *a, **k: None)
    if store is not None:
        say(f"Results store: {store.root}" + (" (--fresh: not reading it)" if params.fresh else ""))
    return RunSetup(params, src, model_display_name(params.model), device, dtype, text, tok, config, ids, L, store,
                    identity, say)


def check_corpus_length(name: str, num_tokens: int, max_length: int, stride: int, max_windows: int | None) -> None:
    """A corpus too short for any window with a compressed context is an input error."""
    if not any(w.context_tokens > 0 for w in plan_windows(num_tokens, max_length, min(stride, max_length), max_windows)):
        raise ValueError(f"corpus {name} has {num_tokens} tokens: too short for a window with a compressed "
                         f"context (needs more than {min(stride, max_length) + 1} at stride {stride})")


def check_parameters(threshold: float, stride: int, max_windows: int | None, context_length: int | None) -> None:
    """Reject impossible parameters before anything slow starts (ValueError naming the parameter)."""
    if not math.isfinite(threshold):
        raise ValueError(f"threshold {threshold} is not a finite number")
    if context_length is not None and context_length < 2:
        raise ValueError(f"context_length {context_length} must be at least 2")
    if not 0 < stride <= (context_length or 2048):
        raise ValueError(f"stride {stride} must be in [1, {context_length or 2048}] (the window length)")
    if max_windows is not None and max_windows < 2:
        raise ValueError(f"max_windows {max_windows} must be at least 2 (window 0 has no context to compress) "
                         "or None for the whole corpus")

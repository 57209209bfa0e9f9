"""Generation agreement: does the model still say the same thing with a
compressed context cache?

Prompts are cut from the corpus at evenly spaced, non-overlapping places.
Each prompt's context (all but its last token) is prefilled once; the exact
cache and each scheme's reconstruction of it then generate greedily from the
prompt's last token, and their tokens are compared position by position.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvlib.codec.spec import CodecConfig
from kvlib.scoring.generate import greedy_continue, prefill, stack_caches
from kvlib.scoring.provenance import digest
from kvlib.transforms.base import unit_key_of
from kvlib.transforms.codec import cache_transforms
from kvlib.scoring.units import CheckUnits

EXACT = "exact"


@dataclass(frozen=True)
class AgreementConfig:
    """How many prompts, how long their context, how many tokens each generates."""

    prompts: int = 16
    context_tokens: int = 1024
    new_tokens: int = 64

    def __post_init__(self) -> None:
        if self.prompts < 1:
            raise ValueError(f"agreement prompts {self.prompts} must be at least 1")
        if self.context_tokens < 2:
            raise ValueError(f"agreement context_tokens {self.context_tokens} must be at least 2")
        if self.new_tokens < 1:
            raise ValueError(f"agreement new_tokens {self.new_tokens} must be at least 1")


def prompt_starts(total: int, config: AgreementConfig, corpus_name: str = "corpus") -> list[int]:
    """Where the prompts begin in a corpus of ``total`` tokens: evenly spaced from
    its start to its end, not overlapping (ValueError when they cannot fit)."""
    n, length = config.prompts, config.context_tokens
    if n * length > total:
        raise ValueError(f"{corpus_name} has {total} tokens: too short for {n} agreement prompts of {length}")
    return [0] if n == 1 else [i * (total - length) // (n - 1) for i in range(n)]


def cut_prompts(ids: torch.Tensor, config: AgreementConfig, corpus_name: str = "corpus") -> list[list[int]]:
    """The prompts: ``config.context_tokens`` tokens of ``ids`` [1, N] from each start."""
    return [ids[0, s:s + config.context_tokens].tolist()
            for s in prompt_starts(int(ids.shape[1]), config, corpus_name)]


def first_divergence(a: list[int], b: list[int]) -> int:
    """Index of the first position where a and b differ (their length when they never do)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@dataclass
class SchemeAgreement:
    """One scheme's continuations against the exact cache's."""

    name: str
    tokens: list[list[int]]  # per prompt, the generated tokens
    agreement: float = 100.0  # % of generated positions whose token equals the exact cache's
    divergence: list[int] = field(default_factory=list)  # per prompt: first differing position (new_tokens: none)
    mean_divergence: float = 0.0
    identical: int = 0  # prompts whose continuation never diverged
    sample: int = 0  # the prompt shown side by side: the one whose divergence is closest to the median
    sample_text: dict[str, str] = field(default_factory=dict)  # its context's end, common part, both continuations
    seconds: float = 0.0


@dataclass
class AgreementResult:
    config: dict[str, Any]
    corpus: str
    starts: list[int]  # token offset of each prompt in the corpus
    exact: SchemeAgreement
    schemes: list[SchemeAgreement]
    peer_error: str = ""
    timing: dict[str, float] = field(default_factory=dict)

    def scheme(self, name: str) -> SchemeAgreement:
        for s in [self.exact, *self.schemes]:
            if s.name == name:
                return s
        raise KeyError(name)

    def summary(self) -> str:
        """Plain language, e.g. 'generation agreement with the exact cache (tokens equal, mean first divergence
        of 64 tokens): int4 14.7%, 7.1; kivi2 3.0%, 0.9'."""
        parts = [f"{s.name} {s.agreement:.1f}%, {s.mean_divergence:.1f}" for s in self.schemes]
        return (f"generation agreement with the exact cache (tokens equal, mean first divergence of "
                f"{self.config['new_tokens']} tokens): " + "; ".join(parts))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "summary": self.summary()}


def _score(exact: SchemeAgreement, s: SchemeAgreement, new_tokens: int) -> None:
    same = sum(x == y for a, b in zip(exact.tokens, s.tokens) for x, y in zip(a, b))
    s.agreement = 100 * same / (new_tokens * len(s.tokens))
    s.divergence = [first_divergence(a, b) for a, b in zip(exact.tokens, s.tokens)]
    s.mean_divergence = statistics.fmean(s.divergence)
    s.identical = sum(d == new_tokens for d in s.divergence)
    median = statistics.median(s.divergence)
    s.sample = min(range(len(s.divergence)), key=lambda i: (abs(s.divergence[i] - median), i))


def _sample_text(tokenizer: Any, prompt: list[int], exact: list[int], other: list[int]) -> dict[str, str]:
    """A side-by-side sample: the context's last tokens, the part both continuations
    share, and where they go after the first divergence."""
    d = first_divergence(exact, other)
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    return {"context": decode(prompt[-48:]), "common": decode(exact[:d]), "exact": decode(exact[d:]),
            "compressed": decode(other[d:])}


def run_agreement(model: Any, tokenizer: Any, ids: torch.Tensor, codecs: list[CodecConfig],
                  workdir: str | os.PathLike, config: AgreementConfig = AgreementConfig(), model_name: str = "unknown",
                  corpus_name: str = "corpus", peers: bool = False, transforms: dict[str, Any] | None = None,
                  progress: bool = False, units: CheckUnits | None = None) -> AgreementResult:
    """Greedy continuations of ``config.prompts`` prompts cut from ``ids``, with
    the exact cache and with each codec's (and the peer's) reconstruction of
    the context through the real CLI; ``transforms`` replaces the codecs. With ``units``, each
    scheme's continuations are read from the results store when there, and stored when computed."""
    prompts = cut_prompts(ids, config, corpus_name)
    missing = None
    if transforms is None:
        transforms, missing = cache_transforms(codecs, Path(workdir), model_name, peers,
                                               slots=config.prompts)
    units = units or CheckUnits(None, None, "agreement")
    inputs = digest([prompts, config.new_tokens])
    specs = {EXACT: "exact", **{k: unit_key_of(t) for k, t in transforms.items()}}
    contexts, t_prefill = None, 0.0  # prefilled when some scheme is not in the store
    last = torch.tensor([[p[-1]] for p in prompts])
    results = []
    for name in [EXACT, *transforms]:
        stored = units.get(inputs, specs[name]) if specs[name] else None
        if stored is not None:
            results.append(SchemeAgreement(name, stored["tokens"], seconds=stored["seconds"]))
            continue
        if contexts is None:
            t0 = time.perf_counter()
            contexts = [prefill(model, p[:-1]) for p in prompts]
            t_prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        # Each reconstruction is copied into the batch as it arrives: one alive at a time.
        batch = stack_caches(contexts if name == EXACT else (transforms[name](c)[0] for c in contexts), len(contexts),
                             last.shape[1] + config.new_tokens)
        tokens = greedy_continue(model, batch, last, config.new_tokens).tolist()
        del batch
        results.append(SchemeAgreement(name, tokens, seconds=time.perf_counter() - t0))
        if specs[name]:
            units.put(inputs, specs[name], {"tokens": tokens, "seconds": results[-1].seconds})
        if progress:
            print(f"  agreement {name}: {results[-1].seconds:.1f} s", flush=True)
    exact, schemes = results[0], results[1:]
    for s in [exact, *schemes]:
        _score(exact, s, config.new_tokens)
        s.sample_text = _sample_text(tokenizer, prompts[s.sample], exact.tokens[s.sample], s.tokens[s.sample])
    return AgreementResult(
        asdict(config), corpus_name, prompt_starts(int(ids.shape[1]), config), exact, schemes,
        peer_error=missing or "",
        timing={"prefill_s": t_prefill, "total_s": t_prefill + sum(s.seconds for s in results)},
    )

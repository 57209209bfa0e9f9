"""Pass-key retrieval ("needle in a haystack") under a compressed cache: can
the model still find a fact far back in its context?

Each haystack is built at the token level from fixed filler sentences, with a
seeded 5-digit key stated at a given depth (Mohtashami & Jaggi's pass-key
prompt). The haystack, everything before the question, is prefilled once; the
exact cache and each scheme's reconstruction of it then answer the same
question greedily, and a cell counts as found when the key stands in the answer
as a number of its own.
"""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvlib.codec.spec import CodecConfig
from kvlib.scoring.generate import greedy_continue, prefill, stack_caches
from kvlib.cache.layout import model_layout
from kvlib.scoring.provenance import digest
from kvlib.transforms.base import unit_key_of
from kvlib.transforms.codec import cache_transforms
from kvlib.scoring.units import CheckUnits

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.")
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = " The pass key is {key}. Remember it."
QUESTION = "\nWhat is the pass key? The pass key is"
EXACT = "exact"


@dataclass(frozen=True)
class RetrievalConfig:
    """The grid: context lengths (haystack, question and answer fit in each) ×
    depths of the key (0 = start of the haystack, 1 = its end) × keys per cell."""

    lengths: tuple[int, ...] = (1024, 2048, 4096)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    keys: int = 1
    seed: int = 0
    answer_tokens: int = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(int(n) for n in self.lengths))
        object.__setattr__(self, "depths", tuple(float(d) for d in self.depths))
        if not self.lengths or any(n < 1 for n in self.lengths) or len(set(self.lengths)) != len(self.lengths):
            raise ValueError(f"retrieval lengths {self.lengths}: give distinct positive token counts")
        if not self.depths or any(not 0 <= d <= 1 for d in self.depths) or len(set(self.depths)) != len(self.depths):
            raise ValueError(f"retrieval depths {self.depths}: give distinct fractions in [0, 1]")
        if self.keys < 1:
            raise ValueError(f"retrieval keys {self.keys} must be at least 1 per cell")
        if self.answer_tokens < 1:
            raise ValueError(f"retrieval answer_tokens {self.answer_tokens} must be at least 1")

    @classmethod
    def parse(cls, lengths: str | None = None, depths: str | None = None, keys: int | None = None) -> "RetrievalConfig":
        """From comma-separated text, as the CLI and the notebooks give it ("1024,2048", "0,0.5,1");
        what is not given keeps its default. ValueError names the parameter."""
        kw: dict[str, Any] = {}
        for name, text, kind in (("lengths", lengths, int), ("depths", depths, float)):
            if text is not None and str(text).strip():
                try:
                    kw[name] = tuple(kind(x) for x in str(text).split(",") if x.strip())
                except ValueError:
                    raise ValueError(f"retrieval {name} {text!r}: give comma-separated numbers") from None
        if keys is not None:
            kw["keys"] = int(keys)
        return cls(**kw)

    @property
    def cells_per_length(self) -> int:
        return len(self.depths) * self.keys


@dataclass
class Haystack:
    """One prompt: ``ids`` is everything before the question; the needle starts at ``needle_start``."""

    length: int  # the grid's length: haystack + question + answer tokens fit in it
    depth: float
    key: str
    ids: list[int]
    question: list[int]
    needle_start: int
    filler_start: int  # where the filler begins (after the intro)
    filler_tokens: int  # filler tokens in the haystack (the needle excluded)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def build_haystack(tokenizer: Any, length: int, depth: float, key: str, answer_tokens: int = 8) -> Haystack:
    """The haystack of one cell: as many whole filler units as fit, the needle
    after round(depth × units) of them. ValueError when ``length`` is too short."""
    intro = tokenizer(INTRO).input_ids  # with the tokenizer's own BOS, as the corpus is tokenized
    unit = _encode(tokenizer, FILLER)
    needle = _encode(tokenizer, NEEDLE.format(key=key))
    question = _encode(tokenizer, QUESTION)
    units = (length - len(intro) - len(needle) - len(question) - answer_tokens) // len(unit)
    if units < 1:
        fixed = len(intro) + len(needle) + len(question) + answer_tokens + len(unit)
        raise ValueError(f"retrieval length {length} is too short: a haystack needs at least {fixed} tokens")
    at = round(depth * units)
    ids = intro + unit * at + needle + unit * (units - at)
    return Haystack(length, depth, key, ids, question, len(intro) + at * len(unit), len(intro), units * len(unit))


def build_haystacks(tokenizer: Any, config: RetrievalConfig, lengths: tuple[int, ...] | None = None) -> list[Haystack]:
    """Every cell's haystacks, in grid order (length, depth, key); the keys come
    from ``config.seed``, so the same config always builds the same prompts."""
    rng = random.Random(config.seed)
    out = []
    for n in config.lengths:
        for d in config.depths:
            for _ in range(config.keys):
                key = str(rng.randint(10000, 99999))
                if lengths is None or n in lengths:
                    out.append(build_haystack(tokenizer, n, d, key, config.answer_tokens))
    return out


@dataclass
class Answer:
    length: int
    depth: float
    key: str
    answer: str
    found: bool


@dataclass
class SchemeRetrieval:
    """One cache's answers over the grid (the exact cache's too)."""

    name: str
    answers: list[Answer]
    seconds: float = 0.0  # transform and decoding
    dropped: int = 0  # haystacks the exact cache answers and this one does not
    gained: int = 0  # the reverse
    cells_dropped: int = 0  # grid cells (length, depth) where it finds fewer keys than the exact cache

    @property
    def found(self) -> int:
        return sum(a.found for a in self.answers)

    @property
    def total(self) -> int:
        return len(self.answers)

    def cell(self, length: int, depth: float) -> tuple[int, int]:
        """(found, total) of one grid cell."""
        hits = [a.found for a in self.answers if a.length == length and a.depth == depth]
        return sum(hits), len(hits)


@dataclass
class RetrievalResult:
    """The exact cache's and every scheme's answers over the same haystacks."""

    config: dict[str, Any]
    lengths: list[int]  # the lengths run (the grid's, capped at the model's context)
    skipped_lengths: list[int]
    exact: SchemeRetrieval
    schemes: list[SchemeRetrieval]
    peer_error: str = ""
    timing: dict[str, float] = field(default_factory=dict)
    reach: str = ""  # how far back the model's layers see, when sliding-window layers cannot see a key

    def scheme(self, name: str) -> SchemeRetrieval:
        for s in [self.exact, *self.schemes]:
            if s.name == name:
                return s
        raise KeyError(name)

    def summary(self) -> str:
        """Plain language: 'retrieval: 15/15 exact, 15/15 int4, 12/15 kivi2 (3 dropped)'."""
        parts = [f"{s.found}/{s.total} {s.name}" + (f" ({s.dropped} dropped)" if s.dropped else "")
                 for s in [self.exact, *self.schemes]]
        skipped = (f" (lengths {', '.join(map(str, self.skipped_lengths))} left out: beyond the model's context)"
                   if self.skipped_lengths else "")
        return "retrieval: " + ", ".join(parts) + skipped + (f"; {self.reach}" if self.reach else "")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for s, sd in zip([self.exact, *self.schemes], [d["exact"], *d["schemes"]]):
            sd.update(found=s.found, total=s.total)
        d["summary"] = self.summary()
        return d


def _compare(exact: SchemeRetrieval, other: SchemeRetrieval) -> None:
    other.dropped = sum(e.found and not o.found for e, o in zip(exact.answers, other.answers))
    other.gained = sum(o.found and not e.found for e, o in zip(exact.answers, other.answers))
    cells = {(a.length, a.depth) for a in exact.answers}
    other.cells_dropped = sum(other.cell(*c)[0] < exact.cell(*c)[0] for c in cells)


def _answers(model: Any, tokenizer: Any, batch: Any, group: list[Haystack], answer_tokens: int) -> list[Answer]:
    """Decode ``batch`` (one row per haystack of ``group``) and score each answer."""
    question = torch.tensor([h.question for h in group])
    tokens = greedy_continue(model, batch, question, answer_tokens)
    out = []
    for h, t in zip(group, tokens.tolist()):
        text = tokenizer.decode(t, skip_special_tokens=True)
        out.append(Answer(h.length, h.depth, h.key, text, key_found(h.key, text)))
    return out


def key_found(key: str, answer: str) -> bool:
    """The key stands in the answer as a number of its own ("71432." counts, "714325" does not)."""
    return re.search(rf"(?<!\d){re.escape(key)}(?!\d)", answer) is not None


def reach(model: Any, lengths: tuple[int, ...]) -> str:
    """Which layers can see a key far back, when some haystacks are longer than a sliding window."""
    windows = model_layout(model).windows
    sliding = [w for w in windows if w]
    if not sliding or max(lengths) < min(sliding):
        return ""
    return (f"{len(sliding)} of {len(windows)} layers attend to the last {min(sliding)} tokens only: beyond that, "
            f"only the {len(windows) - len(sliding)} full-attention layers see the key")


def model_context(model: Any) -> int | None:
    """The model's context length, None when its config does not say."""
    n = getattr(model.config, "max_position_embeddings", None)
    return int(n) if n else None


def lengths_within(config: RetrievalConfig, max_context: int | None) -> tuple[int, ...]:
    """The grid's lengths that fit the model's context (all when it is unknown);
    ValueError when none does."""
    lengths = tuple(n for n in config.lengths if max_context is None or n <= max_context)
    if not lengths:
        raise ValueError(f"every retrieval length {config.lengths} exceeds the model's context ({max_context})")
    return lengths


def run_retrieval(model: Any, tokenizer: Any, codecs: list[CodecConfig], workdir: str | os.PathLike,
                  config: RetrievalConfig = RetrievalConfig(), model_name: str = "unknown", peers: bool = False,
                  max_context: int | None = None, transforms: dict[str, Any] | None = None,
                  progress: bool = False, units: CheckUnits | None = None) -> RetrievalResult:
    """Every haystack of ``config`` (lengths above ``max_context``, default the
    model's, left out), prefilled once, answered by the exact cache and by each
    codec's (and the peer's) reconstruction through the real CLI. ``transforms``
    replaces the codecs (tests pass an identity). With ``units``, each batch's answers per
    scheme are read from the results store when there, and stored when computed."""
    units = units or CheckUnits(None, None, "retrieval")
    lengths = lengths_within(config, max_context or model_context(model))
    haystacks = build_haystacks(tokenizer, config, lengths)
    missing = None
    if transforms is None:
        transforms, missing = cache_transforms(codecs, Path(workdir), model_name, peers,
                                               slots=config.cells_per_length)
    names = [EXACT, *transforms]
    specs = {EXACT: "exact", **{k: unit_key_of(t) for k, t in transforms.items()}}
    answers: dict[str, list[Answer]] = {k: [] for k in names}
    seconds = dict.fromkeys(names, 0.0)
    t_prefill = 0.0
    groups: dict[int, list[Haystack]] = {}
    for h in haystacks:  # equal token counts decode as one batch
        groups.setdefault(len(h.ids), []).append(h)
    for i, group in enumerate(groups.values()):
        inputs = digest([[h.ids, h.question, h.key] for h in group] + [config.answer_tokens])
        exact = None  # prefilled when some scheme of this group is not in the store
        for name in names:
            stored = units.get(inputs, specs[name]) if specs[name] else None
            if stored is not None:
                answers[name] += [Answer(**a) for a in stored["answers"]]
                seconds[name] += stored["seconds"]
                continue
            if exact is None:
                t0 = time.perf_counter()
                exact = [prefill(model, h.ids) for h in group]
                t_prefill += time.perf_counter() - t0
            t0 = time.perf_counter()
            # Each reconstruction is copied into the batch as it arrives: one alive at a time.
            batch = stack_caches(exact if name == EXACT else (transforms[name](c)[0] for c in exact), len(exact),
                                 len(group[0].question) + config.answer_tokens)
            got = _answers(model, tokenizer, batch, group, config.answer_tokens)
            del batch
            dt = time.perf_counter() - t0
            answers[name] += got
            seconds[name] += dt
            if specs[name]:
                units.put(inputs, specs[name], {"answers": [asdict(a) for a in got], "seconds": dt})
            if progress:
                print(f"  retrieval {i + 1}/{len(groups)} ({group[0].length} tokens) {name}: "
                      f"{sum(a.found for a in got)}/{len(group)}", flush=True)
        del exact
    exact_r = SchemeRetrieval(EXACT, answers[EXACT], seconds[EXACT])
    schemes = [SchemeRetrieval(n, answers[n], seconds[n]) for n in names[1:]]
    for s in schemes:
        _compare(exact_r, s)
    return RetrievalResult(asdict(config), list(lengths), [n for n in config.lengths if n not in lengths], exact_r,
                           schemes, peer_error=missing or "",
                           timing={"prefill_s": t_prefill, "total_s": t_prefill + sum(seconds.values())},
                           reach=reach(model, lengths))

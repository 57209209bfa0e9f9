"""Pass-key retrieval ("needle in a haystack") under a compressed cache: can
the model still find a fact far back in its context?

The pass key is RULER's ``niah_single_1`` (kvlib.checks.ruler): a 7-digit magic number for a
word, stated once among noise sentences; the grid only fixes the needle's depth instead of
drawing it. Each prompt's context is prefilled once; the exact cache and each scheme's
reconstruction of it then answer the same question greedily, and a cell counts as found when the
number stands in the answer (RULER's ``string_match_all``), through the suite's own runner.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvlib.cache.layout import model_layout
from kvlib.checks.ruler.run import EXACT, Runner, stop_tokens
from kvlib.checks.ruler.tasks import Environment, Sample, at_depth
from kvlib.codec.spec import CodecConfig
from kvlib.scoring.units import CheckUnits
from kvlib.transforms.base import unit_key_of
from kvlib.transforms.codec import cache_transforms

TASK = "niah_single_1"  # the RULER task each pass key is a sample of
MIN_LENGTH = 256  # as RULER's lengths: the template and 128 answer tokens take most of a shorter one


@dataclass(frozen=True)
class RetrievalConfig:
    """The grid: context lengths (prompt and answer fit in each) × depths of the
    needle (0 = start of the haystack, 1 = its end) × keys per cell."""

    lengths: tuple[int, ...] = (1024, 2048, 4096)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    keys: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(int(n) for n in self.lengths))
        object.__setattr__(self, "depths", tuple(float(d) for d in self.depths))
        if (not self.lengths or any(n < MIN_LENGTH for n in self.lengths)
                or len(set(self.lengths)) != len(self.lengths)):
            raise ValueError(f"retrieval lengths {self.lengths}: give distinct token counts of at least {MIN_LENGTH}")
        if not self.depths or any(not 0 <= d <= 1 for d in self.depths) or len(set(self.depths)) != len(self.depths):
            raise ValueError(f"retrieval depths {self.depths}: give distinct fractions in [0, 1]")
        if self.keys < 1:
            raise ValueError(f"retrieval keys {self.keys} must be at least 1 per cell")

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


@dataclass(frozen=True)
class Haystack:
    """One cell's prompt: the niah_single_1 sample with its needle at ``depth``."""

    length: int  # the grid's length: prompt and answer tokens fit in it
    depth: float
    sample: Sample

    @property
    def key(self) -> str:
        return self.sample.references[0]


def build_haystacks(tokenizer: Any, config: RetrievalConfig, lengths: tuple[int, ...] | None = None) -> list[Haystack]:
    """Every cell's prompts, in grid order (length, depth, key): sample ``depth index × keys + key``
    of niah_single_1 at that length, from ``config.seed`` (the same config builds the same
    prompts). ValueError when a length is too short for the task."""
    out = []
    for n in config.lengths:
        if lengths is not None and n not in lengths:
            continue
        for i, d in enumerate(config.depths):
            task = at_depth(TASK, d)
            for k in range(config.keys):
                out.append(Haystack(n, d, task.sample(tokenizer, n, config.seed, i * config.keys + k, Environment())))
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
    replaces the codecs (tests pass an identity). With ``units``, each prompt's answer per
    scheme is read from the results store when there, and stored when computed."""
    units = units or CheckUnits(None, None, "retrieval")
    lengths = lengths_within(config, max_context or model_context(model))
    haystacks = build_haystacks(tokenizer, config, lengths)
    missing = None
    if transforms is None:
        transforms, missing = cache_transforms(codecs, Path(workdir), model_name, peers)
    names = [EXACT, *transforms]
    specs = {EXACT: "exact", **{k: unit_key_of(t) for k, t in transforms.items()}}  # None: not stored
    runner = Runner(model, tokenizer, units, dict(transforms), specs, stop_tokens(model.config, tokenizer), [])
    answers: dict[str, list[Answer]] = {k: [] for k in names}
    seconds = dict.fromkeys(names, 0.0)
    t0 = time.perf_counter()
    for i, h in enumerate(haystacks):
        got = runner.answer(h.sample, names, {})
        for name in names:
            if name not in got:  # a transform that raised: its reason, not a KeyError
                raise ValueError(f"retrieval with {name}: {runner.refused.get(name, 'no answer')}")
            answers[name].append(Answer(h.length, h.depth, h.key, got[name]["answer"], got[name]["score"] >= 1.0))
            seconds[name] += got[name]["seconds"]
        if progress:
            print(f"  retrieval {i + 1}/{len(haystacks)} ({h.length} tokens, depth {h.depth:g}): "
                  + ", ".join(f"{n} {'found' if answers[n][-1].found else 'lost'}" for n in names), flush=True)
    exact_r = SchemeRetrieval(EXACT, answers[EXACT], seconds[EXACT])
    schemes = [SchemeRetrieval(n, answers[n], seconds[n]) for n in names[1:]]
    for s in schemes:
        _compare(exact_r, s)
    return RetrievalResult(asdict(config), list(lengths), [n for n in config.lengths if n not in lengths], exact_r,
                           schemes, peer_error=missing or "",
                           timing={"prefill_s": runner.prefill_s, "total_s": time.perf_counter() - t0},
                           reach=reach(model, lengths))

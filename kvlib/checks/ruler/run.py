"""The RULER protocol: each sample's context is prefilled once with the exact cache, compressed by
each scheme (a codec round trip) or evicted by each press, then the question is appended and the
answer decoded greedily — query-agnostic, as kvpress's pipeline — and scored as RULER scores.

One unit per (sample, scheme), kept in the results store: a killed run resumes where it stopped,
and an added scheme costs only itself. Eviction presses are compared at equal bytes: for each
codec, each press keeps the tokens whose 16-bit keys and values take that codec's bits.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvlib.cache.layout import cache_layers, layout_of
from kvlib.checks.ruler.score import accuracy, average, score
from kvlib.checks.ruler.tasks import TASKS, Environment, Sample
from kvlib.codec.spec import CodecConfig, nominal_bits
from kvlib.gates import RULER_EXACT_FLOOR, ruler_qualifies
from kvlib.scoring.generate import greedy_answers, prefill_observed, stack_caches, stack_padded
from kvlib.scoring.provenance import digest
from kvlib.scoring.units import CheckUnits
from kvlib.transforms.base import unit_key_of
from kvlib.transforms.codec import cache_transforms
from kvlib.transforms.evict import PRESSES, SnapKV, make_press, ratio_at_bits

EXACT = "exact"
DEFAULT_TASKS = ("niah_single_1", "niah_single_2", "niah_multikey_1", "vt", "fwe")
ALL_TASKS = tuple(TASKS)


def _csv(text: str | None, kind: type) -> tuple | None:
    if text is None or not str(text).strip():
        return None
    return tuple(kind(x.strip()) for x in str(text).split(",") if x.strip())


@dataclass(frozen=True)
class RulerConfig:
    """The suite: tasks × lengths × samples per cell, the seed the samples are drawn from, the
    eviction presses compared at each codec's bytes, and the corpus of text haystacks."""

    tasks: tuple[str, ...] = DEFAULT_TASKS
    lengths: tuple[int, ...] = (4096,)
    samples: int = 25
    seed: int = 42
    presses: tuple[str, ...] = tuple(PRESSES)
    haystack: str = "embedded"

    def __post_init__(self) -> None:
        bad = [t for t in self.tasks if t not in TASKS]
        if bad or not self.tasks:
            raise ValueError(f"RULER tasks {', '.join(bad) or '(none)'}: choose from {', '.join(TASKS)}")
        if not self.lengths or any(n < 256 for n in self.lengths) or len(set(self.lengths)) != len(self.lengths):
            raise ValueError(f"RULER lengths {self.lengths}: give distinct token counts of at least 256")
        if self.samples < 1:
            raise ValueError(f"RULER samples {self.samples} must be at least 1")
        bad = [p for p in self.presses if p not in PRESSES]
        if bad:
            raise ValueError(f"RULER presses {', '.join(bad)}: choose from {', '.join(PRESSES)} (or none)")

    @classmethod
    def parse(cls, tasks: str | None = None, lengths: str | None = None, samples: int | None = None,
              presses: str | None = None, haystack: str | None = None, seed: int | None = None) -> "RulerConfig":
        """From comma-separated text (the CLI's flags, a notebook's parameters); 'all' tasks are
        every registered one, presses 'none' turns them off; ValueError names the parameter."""
        kw: dict[str, Any] = {}
        try:
            if tasks is not None and tasks.strip():
                kw["tasks"] = ALL_TASKS if tasks.strip() == "all" else _csv(tasks, str)
            if lengths is not None and str(lengths).strip():
                kw["lengths"] = _csv(lengths, int)
        except ValueError:
            raise ValueError(f"RULER lengths {lengths!r}: give comma-separated token counts") from None
        if presses is not None:
            kw["presses"] = () if presses.strip() in ("", "none") else _csv(presses, str)
        for k, v in (("samples", samples), ("seed", seed)):
            if v is not None:
                kw[k] = int(v)
        if haystack:
            kw["haystack"] = haystack
        return cls(**kw)


@dataclass
class RulerAnswer:
    task: str
    length: int
    index: int
    answer: str
    score: float
    seconds: float
    cache_bytes: int  # what the scheme's context cache takes (16-bit for the exact one)


@dataclass
class RulerResult:
    """Every scheme's answers on the same samples, and what was left out and why."""

    config: dict[str, Any]
    lengths: list[int]
    answers: dict[str, list[RulerAnswer]]  # scheme name -> answers, the exact cache first
    schemes: dict[str, dict[str, Any]]  # name -> kind (exact, kvq, evict), spec, bits, compared_to
    notes: list[str] = field(default_factory=list)  # lengths capped, tasks and presses skipped
    timing: dict[str, float] = field(default_factory=dict)

    def scores(self, scheme: str, task: str, length: int) -> list[float]:
        return [a.score for a in self.answers[scheme] if a.task == task and a.length == length]

    def cell(self, scheme: str, task: str, length: int) -> tuple[float, float, float]:
        """Accuracy (percent) with its CI."""
        return accuracy(self.scores(scheme, task, length))

    def qualifies(self, task: str, length: int) -> bool:
        """Whether the exact cache does the task at this length (else a scheme's cell is a floor)."""
        return ruler_qualifies(self.cell(EXACT, task, length)[0])

    def tasks(self) -> list[str]:
        return [t for t in self.config["tasks"] if any(a.task == t for a in self.answers[EXACT])]

    def average(self, scheme: str, length: int, qualifying_only: bool = False) -> tuple[float, float, float]:
        """RULER's average over tasks at one length (kvpress's leaderboard number), with its CI."""
        tasks = [t for t in self.tasks() if not qualifying_only or self.qualifies(t, length)]
        return average([self.scores(scheme, t, length) for t in tasks])

    def megabytes(self, scheme: str, length: int) -> float:
        b = [a.cache_bytes for a in self.answers[scheme] if a.length == length]
        return sum(b) / len(b) / 2**20 if b else math.nan

    def table(self) -> list[dict[str, Any]]:
        """One row per scheme, task and length: accuracy, CI, whether the cell qualifies, MB."""
        rows = []
        for name, meta in self.schemes.items():
            for n in self.lengths:
                for t in self.tasks():
                    acc, lo, hi = self.cell(name, t, n)
                    rows.append({"scheme": name, "kind": meta["kind"], "task": t, "length": n, "accuracy": acc,
                                 "ci_low": lo, "ci_high": hi, "samples": len(self.scores(name, t, n)),
                                 "qualifies": self.qualifies(t, n), "cache_mb": self.megabytes(name, n)})
        return rows

    def summary(self) -> str:
        """'ruler 4096: exact 72.0 [64.1, 79.8], int4 70.4 ..., knorm@int4 31.2 ...'."""
        out = []
        for n in self.lengths:
            parts = []
            for name in self.schemes:
                acc, lo, hi = self.average(name, n)
                parts.append(f"{name} {acc:.1f}" + (f" [{lo:.1f}, {hi:.1f}]" if not math.isnan(lo) else ""))
            out.append(f"ruler {n}: " + ", ".join(parts))
        return "; ".join(out) + (f" ({'; '.join(self.notes)})" if self.notes else "")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RulerResult":
        """Back from ``to_dict`` (a report renders a saved run without recomputing it)."""
        return cls(d["config"], list(d["lengths"]),
                   {k: [RulerAnswer(**a) for a in v] for k, v in d["answers"].items()}, d["schemes"],
                   list(d.get("notes", [])), dict(d.get("timing", {})))

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "lengths": self.lengths, "schemes": self.schemes, "notes": self.notes,
                "timing": self.timing, "exact_floor": RULER_EXACT_FLOOR, "table": self.table(),
                "averages": {name: {str(n): self.average(name, n) for n in self.lengths} for name in self.schemes},
                "answers": {k: [asdict(a) for a in v] for k, v in self.answers.items()}, "summary": self.summary()}


ANSWER_FIELDS = ("answer", "score", "seconds", "cache_bytes")  # a unit's body


def stop_tokens(config: Any, tokenizer: Any) -> tuple[int, ...]:
    """The tokens an answer ends at: the model's EOS ids (config), else the tokenizer's."""
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    return tuple(sorted(set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])))


def _exact_bytes(cache: Any) -> int:
    return sum(2 * (k.numel() + v.numel()) for k, v in cache_layers(cache))


def plan_lengths(config: RulerConfig, max_context: int | None) -> tuple[list[int], list[str]]:
    """The lengths that fit the model's context, and a one-line note for each one capped."""
    keep = [n for n in config.lengths if max_context is None or n <= max_context]
    notes = [f"length {n} left out: beyond the model's context ({max_context})" for n in config.lengths
             if n not in keep]
    if not keep:
        raise ValueError(f"every RULER length {config.lengths} exceeds the model's context ({max_context})")
    return keep, notes


def eviction_peers(config: RulerConfig, codecs: list[CodecConfig]) -> dict[str, Any]:
    """Each press at each codec's bytes: name 'press@codec' → press (kvpress's compression ratio
    1 − bits/16)."""
    out = {}
    for c in codecs:
        ratio = ratio_at_bits(nominal_bits(c.spec))
        for p in config.presses:
            out[f"{p}@{c.name}"] = make_press(p, ratio)
    return out


def plan_cells(config: RulerConfig, tokenizer: Any, lengths: list[int], env: Environment,
               notes: list[str]) -> list[tuple[int, Any]]:
    """The (length, task) cells to run: a task that cannot run here (its dataset) or whose prompt
    cannot fit a length is left out with a note in ``notes``, before anything slow."""
    tasks = []
    for name in config.tasks:
        why = TASKS[name].unavailable(env)
        if why:
            notes.append(why)
        else:
            tasks.append(TASKS[name])
    cells = []
    for n in lengths:
        for task in tasks:
            try:
                task.sample(tokenizer, n, config.seed, 0, env)
                cells.append((n, task))
            except ValueError as e:
                notes.append(f"{task.name} at {n} left out: {e}")
    return cells


def describe_schemes(codecs: list[CodecConfig], transforms: dict[str, Any], presses: dict[str, Any]) -> dict[str, dict]:
    """Each cache's kind, spec and bits, the exact cache first, then the codecs', then the presses'."""
    schemes: dict[str, dict[str, Any]] = {EXACT: {"kind": "exact", "spec": "exact", "bits": 16.0}}
    by_name = {c.name: c for c in codecs}
    for name, t in transforms.items():  # the codecs' round trips (or what a test gives instead)
        c = by_name.get(name)
        schemes[name] = {"kind": getattr(t, "kind", "transform"), "spec": c.spec if c else name,
                         "bits": nominal_bits(c.spec) if c else math.nan}
    for name, p in presses.items():
        schemes[name] = {"kind": "evict", "spec": p.spec, "bits": 16 * p.keep, "compared_to": name.split("@", 1)[1]}
    return schemes


def run_ruler(model: Any, tokenizer: Any, codecs: list[CodecConfig], workdir: str | Path, config: RulerConfig,
              haystack_text: str, model_name: str = "unknown", max_context: int | None = None,
              transforms: dict[str, Any] | None = None, progress: bool = False,
              units: CheckUnits | None = None) -> RulerResult:
    """Every sample of ``config``, answered by the exact cache, each codec's reconstruction and each
    press's eviction; ``transforms`` replaces the codecs (tests pass an identity)."""
    units = units or CheckUnits(None, None, "ruler")
    lengths, notes = plan_lengths(config, max_context or getattr(model.config, "max_position_embeddings", None))
    env = Environment(haystack_text, config.haystack)
    cells = plan_cells(config, tokenizer, lengths, env, notes)
    if transforms is None:
        transforms, _ = cache_transforms(codecs, Path(workdir), model_name)
    presses = eviction_peers(config, codecs)
    schemes = describe_schemes(codecs, transforms, presses)
    every = {**transforms, **presses}
    specs = {EXACT: "exact", **{k: unit_key_of(t) or k for k, t in every.items()}}
    answers: dict[str, list[RulerAnswer]] = {k: [] for k in schemes}
    stop = stop_tokens(model.config, tokenizer)
    refused: dict[str, str] = {}
    t_start, t_prefill = time.perf_counter(), 0.0
    for n, task in cells:
        for i in range(config.samples):
            s = task.sample(tokenizer, n, config.seed, i, env)
            inputs = digest([s.context, s.question, s.references, s.max_new_tokens, s.metric, list(stop)])
            got = {name: units.get(inputs, specs[name]) for name in schemes if name not in refused}
            missing = [name for name, g in got.items() if g is None]
            if missing:
                t0 = time.perf_counter()
                lm = model.get() if hasattr(model, "get") else model  # a LazyModel loads here, once
                cache, queries = prefill_observed(lm, s.context, SnapKV.window)
                t_prefill += time.perf_counter() - t0
                for name, body in _answers(lm, tokenizer, s, missing, every, cache, queries, stop,
                                           refused, notes).items():
                    units.put(inputs, specs[name], body)
                    got[name] = body
                del cache, queries
            for name, body in got.items():
                if body is not None:
                    answers[name].append(RulerAnswer(s.task, n, i, **{k: body[k] for k in ANSWER_FIELDS}))
            if progress and got.get(EXACT):
                print(f"  ruler {n} {task.name} #{i}: exact {got[EXACT]['score']:.2f} "
                      f"{got[EXACT]['answer'][:40]!r}", flush=True)
    for name in refused:
        schemes.pop(name, None)
        answers.pop(name, None)
    return RulerResult(asdict(config), lengths, answers, schemes, notes,
                       {"prefill_s": t_prefill, "total_s": time.perf_counter() - t_start})


def _build(transform: Any, cache: Any, queries: Any) -> tuple[Any, int]:
    """A scheme's context cache from the sample's exact one (left untouched), and its bytes."""
    if transform is None:  # the exact cache itself: decoding appends to the batch it is copied into
        return cache, _exact_bytes(cache)
    if getattr(transform, "kind", "") == "evict":
        evicted, m = transform(cache, queries)
        return evicted.cache, m.bytes_bf16
    c, m = transform(cache)
    return c, int(getattr(m, "compressed_size_bytes", 0) or 0)


def decode_groups(caches: dict[str, Any]) -> list[list[str]]:
    """The batches the caches decode in: one, padded, when every layer attends to the full context
    (an eviction's shorter cache masked beside the exact one's: the model's weights are read once
    per token for all); with sliding-window layers, one per cache length."""
    if not any(layout_of(c).sliding for c in caches.values()):
        return [list(caches)] if caches else []
    groups: dict[int, list[str]] = {}
    for name, c in caches.items():
        groups.setdefault(cache_layers(c)[0][0].shape[2], []).append(name)
    return list(groups.values())


def _answers(model: Any, tokenizer: Any, s: Sample, names: list[str], every: dict[str, Any], cache: Any,
             queries: Any, stop: tuple[int, ...], refused: dict[str, str], notes: list[str]) -> dict[str, dict]:
    """The answers of ``names`` to one sample: their caches built and decoded in ``decode_groups``'
    batches. A press that cannot evict this layout is refused (named in ``notes``) and left out."""
    built: dict[str, tuple[Any, int, float]] = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            c, nbytes = _build(every.get(name), cache, queries)
        except ValueError as e:
            refused[name] = str(e)
            notes.append(f"{name} skipped: {e}")
            continue
        built[name] = (c, nbytes, time.perf_counter() - t0)
    reserve = len(s.question) + s.max_new_tokens

    def finished(tokens: list[int]) -> bool:  # a score of 1 cannot change with more tokens
        return score(s.metric, tokenizer.decode(tokens, skip_special_tokens=True), s.references) >= 1.0

    out = {}
    for group in decode_groups({n: c for n, (c, _, _) in built.items()}):
        t0 = time.perf_counter()
        caches = [built[n][0] for n in group]
        for n in group:
            built[n] = (None, *built[n][1:])
        if len({cache_layers(c)[0][0].shape[2] for c in caches}) > 1:
            batch, mask = stack_padded(caches, reserve)
        else:
            batch, mask = stack_caches(caches, len(caches), reserve), None
        del caches
        rows = greedy_answers(model, batch, s.question, s.max_new_tokens, len(s.context), stop, finished, mask)
        del batch
        share = (time.perf_counter() - t0) / len(group)
        for n, tokens in zip(group, rows):
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            out[n] = {"answer": text, "score": score(s.metric, text, s.references),
                      "seconds": built[n][2] + share, "cache_bytes": built[n][1]}
    return {n: out[n] for n in names if n in out}

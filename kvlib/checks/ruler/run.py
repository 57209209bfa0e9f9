"""The RULER protocol: each sample's context is prefilled once with the exact cache, compressed by
each scheme (a codec round trip) or evicted by each press, then the question is appended and the
answer decoded greedily — query-agnostic, as kvpress's pipeline — and scored as RULER scores.

One unit per (sample, scheme), kept in the results store: a killed run resumes where it stopped,
and an added scheme costs only itself. Eviction presses are compared at equal bytes: for each
codec, each press keeps the tokens whose 16-bit keys and values take that codec's bits.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from kvlib.cache.layout import CacheLayout, cache_layers, layout_of, make_cache
from kvlib.checks.ruler.score import accuracy, average, score
from kvlib.checks.ruler.tasks import TASKS, Environment, Sample
from kvlib.codec.spec import CodecConfig, nominal_bits
from kvlib.gates import RULER_EXACT_FLOOR, ruler_out_of_reach, ruler_qualifies, ruler_sure
from kvlib.scoring.generate import greedy_answers, padded_batches, prefill_observed, stack_caches, stack_padded
from kvlib.scoring.provenance import digest
from kvlib.scoring.units import CheckUnits
from kvlib.transforms.base import unit_key_of
from kvlib.transforms.codec import cache_transforms
from kvlib.transforms.evict import PRESSES, SnapKV, make_press, ratio_at_bits

EXACT = "exact"
SPILL_BYTES = 16 * 2**30  # prefills kept for the schemes, at most (past it, a sample is prefilled again)
DECODE_BATCH_BYTES = 8 * 2**30  # the caches of one sample alive at once, at most (built and batched by chunks)
DEFAULT_TASKS = ("niah_single_1", "niah_single_2", "niah_multikey_1", "vt", "fwe")
ALL_TASKS = tuple(TASKS)


def _csv(text: str | None, kind: type) -> tuple | None:
    if text is None or not str(text).strip():
        return None
    return tuple(kind(x.strip()) for x in str(text).split(",") if x.strip())


def _flag(value: Any, name: str) -> bool:
    """A yes/no setting from a bool or its text (a make variable: True, false, 1, 0)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ValueError(f"RULER {name} {value!r}: give True or False")


@dataclass(frozen=True)
class RulerConfig:
    """The suite: tasks × lengths × samples per cell, the seed the samples are drawn from, the
    eviction presses compared at each codec's bytes, the corpus of text haystacks, and whether the
    schemes also run on cells where the exact cache cannot do the task (floors: not a result)."""

    tasks: tuple[str, ...] = DEFAULT_TASKS
    lengths: tuple[int, ...] = (4096,)
    samples: int = 25
    seed: int = 42
    presses: tuple[str, ...] = tuple(PRESSES)
    haystack: str = "embedded"
    floors: bool = False  # also run the schemes where the exact cache is below the floor (else: exact only)

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
              presses: str | None = None, haystack: str | None = None, seed: int | None = None,
              floors: bool | None = None) -> "RulerConfig":
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
        if floors is not None:
            kw["floors"] = _flag(floors, "floors")
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

    def run_and_qualifying(self, length: int) -> tuple[list[str], list[str]]:
        """The tasks the exact cache answered at ``length``, and those of them it qualifies on."""
        tasks = [t for t in self.tasks() if self.scores(EXACT, t, length)]
        return tasks, [t for t in tasks if self.qualifies(t, length)]

    def average(self, scheme: str, length: int, qualifying_only: bool = False) -> tuple[float, float, float]:
        """RULER's average over tasks at one length (kvpress's leaderboard number), with its CI."""
        tasks = [t for t in self.tasks() if self.scores(EXACT, t, length)
                 and (not qualifying_only or self.qualifies(t, length))]
        per_task = [self.scores(scheme, t, length) for t in tasks]
        if not all(per_task):  # a floor the scheme was not run on: no average over all tasks
            return math.nan, math.nan, math.nan
        return average(per_task)

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
        """'ruler 4096, 2 of 5 tasks qualify: exact 92.0 [86.0, 97.0], int4 90.0 ..., knorm@int4 31.2 ...'
        (averages over the qualifying tasks: where the schemes are compared)."""
        out = []
        for n in self.lengths:
            tasks, q = self.run_and_qualifying(n)
            head = f"ruler {n}, {len(q)} of {len(tasks)} tasks qualify"
            if not q:
                out.append(head + f" (the exact cache's average {self.average(EXACT, n)[0]:.1f})")
                continue
            parts = []
            for name in self.schemes:
                acc, lo, hi = self.average(name, n, qualifying_only=True)
                parts.append(f"{name} {acc:.1f}" + (f" [{lo:.1f}, {hi:.1f}]" if not math.isnan(lo) else ""))
            out.append(head + ": " + ", ".join(parts))
        return "; ".join(out) + (f" ({'; '.join(self.notes)})" if self.notes else "")

    def headline(self) -> str:
        """Per length, in a line: the qualifying tasks, and on them the exact cache's average and the
        range of the codecs' and the presses' (the summary names every cache)."""
        out = []
        for n in self.lengths:
            tasks, q = self.run_and_qualifying(n)
            line = f"At {n} tokens {len(q)} of {len(tasks)} tasks qualify" + (f" ({', '.join(q)})" if q else "")
            if q:
                line += f": the exact cache averages {self.average(EXACT, n, True)[0]:.0f} % on them"
                for kind, what in (("kvq", "the quantized caches"), ("evict", "the evicted ones")):
                    v = [self.average(m, n, True)[0] for m, meta in self.schemes.items() if meta["kind"] == kind]
                    v = [x for x in v if not math.isnan(x)]
                    if v:
                        line += f", {what} {min(v):.0f} to {max(v):.0f} %"
            out.append(line + ".")
        return " ".join(out)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RulerResult":
        """Back from ``to_dict`` (a report renders a saved run without recomputing it)."""
        return cls(d["config"], list(d["lengths"]),
                   {k: [RulerAnswer(**a) for a in v] for k, v in d["answers"].items()}, d["schemes"],
                   list(d.get("notes", [])), dict(d.get("timing", {})))

    @classmethod
    def merge(cls, results: list["RulerResult"]) -> "RulerResult":
        """Runs of different lengths, tasks or schemes as one result (a grid run piece by piece): their
        schemes in order of appearance. Where runs overlap they must agree: a (task, length) cell in
        several runs has the same samples and the same exact-cache answers in each (one seed), and an
        answer two runs both hold is the same answer (ValueError otherwise). The runs' presses may
        differ (codecs added with ``--ruler-presses none``): a press is a scheme of its own, compared
        where it ran, and the merged config lists every press of the runs."""
        if not results:
            raise ValueError("no RULER results to merge")
        for key in ("model", "seed", "haystack", "floors"):
            values = {repr(r.config.get(key)) for r in results}
            if len(values) > 1:
                raise ValueError(f"RULER results of different {key} ({', '.join(sorted(values))}) do not merge")
        samples: dict[tuple[str, int], tuple[int, set[int]]] = {}
        for i, r in enumerate(results):
            for t, n in dict.fromkeys((a.task, a.length) for a in r.answers.get(EXACT, [])):
                got = {a.index for a in r.answers[EXACT] if a.task == t and a.length == n}
                j, before = samples.setdefault((t, n), (i, got))
                if got != before:
                    raise ValueError(f"{t} at {n}: results {j + 1} and {i + 1} hold different samples "
                                     f"({len(before)} and {len(got)}): cells merge only over the same samples")
        schemes, alias, kept_apart = _merged_schemes(results)
        answers: dict[str, list[RulerAnswer]] = {}
        for k in schemes:
            kept: dict[tuple[str, int, int], tuple[int, RulerAnswer]] = {}
            for i, r in enumerate(results):
                for a in (a for name in alias[k] for a in r.answers.get(name, [])):
                    j, first = kept.setdefault((a.task, a.length, a.index), (i, a))
                    if (first.answer, first.score) != (a.answer, a.score):
                        raise ValueError(f"{k} on {a.task} at {a.length}, sample {a.index}: results {j + 1} and "
                                         f"{i + 1} answer differently ({first.answer!r}, {a.answer!r})")
            answers[k] = [a for _, a in kept.values()]
        config = dict(results[0].config)
        tasks = dict.fromkeys(t for r in results for t in r.config["tasks"])
        config["tasks"] = sorted(tasks, key=lambda t: (list(TASKS).index(t) if t in TASKS else len(TASKS)))
        config["lengths"] = lengths = sorted({n for r in results for n in r.lengths})
        config["presses"] = list(dict.fromkeys(p for r in results for p in r.config.get("presses", ())))
        keys = dict.fromkeys(k for r in results for k in r.timing)
        timing = {k: (max if k.startswith("peak") else sum)(r.timing.get(k, 0.0) for r in results)
                  for k in keys}  # times add up, a peak is the largest
        notes = list(dict.fromkeys([n for r in results for n in r.notes] + kept_apart))
        return cls(config, lengths, answers, schemes, notes, timing)

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "lengths": self.lengths, "schemes": self.schemes, "notes": self.notes,
                "timing": self.timing, "exact_floor": RULER_EXACT_FLOOR, "table": self.table(),
                "averages": {name: {str(n): self.average(name, n) for n in self.lengths} for name in self.schemes},
                "averages_qualifying": {name: {str(n): self.average(name, n, True) for n in self.lengths}
                                        for name in self.schemes},
                "answers": {k: [asdict(a) for a in v] for k, v in self.answers.items()}, "summary": self.summary()}


def _merged_schemes(results: list["RulerResult"]) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]], list[str]]:
    """The schemes of several runs (the exact cache, the quantized, the evicted, each in order of
    appearance), each one's names in them, and a note for each press kept twice. A press at the same
    bytes is one peer whichever codec named it in each run ('knorm@kivi4' in a run added to one with
    'knorm@q4_0', both keeping 71.9 %): the first name, the codecs it is compared to joined, where
    the runs answer alike wherever both answered; where they do not (a batch of other caches rounds
    differently), both stay, each with its own codecs."""
    schemes: dict[str, dict[str, Any]] = {}
    alias: dict[str, list[str]] = {}
    notes: list[str] = []
    first: dict[str, tuple[str, int]] = {}  # a press's spec -> its first name and run
    for i, r in enumerate(results):
        for k, v in r.schemes.items():
            name = k
            if v["kind"] == "evict":
                seen, j = first.setdefault(v["spec"], (k, i))
                if seen != k:
                    differ = _differing(results[j].answers.get(seen, []), r.answers.get(k, []))
                    if differ:
                        notes.append(f"{seen} and {k} (both {v['spec']}) answer {differ} of the samples both "
                                     f"hold differently (runs {j + 1} and {i + 1}: a batch of other caches rounds "
                                     f"differently), so they stay two rows")
                    else:
                        name = seen
            if name not in schemes:
                schemes[name], alias[name] = dict(v), [name]
            elif k not in alias[name]:
                alias[name].append(k)
            if v["kind"] == "evict" and name != k:
                at = dict.fromkeys(c.strip() for m in (schemes[name], v) for c in m["compared_to"].split(","))
                schemes[name]["compared_to"] = ", ".join(c for c in at if c)
    order = {"exact": 0, "kvq": 1, "evict": 2}  # the caches before their peers, whichever run added them
    schemes = dict(sorted(schemes.items(), key=lambda kv: order.get(kv[1]["kind"], 1)))
    return schemes, alias, notes


def _differing(a: list[RulerAnswer], b: list[RulerAnswer]) -> int:
    """How many samples two lists of answers both hold and answer differently."""
    held = {(x.task, x.length, x.index): (x.answer, x.score) for x in a}
    return sum(1 for x in b if (key := (x.task, x.length, x.index)) in held and held[key] != (x.answer, x.score))


ANSWER_FIELDS = ("answer", "score", "seconds", "cache_bytes")  # a unit's body


def stop_tokens(config: Any, tokenizer: Any) -> tuple[int, ...]:
    """The tokens an answer ends at: the model's EOS ids (config), else the tokenizer's."""
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    return tuple(sorted(set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])))


def _held_bytes(layers: list[tuple[Any, Any]]) -> int:
    """The bytes (key, value) tensors take in memory, in their own dtype."""
    return sum(t.numel() * t.element_size() for kv in layers for t in kv)


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


def eviction_peers(config: RulerConfig, codecs: list[CodecConfig]) -> dict[str, tuple[Any, list[str]]]:
    """Each press at each codec's bytes (kvpress's compression ratio 1 − bits/16), once per distinct
    ratio: 'press@codec' (the first codec of those bytes) → (press, every codec of those bytes)."""
    by_ratio: dict[float, list[str]] = {}
    for c in codecs:
        by_ratio.setdefault(ratio_at_bits(nominal_bits(c.spec)), []).append(c.name)
    return {f"{p}@{names[0]}": (make_press(p, ratio), names) for ratio, names in by_ratio.items()
            for p in config.presses}


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


def describe_schemes(codecs: list[CodecConfig], transforms: dict[str, Any],
                     presses: dict[str, tuple[Any, list[str]]]) -> dict[str, dict]:
    """Each cache's kind, spec and bits, the exact cache first, then the codecs', then the presses'."""
    schemes: dict[str, dict[str, Any]] = {EXACT: {"kind": "exact", "spec": "exact", "bits": 16.0}}
    by_name = {c.name: c for c in codecs}
    for name, t in transforms.items():  # the codecs' round trips (or what a test gives instead)
        c = by_name.get(name)
        schemes[name] = {"kind": getattr(t, "kind", "transform"), "spec": c.spec if c else name,
                         "bits": nominal_bits(c.spec) if c else math.nan}
    for name, (p, at) in presses.items():
        schemes[name] = {"kind": "evict", "spec": p.spec, "bits": 16 * p.keep, "compared_to": ", ".join(at)}
    return schemes


def run_ruler(model: Any, tokenizer: Any, codecs: list[CodecConfig], workdir: str | Path, config: RulerConfig,
              haystack_text: str, model_name: str = "unknown", max_context: int | None = None,
              transforms: dict[str, Any] | None = None, progress: bool = False,
              units: CheckUnits | None = None, executor: Callable[..., "Runner"] | None = None) -> RulerResult:
    """Every sample of ``config``, answered by the exact cache, each codec's reconstruction and each
    press's eviction; ``transforms`` replaces the codecs (tests pass an identity). ``executor``
    makes the runner from Runner's fields (kvlib.checks.ruler.remote's on Ray; default in process)."""
    units = units or CheckUnits(None, None, "ruler")
    lengths, notes = plan_lengths(config, max_context or getattr(model.config, "max_position_embeddings", None))
    env = Environment(haystack_text, config.haystack)
    cells = plan_cells(config, tokenizer, lengths, env, notes)
    if transforms is None:
        transforms, _ = cache_transforms(codecs, Path(workdir), model_name)
    presses = eviction_peers(config, codecs)
    schemes = describe_schemes(codecs, transforms, presses)
    every = {**transforms, **{k: p for k, (p, _) in presses.items()}}
    specs = {EXACT: "exact", **{k: unit_key_of(t) or k for k, t in every.items()}}
    answers: dict[str, list[RulerAnswer]] = {k: [] for k in schemes}
    Path(workdir).mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="prefills-", dir=workdir) as spill:  # this run's own
        runner = (executor or Runner)(model, tokenizer, units, every, specs, stop_tokens(model.config, tokenizer),
                                      notes, progress, Path(spill))
        try:
            for n, task in cells:
                _run_cell(runner, n, task, config, env, list(schemes), answers)
        finally:
            runner.close()
    for name in runner.refused:
        schemes.pop(name, None)
        answers.pop(name, None)
    return RulerResult(asdict(config), lengths, answers, schemes, notes,
                       {"prefill_s": runner.prefill_s, "total_s": time.perf_counter() - t_start,
                        **getattr(runner, "seconds", {})})


def _run_cell(runner: "Runner", n: int, task: Any, config: RulerConfig, env: Environment, schemes: list[str],
              answers: dict[str, list[RulerAnswer]]) -> None:
    """One (length, task) cell: the exact cache first, ``runner.width`` samples at a time; only
    where it does the task are the schemes compared (once it is sure to qualify, every cache
    answers from the one prefill of a sample; the samples before wait on their kept prefill)."""
    samples = [task.sample(runner.tokenizer, n, config.seed, i, env) for i in range(config.samples)]
    label = f"ruler {n} {task.name} #"
    known: list[dict[str, dict]] = []
    sure, stop = config.floors, False
    while len(known) < len(samples) and not stop:
        wave = samples[len(known):len(known) + max(1, runner.width)]
        names = [m for m in schemes if m not in runner.refused] if sure else [EXACT]
        for got in runner.answer_all([(s, names, {}, f"{label}{len(known) + j}", not sure)
                                      for j, s in enumerate(wave)]):
            known.append(got)  # sample by sample, as one at a time would: a wave stops where it would have
            scores = [k[EXACT]["score"] for k in known]
            stop = not config.floors and ruler_out_of_reach(scores, len(samples))
            if stop:
                break
            sure = sure or ruler_sure(scores, len(samples))
    exact = accuracy([k[EXACT]["score"] for k in known])[0]
    stopped = "" if len(known) == len(samples) else (
        f" on {len(known)} of {len(samples)} samples: a score of 1 on the rest could not lift it to "
        f"{RULER_EXACT_FLOOR:.0f} %")
    if config.floors or ruler_qualifies(exact):
        names = [m for m in schemes if m not in runner.refused]
        known = runner.answer_all([(s, names, k, f"{label}{i}", False)
                                   for i, (s, k) in enumerate(zip(samples, known))])
    else:
        runner.notes.append(f"{task.name} at {n}: a floor (the exact cache {exact:.0f} %{stopped}), the schemes not "
                            "run on it (--ruler-floors runs them)")
    runner.forget()
    for i, (s, got) in enumerate(zip(samples, known)):
        for name, body in got.items():
            answers[name].append(RulerAnswer(s.task, n, i, **{k: body[k] for k in ANSWER_FIELDS}))


Request = tuple  # (sample, names, known answers, progress label, keep the prefill)


def unit_inputs(s: Sample, stop: tuple[int, ...]) -> str:
    """What a sample's units are keyed by: everything its answers depend on besides the cache."""
    return digest([s.context, s.question, s.references, s.max_new_tokens, s.metric, list(stop)])


@dataclass
class Runner:
    """Answers of one sample from the store, or computed: the context prefilled once for every
    cache missing, each unit put in the store as it is made. A prefill asked to be kept waits in
    ``spill`` (a directory) for the sample's next call: the exact cache answers first, and the
    schemes, if the cell qualifies, later from the same prefill instead of a second one."""

    model: Any
    tokenizer: Any
    units: CheckUnits
    every: dict[str, Any]  # scheme name -> codec round trip or press
    specs: dict[str, str]  # scheme name -> its unit key
    stop: tuple[int, ...]
    notes: list[str]
    progress: bool = False
    spill: Path | None = None  # a directory of this run's own
    spilled: int = 0  # bytes kept there now
    refused: dict[str, str] = field(default_factory=dict)  # a press that cannot evict this layout, and why
    prefill_s: float = 0.0

    def _prefilled(self, model: Any, s: Sample, inputs: str, keep: bool) -> tuple[Any, list[Any]]:
        """The sample's exact cache and observed queries: kept from its last call, or prefilled
        (and kept, bit for bit, when ``keep``)."""
        path = self.spill / f"{inputs}.pt" if self.spill is not None else None
        if path is not None and path.exists():
            d = torch.load(path, weights_only=True)
            path.unlink()
            self.spilled -= _held_bytes(d["layers"])
            return make_cache(d["layers"], CacheLayout.from_string(d["windows"], d["seen"])), d["queries"]
        t0 = time.perf_counter()
        cache, queries = prefill_observed(model, s.context, SnapKV.window)
        self.prefill_s += time.perf_counter() - t0
        layers = cache_layers(cache)
        size = _held_bytes(layers)
        if keep and path is not None and self.spilled + size <= SPILL_BYTES:
            layout = layout_of(cache)  # contiguous copies: a sliding layer's keys are views of more
            torch.save({"layers": [(k.contiguous(), v.contiguous()) for k, v in layers],
                        "windows": layout.to_string(), "seen": layout.seen, "queries": queries}, path)
            self.spilled += size
        return cache, queries

    def forget(self) -> None:
        """Drop every kept prefill (at the end of a cell: what is left is not needed)."""
        if self.spill is not None:
            for f in self.spill.glob("*.pt"):
                f.unlink()
        self.spilled = 0

    width: int = 1  # samples answered at once (one: in this process; a Ray executor's workers)

    def stored(self, s: Sample, names: list[str], known: dict[str, dict]) -> dict[str, dict]:
        """``known`` and the answers of ``names`` the results store has (a press refused left out)."""
        inputs = unit_inputs(s, self.stop)
        got = dict(known)
        for name in names:
            if name not in got and name not in self.refused and self.specs.get(name):
                body = self.units.get(inputs, self.specs[name])
                if body is not None:
                    got[name] = body
        return got

    def compute(self, s: Sample, names: list[str], keep: bool = False) -> dict[str, dict]:
        """The answers of ``names`` to ``s`` from one prefill (kept for the next call when ``keep``);
        a press that cannot evict this layout lands in ``refused`` instead."""
        lm = self.model.get() if hasattr(self.model, "get") else self.model  # a LazyModel loads here, once
        cache, queries = self._prefilled(lm, s, unit_inputs(s, self.stop), keep)
        return _answers(lm, self.tokenizer, s, names, self.every, cache, queries, self.stop, self.refused, self.notes)

    def answer(self, s: Sample, names: list[str], known: dict[str, dict], label: str = "",
               keep: bool = False) -> dict[str, dict]:
        """``known`` and the answers of ``names`` to sample ``s`` (a press refused is left out):
        from the store, else computed and stored; ``keep``: keep its prefill for the next call on it."""
        got = self.stored(s, names, known)
        missing = [m for m in names if m not in got and m not in self.refused]
        if missing:
            t0 = time.perf_counter()
            self.record(s, self.compute(s, missing, keep), got, label, time.perf_counter() - t0)
        return got

    def answer_all(self, requests: list[Request]) -> list[dict[str, dict]]:
        """``answer`` for each request, in order (an executor answers them side by side)."""
        return [self.answer(*r) for r in requests]

    def close(self) -> None:
        """End what the runner started (in process: nothing)."""

    def record(self, s: Sample, computed: dict[str, dict], got: dict[str, dict], label: str, seconds: float) -> None:
        """Computed answers into the store and ``got``, and the progress line."""
        inputs = unit_inputs(s, self.stop)
        for name, body in computed.items():
            if self.specs.get(name):  # a transform with no unit key (a test's function) is not stored
                self.units.put(inputs, self.specs[name], body)
            got[name] = body
        if self.progress and computed:
            done = list(computed)
            what = (f"exact {got[EXACT]['score']:.2f} {got[EXACT]['answer'][:40]!r}" if done == [EXACT] else
                    f"{len(done)} caches, mean score {sum(got[m]['score'] for m in done) / max(1, len(done)):.2f}")
            print(f"  {label}: {what} ({seconds:.0f} s)", flush=True)


def _build(transform: Any, cache: Any, queries: Any) -> tuple[Any, int]:
    """A scheme's context cache from the sample's exact one (left untouched), and its bytes."""
    if transform is None:  # the exact cache itself: decoding appends to the batch it is copied into
        return cache, _exact_bytes(cache)
    if getattr(transform, "kind", "") == "evict":
        evicted, m = transform(cache, queries)
        return evicted.cache, m.bytes_bf16
    c, m = transform(cache)
    return c, int(getattr(m, "compressed_size_bytes", 0) or 0)


def decode_groups(caches: dict[str, Any], padded: bool = True) -> list[list[str]]:
    """The batches the caches decode in: one, padded, when every layer attends to the full context
    and ``padded`` batches can run (an eviction's shorter cache masked beside the exact one's: the
    model's weights are read once per token for all); else one per cache length."""
    if padded and not any(layout_of(c).sliding for c in caches.values()):
        return [list(caches)] if caches else []
    groups: dict[int, list[str]] = {}
    for name, c in caches.items():
        groups.setdefault(cache_layers(c)[0][0].shape[2], []).append(name)
    return list(groups.values())


def decode_chunks(names: list[str], every: dict[str, Any], row_bytes: int,
                  budget: int = DECODE_BATCH_BYTES) -> list[list[str]]:
    """The caches of one sample in the chunks they are built and decoded in, so that the caches
    alive at once stay within ``budget`` bytes (each chunk's rows padded to its longest): the
    full-length ones (the exact cache, the codecs') first, then the presses' by tokens kept."""
    full = [n for n in names if getattr(every.get(n), "kind", "") != "evict"]
    evicted = sorted((n for n in names if n not in full), key=lambda n: -every[n].keep)
    chunks: list[list[str]] = []
    for group in (full, evicted):
        chunk: list[str] = []
        for n in group:
            width = row_bytes * (every[n].keep if n in evicted else 1.0)
            longest = max([width] + [row_bytes * (every[m].keep if m in evicted else 1.0) for m in chunk])
            if chunk and longest * (len(chunk) + 1) * 2 > budget:  # the caches and their padded batch
                chunks.append(chunk)
                chunk = []
            chunk.append(n)
        if chunk:
            chunks.append(chunk)
    return chunks


def _answers(model: Any, tokenizer: Any, s: Sample, names: list[str], every: dict[str, Any], cache: Any,
             queries: Any, stop: tuple[int, ...], refused: dict[str, str], notes: list[str]) -> dict[str, dict]:
    """The answers of ``names`` to one sample, chunk by chunk (``decode_chunks``: memory bounded):
    each chunk's caches built, then decoded in ``decode_groups``' batches. A press that cannot
    evict this layout is refused (named in ``notes``) and left out."""
    row_bytes = _held_bytes(cache_layers(cache))
    out: dict[str, dict] = {}
    for chunk in decode_chunks(names, every, row_bytes):
        out.update(_answer_chunk(model, tokenizer, s, chunk, every, cache, queries, stop, refused, notes))
    return {n: out[n] for n in names if n in out}


def _answer_chunk(model: Any, tokenizer: Any, s: Sample, names: list[str], every: dict[str, Any], cache: Any,
                  queries: Any, stop: tuple[int, ...], refused: dict[str, str], notes: list[str]) -> dict[str, dict]:
    """One chunk's caches built and decoded."""
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
    for group in decode_groups({n: c for n, (c, _, _) in built.items()}, padded_batches(model)):
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
    return out

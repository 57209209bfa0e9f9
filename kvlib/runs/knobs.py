"""Budgets over the knobs an engine really has: the cheapest setting of them that passes, measured
in write mode (as the engine writes its cache), printed as the flags to pass.

An engine's knobs are a class in ``KNOBS``: it lists its settings, each a kv-compress spec with the
engine's flags and its nominal bits per element. The search validates them in order of bits, a
level of equal bits at a time (one sweep each, so the results store keeps every unit), and stops at
the first level where one passes robustly (the CI's upper bound under the gate): the cheapest
robust setting. Settings past that level are never run. A search that picks the first of many noisy
intervals to fall under the gate favours a lucky one, so a robust pass is the answer only once it
passes robustly again on fresh windows (``confirm``: windows past every one the search read); one
that does not is kept as unconfirmed and the search goes on.

llama.cpp (``-ctk``/``-ctv``, llama.cpp 0c1e57098 as vendored by llama-cpp-python 0.3.36:
``common/arg.cpp`` takes one cache type for K and one for V, applied to every layer): every
pair of its types, f16 included.

vLLM (0.33.0, ``engine/arg_utils.py``): ``--kv-cache-dtype X`` quantizes every layer but those
``--kv-cache-dtype-skip-layers`` names, which keep the model's dtype (``VllmSkipLayers``): for one
format X, "skip the k layers X damages most", k = 0, 1, ... L, the layers ranked by the
sensitivity pass (``kvlib.budget``). A TurboQuant preset always skips its boundary layers
(``TurboQuantConfig.get_boundary_skip_layers``); ``boundary_check`` measures that fixed rule
against the ranking over every layer.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from kvlib.budget.plan import calibration_tokens, sensitivity_table
from kvlib.codec.spec import engine_menu, resolve_codec
from kvlib.gates import PPL_DELTA_THRESHOLD
from kvlib.runs.engines import MODEL_DTYPE_BITS
from kvlib.runs.setup import RunParams, prepare_run
from kvlib.runs.sweep import AllRefused, model_geometry



@dataclass(frozen=True)
class Setting:
    """One setting of an engine's knobs."""

    spec: str  # the kv-compress spec that computes it
    flags: str  # as the engine takes it
    bits: float  # nominal bits per element, keys and values averaged
    skipped: tuple[int, ...] | None = None  # the layers kept at the model's dtype, where the knob picks layers


class LlamaCppTypes:
    """llama.cpp's ``-ctk TYPE -ctv TYPE``: any pair of its cache types."""

    engine = "llama.cpp"

    def settings(self) -> list[Setting]:
        menu = engine_menu(self.engine)
        types = [(r["format"], r["name"], r["key_bits_per_element"]) for r in menu]
        pairs = []
        for (kf, kname, kbits), (vf, vname, vbits) in itertools.product(types, types):
            spec = kname if kname == vname else f"k={kname},v={vname}"
            pairs.append((Setting(spec, f"-ctk {kf} -ctv {vf}", (kbits + vbits) / 2), kbits))
        # fewer bits first; at equal bits the pair with the finer keys (keys cost more than values
        # on every model measured), then the engine's own order
        return [st for st, _ in sorted(pairs, key=lambda p: (p[0].bits, -p[1]))]


def vllm_format(fmt: str) -> dict[str, Any]:
    """The row of ``kv-compress schemes -engine vllm`` for ``fmt``, by its ``--kv-cache-dtype`` value
    (fp8) or its kv-compress name (vllm:fp8); ValueError naming the formats."""
    menu = engine_menu("vllm")
    for row in menu:
        if fmt in (row["format"], row["name"]):
            return row
    raise ValueError(f"vllm format {fmt!r}: choose one of {', '.join(r['format'] for r in menu)}")


def layer_ranges(layers: Sequence[int]) -> list[str]:
    """Sorted layers as runs: [0, 1, 2, 5] -> ["0-2", "5"]."""
    out: list[str] = []
    for _, run in itertools.groupby(enumerate(sorted(layers)), key=lambda p: p[1] - p[0]):
        xs = [x for _, x in run]
        out.append(str(xs[0]) if len(xs) == 1 else f"{xs[0]}-{xs[-1]}")
    return out


def layer_damage(sens: Any, candidate: int = 0) -> list[float]:
    """Each layer's damage under one candidate of a sensitivity table (``kvlib.budget.Sensitivity``):
    its key slot's cost plus its value slot's (mean KL per target, each slot priced alone; an engine
    skips K and V of a layer together, and the slots' costs add up to first order, as the budget's
    allocation assumes and ``measure_mix`` checks)."""
    return [float(roles[0][candidate] + roles[1][candidate]) for roles in sens.kl]


def rank_layers(damage: Sequence[float], among: Sequence[int] | None = None) -> list[int]:
    """The layers (``among``, default all) most damaging first; ties by layer index."""
    layers = range(len(damage)) if among is None else among
    return sorted(layers, key=lambda i: (-damage[i], i))


class VllmSkipLayers:
    """vLLM's ``--kv-cache-dtype X --kv-cache-dtype-skip-layers i j ...`` for one format X: skip the
    k layers X damages most, for k = 0 to every layer, each skipped layer at the model's dtype
    (16 bits), so a setting's bits are the layer-weighted average.

    Which layers damage most is measured, not assumed: ``measure(spec_for)`` runs the sensitivity
    pass (``kvlib.budget``: each slot's KL when only it is compressed) on the spec
    ``spec_for(num_layers)`` returns, X on every layer, and returns its table; a layer's damage is
    its K and V slots' costs added (``layer_damage``). A TurboQuant preset keeps its boundary layers
    (the first and last two) exact whatever the flags say, so its settings add the k most damaging
    of the other layers to those, and the pass prices it on every layer (``measured_spec``) so that
    ``boundary_check`` can rank the boundary layers too.

    The search (``cheapest_setting``) validates the settings fewest bits first, ``per_sweep`` of
    them (each its own level of bits) in one sweep, and stops after the first sweep holding a robust
    pass; the answer is the fewest skips that pass. A scan, not a bisection on k: whether "skip the
    k most damaging" passes need not be monotone in k (single-layer costs ignore the layers'
    interactions, and a robust verdict is a CI's bound that moves with the windows), and a bisection
    would return a k with failing settings above it left unseen below it; the scan has run, and
    failed, every cheaper setting. Batching several k in a sweep costs at most ``per_sweep - 1``
    settings past the answer (reported, not chosen) for a fraction of the sweeps."""

    engine = "vllm"
    takes_format = True
    per_sweep = 4

    def __init__(self, fmt: str, measure: Callable[[Callable[[int], str]], Any], per_sweep: int | None = None) -> None:
        row = vllm_format(fmt)
        self.format, self.name, self.flag = row["format"], row["name"], row["flags"]
        self.quantized_bits = (float(row["key_bits_per_element"]) + float(row["value_bits_per_element"])) / 2
        self.boundary = int(row.get("boundary_layers") or 0)
        self.codec = resolve_codec(self.name)
        self.per_sweep = per_sweep or self.per_sweep
        self._measure = measure
        self._damage: list[float] | None = None

    @property
    def label(self) -> str:
        return f"{self.flag} --kv-cache-dtype-skip-layers"

    def measured_spec(self, num_layers: int) -> str:
        """What the sensitivity pass prices: X on every one of ``num_layers`` layers. A format with a
        boundary rule keeps those layers exact whatever its default's overrides say (an override equal
        to the default is no override), so its default is ``none`` and every layer overrides it."""
        if not self.boundary:
            return self.codec.spec
        every = f"0-{num_layers - 1}" if num_layers > 1 else "0"
        return f"none,k{every}={self.codec.key.spec},v{every}={self.codec.value.spec}"

    def damage(self) -> list[float]:
        """Each layer's measured damage under X (measured once)."""
        if self._damage is None:
            self._damage = layer_damage(self._measure(self.measured_spec))
        return self._damage

    @property
    def num_layers(self) -> int:
        return len(self.damage())

    def rule(self) -> list[int]:
        """The layers vLLM skips for X whatever the flags say: a TurboQuant preset's first and last
        min(2, L/2) (kv-compress's rule, ``withEngineSkips``); none for the other formats."""
        n = min(self.boundary, self.num_layers // 2)
        return sorted(set(range(n)) | set(range(self.num_layers - n, self.num_layers)))

    def ranking(self) -> list[int]:
        """The layers the flag may skip, most damaging first."""
        fixed = set(self.rule())
        return rank_layers(self.damage(), [i for i in range(self.num_layers) if i not in fixed])

    def bits(self, skipped: int) -> float:
        n = self.num_layers
        return ((n - skipped) * self.quantized_bits + skipped * MODEL_DTYPE_BITS) / n

    def flags(self, extra: Sequence[int]) -> str:
        return self.flag + (" --kv-cache-dtype-skip-layers " + " ".join(map(str, sorted(extra))) if extra else "")

    def spec(self, extra: Sequence[int]) -> str:
        """X with ``extra`` layers skipped (``kvN=none``; the rule's layers are X's own)."""
        return self.name + "".join(f",kv{r}=none" for r in layer_ranges(extra))

    def settings(self) -> list[Setting]:
        fixed, order = self.rule(), self.ranking()
        return [Setting(self.spec(order[:k]), self.flags(order[:k]), self.bits(len(fixed) + k),
                        tuple(sorted(fixed + order[:k]))) for k in range(len(order) + 1)]


class MeasuredSkips:
    """Not an engine's knob: "skip the k layers X damages most" over *every* layer, the boundary rule
    set aside, to check that rule against the measurement (``boundary_check``). A skip set holding the
    rule's layers is a vLLM setting (X's own spec and flags, the same units as ``VllmSkipLayers``');
    one that quantizes a boundary layer is not (its flags say so), and is spelled ``none`` with X's K and
    V as per-layer overrides on the layers it quantizes (kv-compress and the write path apply the rule only where
    the default is a format that has one; ``kvlib/transforms/engine.py``)."""

    def __init__(self, knob: VllmSkipLayers) -> None:
        self.knob = knob
        self.engine = knob.engine
        self.per_sweep = knob.per_sweep
        self.label = f"{knob.format}, any layers skipped (the rule set aside)"

    def ranking(self) -> list[int]:
        return rank_layers(self.knob.damage())

    def setting(self, skipped: Sequence[int]) -> Setting:
        k, n = self.knob, self.knob.num_layers
        skip, fixed = sorted(skipped), set(self.knob.rule())
        if fixed <= set(skip):
            extra = [i for i in skip if i not in fixed]
            return Setting(k.spec(extra), k.flags(extra), k.bits(len(skip)), tuple(skip))
        kept = [i for i in range(n) if i not in set(skip)]
        spec = "none" + "".join(f",k{r}={k.codec.key.spec}" for r in layer_ranges(kept)) + "".join(
            f",v{r}={k.codec.value.spec}" for r in layer_ranges(kept))
        flags = "(not a vLLM setting) skip " + (" ".join(map(str, skip)) if skip else "none")
        return Setting(spec, flags, k.bits(len(skip)), tuple(skip))

    def settings(self) -> list[Setting]:
        order = self.ranking()
        return [self.setting(order[:k]) for k in range(len(order) + 1)]


KNOBS: dict[str, Callable[..., Any]] = {"llama.cpp": LlamaCppTypes, "vllm": VllmSkipLayers}


def make_knob(engine: str, fmt: str | None = None, measure: Callable[..., Any] | None = None) -> Any:
    """``engine``'s knobs; a knob over one of the engine's formats (vLLM's skipped layers) takes
    ``fmt`` and the sensitivity pass ``measure`` (ValueError naming what is missing or unknown)."""
    if engine not in KNOBS:
        raise ValueError(f"engine {engine!r}: knob search knows {', '.join(KNOBS)}")
    cls = KNOBS[engine]
    if getattr(cls, "takes_format", False):
        if not fmt:
            raise ValueError(f"{engine}'s knob needs a format (--knob-format: "
                             f"{', '.join(r['format'] for r in engine_menu(engine))})")
        return cls(fmt, measure)
    if fmt:
        raise ValueError(f"{engine}'s knobs take no format (--knob-format is for vllm)")
    return cls()


def format_sensitivity(spec_for: Callable[[int], str], *, model: str, corpus_name: str, device: str | None,
                       dtype: str | None, stride: int, max_windows: int | None, context_length: int | None,
                       results: Any, fresh: bool, calibration: Any, verbose: bool = True,
                       spans: list[tuple[int, int]] | None = None) -> Any:
    """The sensitivity pass (``kvlib.budget``) on one format alone, for a knob's ranking: the spec
    ``spec_for(L)`` gives for the model's L layers, priced per (layer, role) slot on the calibration
    windows (``calibration``: a CalibrationConfig, its candidates replaced by that spec; windows, as
    a write-mode budget takes them, never overlapping the evaluated ones). A results-store unit.
    ``spans`` gets the token spans the calibration read of the evaluated corpus (none from another
    corpus): what a confirmation's fresh windows must not score."""
    import dataclasses
    import tempfile


    run = prepare_run(RunParams(model, corpus_name, device, dtype, PPL_DELTA_THRESHOLD, stride, max_windows,
                                context_length, results, fresh), verbose)
    codec = resolve_codec(spec_for(model_geometry(run)["num_layers"]))
    cfg = dataclasses.replace(calibration, candidates=(codec.spec,))
    span = max(run.context_length, cfg.targets + 1)
    cal = calibration_tokens(cfg, run.text, run.ids, run.tokenizer, span, stride, max_windows,
                             evaluated_length=run.context_length)
    if spans is not None and cal.ids is run.ids:
        spans.extend((start, start + span) for start in cal.starts)
    with tempfile.TemporaryDirectory(prefix="kvlib-knobs-") as tmp:
        sens, _ = sensitivity_table(run.load, cfg, cal, span, tmp, run.name, run.store, run.identity, run.say,
                                    codecs=[codec])
    return sens


@dataclass
class KnobSearch:
    """The settings validated, in order, and the cheapest that passes robustly (None: none did)."""

    engine: str
    mode: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    cheapest: dict[str, Any] | None = None
    untried: int = 0  # settings above the level where the search stopped, never run
    knob: str = ""  # which of the engine's knobs, where it has several (vLLM: the format's skipped layers)
    past: int = 0  # settings costlier than the answer's level that ran in its sweep (their rows are kept)
    threshold: float = PPL_DELTA_THRESHOLD  # the gate the sweeps judged by
    max_bits: float = 16.0  # the search's bound: costlier settings are not run
    # each robust pass re-validated on fresh windows, in order (rows with the windows scored); empty
    # when the search ran without confirmation
    confirmations: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def levels(settings: list[Setting]) -> list[list[Setting]]:
    """The settings grouped by equal bits, fewest first."""
    return [list(g) for _, g in itertools.groupby(settings, key=lambda s: s.bits)]


def _row(st: Setting, r: Any) -> dict[str, Any]:
    """A validated setting: its bits as the engine stores them (a layer vLLM skips keeps the model's
    16-bit dtype), what kvlib's reconstruction stored (a skipped layer in the source dtype: 32 bits
    on a float32 CPU run), and the quality."""
    row = {"flags": st.flags, "spec": st.spec, "bits_per_element": st.bits,
           "stored_bits_per_element": r.bits_per_element,
           "context_delta": r.context_delta, "ci_low": r.ci_low, "ci_high": r.ci_high,
           "kld_mean": r.kld_mean, "robust": r.robust, "passed": r.passed}
    if st.skipped is not None:
        row["skipped"] = list(st.skipped)
    if getattr(r, "error", ""):  # the engine refuses the setting for this model (kvlib.codec.preflight)
        row["unavailable"] = r.error
    return row


def _confirmation(row: dict[str, Any], confirm: Callable[[list[str]], Any], say: Callable[..., None]) -> dict[str, Any]:
    """A robust pass re-validated by ``confirm`` (a sweep over fresh windows): its row there."""
    result = confirm([row["spec"]])
    r = {s.name: s for s in result.schemes}[resolve_codec(row["spec"]).name]
    out = {"flags": row["flags"], "spec": row["spec"], "first_window": result.first_window,
           "windows": result.windows, "context_delta": r.context_delta, "ci_low": r.ci_low,
           "ci_high": r.ci_high, "kld_mean": r.kld_mean, "robust": r.robust, "passed": r.passed}
    say(f"  confirming {row['flags']} on {result.windows} fresh windows (from window {result.first_window}): "
        f"delta {r.context_delta:+.4f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}], {_verdict(out)}")
    return out


def cheapest_setting(engine: str, sweep: Callable[[list[str]], Any], say: Callable[..., None] = print,
                     max_bits: float = 16.0, knob: Any = None,
                     confirm: Callable[[list[str]], Any] | None = None) -> KnobSearch:
    """Validate the settings of ``engine``'s knob (``knob``, default ``KNOBS[engine]()``) fewest bits
    first with ``sweep`` (a list of specs -> a SweepResult in write mode), ``per_sweep`` levels of
    equal bits a sweep (the knob's; one by default), until one passes robustly: with ``confirm`` (the
    same on fresh windows), robustly there too; a level's robust passes are confirmed fewest bits,
    then smallest delta, first."""
    knob = make_knob(engine) if knob is None else knob
    name = engine
    every = knob.settings()
    settings = [s for s in every if s.bits <= max_bits]
    if not settings:
        raise ValueError(f"--max-bits {max_bits:g}: every setting of {engine}'s knob stores more "
                         f"(the cheapest {min(s.bits for s in every):g} bits/element)")
    found = KnobSearch(name, "write", knob=getattr(knob, "label", ""), max_bits=max_bits,
                       untried=len(every) - len(settings))
    groups = levels(settings)
    step = max(1, int(getattr(knob, "per_sweep", 1)))
    for i in range(0, len(groups), step):
        batch = groups[i:i + step]
        ran = [st for g in batch for st in g]
        bits = f"{batch[0][0].bits:g}" + (f" to {batch[-1][0].bits:g}" if len(batch) > 1 else "")
        say(f"{name}: {len(ran)} setting(s) at {bits} bits/element: " + "; ".join(s.flags for s in ran))
        try:
            result = sweep([s.spec for s in ran])
            found.mode, found.threshold, schemes = result.mode, result.threshold, result.schemes
        except AllRefused as e:  # the engine refuses every setting of these levels for this model: rows say why
            schemes = e.rows
        by_name = {s.name: s for s in schemes}
        rows = [_row(st, by_name[resolve_codec(st.spec).name]) for st in ran]
        found.rows.extend(rows)
        for r in rows:  # as each sweep ends: a long search shows what it has found so far
            say(f"  {r['flags']}: {r['bits_per_element']:.3f} bits, delta {r['context_delta']:+.4f} "
                f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}], {_verdict(r)}")
        at = 0
        for g in batch:
            ok = sorted((row for row in rows[at:at + len(g)] if row["robust"]),
                        key=lambda row: (row["bits_per_element"], row["context_delta"]))
            at += len(g)
            for row in ok:
                if confirm is not None:
                    found.confirmations.append(_confirmation(row, confirm, say))
                    row["confirmed"] = found.confirmations[-1]["robust"]
                    if not row["confirmed"]:
                        continue
                found.cheapest = row
                found.past = len(ran) - at
                found.untried += sum(len(g) for g in groups[i + len(batch):])
                return found
    return found


def _verdict(r: dict[str, Any]) -> str:
    if r.get("unavailable"):
        return r["unavailable"]
    v = "pass (robust)" if r["robust"] else "pass" if r["passed"] else "FAIL"
    if r.get("confirmed") is False:
        v += ", not confirmed on fresh windows"
    return v


def first_fresh_window(windows: Sequence[Any], searched: int, spans: Sequence[tuple[int, int]] = ()) -> int:
    """The index of the first window (of the corpus's plan ``windows``) past the ``searched`` windows
    a search scored whose scored tokens lie outside every token span in ``spans`` (what its
    calibration read of the same corpus): where its confirmation's fresh windows begin."""
    for w in windows[searched:]:
        first_target = w.end - w.num_targets
        if not any(first_target < hi and lo < w.end for lo, hi in spans):
            return w.index
    raise ValueError(f"no fresh window left to confirm on: the corpus has {len(windows)} windows, the search "
                     f"read {searched} and its calibration the tokens " + ", ".join(f"[{a}, {b})" for a, b in spans))


def print_search(s: KnobSearch) -> None:
    knob = f" ({s.knob})" if s.knob else ""
    print(f"  {s.engine}{knob}: settings validated in {s.mode} mode, fewest bits first (gate {s.threshold:g})")
    width = max([28] + [len(r["flags"]) for r in s.rows])
    for r in s.rows:
        print(f"    {r['flags']:{width}s} {r['bits_per_element']:6.3f} bits  delta {r['context_delta']:+.4f} "
              f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]  {_verdict(r)}")
    for c in s.confirmations:
        print(f"    {c['flags']:{width}s} on fresh windows {c['first_window']}-{c['first_window'] + c['windows'] - 1}: "
              f"delta {c['context_delta']:+.4f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]  {_verdict(c)}")
    if s.cheapest is None:
        bound = f" up to {s.max_bits:g} bits/element ({s.untried} costlier settings not run)" if s.untried else ""
        held = " and holds on fresh windows" if s.confirmations else ""
        print(f"  no setting of {s.engine}'s passes robustly{held}{bound}")
    else:
        past = f", {s.past} costlier ran in its sweep" if s.past else ""
        held = ", confirmed on fresh windows" if s.confirmations else ""
        print(f"  cheapest that passes robustly{held}: {s.cheapest['flags']} ({s.cheapest['bits_per_element']:.3f} "
              f"bits/element; {s.untried} costlier settings not run{past})")


@dataclass
class BoundaryCheck:
    """A TurboQuant preset's fixed rule (skip the first and last two layers) against the measurement:
    the rule's layers' ranks in the measured ranking of every layer (1: most damaging), the fewest
    measured skips that pass robustly against the rule's count, and the rule's own setting's verdict."""

    format: str
    num_layers: int
    rule: list[int]
    ranking: list[int]  # every layer, most damaging first
    rule_ranks: list[int]  # each rule layer's rank, in the order of ``rule``
    search: KnobSearch  # "skip the k most damaging of every layer", fewest first
    rule_row: dict[str, Any] | None  # the rule's setting (the preset's flag alone) as validated
    fewest: int | None  # skips of the search's cheapest robust pass (None: none passed)
    fewest_layers: list[int] | None
    same_layers: bool  # the rule's layers are the measured top len(rule)
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def boundary_check(knob: VllmSkipLayers, sweep: Callable[[list[str]], Any], say: Callable[..., None] = print,
                   searched: KnobSearch | None = None, max_bits: float = 16.0,
                   confirm: Callable[[list[str]], Any] | None = None) -> BoundaryCheck:
    """Check ``knob``'s fixed rule against the measurement: rank every layer, validate "skip the k most
    damaging" over every layer fewest first (``MeasuredSkips``, the same search), and the rule's own
    setting (read from ``searched``, ``knob``'s own search, when it ran it; else one more sweep);
    ``confirm``: the search's robust passes confirmed on fresh windows, as ``cheapest_setting`` does."""
    if not knob.boundary:
        raise ValueError(f"vllm format {knob.format!r} has no fixed rule (only TurboQuant presets skip layers of their own)")
    measured = MeasuredSkips(knob)
    rule, ranking = knob.rule(), measured.ranking()
    search = cheapest_setting(knob.engine, sweep, say, knob=measured, max_bits=max_bits, confirm=confirm)
    rows = search.rows + (searched.rows if searched is not None else [])
    rule_row = next((r for r in rows if r.get("skipped") == rule), None)
    if rule_row is None:
        st = measured.setting(rule)
        result = sweep([st.spec])
        rule_row = _row(st, {s.name: s for s in result.schemes}[resolve_codec(st.spec).name])
    ranks = [ranking.index(i) + 1 for i in rule]
    fewest_layers = search.cheapest["skipped"] if search.cheapest else None
    fewest = len(fewest_layers) if fewest_layers is not None else None
    same = set(ranking[:len(rule)]) == set(rule)
    n = len(rule)
    if fewest is None:
        why = "no skip set passes robustly"
    elif fewest < n:
        why = f"fewer layers pass: {fewest} ({' '.join(map(str, fewest_layers)) or 'none'}) against the rule's {n}"
    elif fewest == n and set(fewest_layers) == set(rule):
        why = f"the rule's {n} layers are the fewest that pass"
    elif fewest == n:
        why = f"{n} layers pass, but other ones ({' '.join(map(str, fewest_layers))})"
    elif rule_row["robust"]:
        why = f"the ranking needs {fewest} skips to pass where the rule's {n} layers do"
    else:
        why = f"the rule's {n} are too few: the measurement needs {fewest}"
    rule_ok = "passes robustly" if rule_row["robust"] else "passes" if rule_row["passed"] else "fails"
    verdict = (f"{why}; the rule's setting {rule_ok}; its layers are "
               f"{'' if same else 'not '}the measured top {n}")
    return BoundaryCheck(knob.format, knob.num_layers, rule, ranking, ranks, search, rule_row, fewest, fewest_layers,
                         same, verdict)


def print_boundary_check(c: BoundaryCheck) -> None:
    print(f"  {c.format}'s fixed rule: skip layers {' '.join(map(str, c.rule))} of {c.num_layers}")
    print("    measured ranks of those layers (1: most damaging): "
          + ", ".join(f"{i}: {r}" for i, r in zip(c.rule, c.rule_ranks)))
    print(f"    measured top {len(c.rule)}: {' '.join(map(str, c.ranking[:len(c.rule)]))}")
    print_search(c.search)
    r = c.rule_row
    if r is not None:
        verdict = "pass (robust)" if r["robust"] else "pass" if r["passed"] else "FAIL"
        print(f"    the rule's setting {r['flags']}: {r['bits_per_element']:.3f} bits  delta {r['context_delta']:+.4f} "
              f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]  {verdict}")
    print(f"  verdict: {c.verdict}")

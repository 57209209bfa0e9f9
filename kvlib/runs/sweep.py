"""The sweep: every scheme in one pass over the same windows and targets, the
numbers an engineer decides on (perplexity delta with a confidence interval,
KL divergence, top-1 agreement, measured bits), and a recommendation.

Per window the model runs the full window once (the baseline, its LM head only
on the scored positions), the context cache is saved once, and each scheme
costs one codec round trip and one forward of the suffix. Validating one
scheme is a sweep of one.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvlib.budget.plan import calibration_tokens, parse_budgets, plan_mixes
from kvlib.budget.scales import CALIBRATED, calibrated_scales
from kvlib.runs.engines import UNAVAILABLE, engine_tables, print_engine_tables
from kvlib.runs.transfer import print_transfer, transfer_table
from kvlib.budget.sensitivity import CalibrationConfig, resolve_candidates, role_labels
from kvlib.cache.layout import geometry
from kvlib.checks.decoding import DecodingChecks, readings, run_decoding_checks
from kvlib.codec.metrics import CompressionMetrics, pool_tensors
from kvlib.codec.preflight import refusals
from kvlib.codec.spec import (ENTROPY_SUFFIXES, LOSSLESS_SUFFIX, CodecConfig, engine_menu, nominal_bits, presets,
                              resolve_codec, split_schemes)
from kvlib.env import flag
from kvlib.gates import CI_LEVEL, CI_METHOD, MIN_CI_UNITS, PPL_DELTA_THRESHOLD, robust, verdict
from kvlib.models import corpus
from kvlib.models.zoo import EMBEDDED
from kvlib.runs.setup import RunParams, RunSetup, prepare_run
from kvlib.scoring.executor import RayExecutor, ScoringJob, SerialExecutor
from kvlib.scoring.perplexity import MODES, PerplexityResult, plan_windows
from kvlib.scoring.provenance import RunIdentity
from kvlib.scoring.stats import KLDSummary, bootstrap_delta_ci
from kvlib.scoring.store import ResultsStore, unit_key
from kvlib.scoring.units import ScoringPlan, decode, encode
from kvlib.transforms.base import (CodecRoundtrip, PeerSelection, checked_peers, peer_transforms, peers_unavailable,
                                  run_shapes, select_peers)
from kvlib.transforms.codec import cache_transforms
from kvlib.transforms.engine import write_key

MIX_PREFIX = "mix@"  # the name of a budget's mixed scheme: mix@3.25


@dataclass
class SchemeResult:
    """One scheme (or the peer) over the sweep's windows: quality, cost, verdict."""

    name: str  # preset name, spec, or the peer's name
    spec: str
    kind: str  # "kvq" (kv-compress) or "peer" (transformers' QuantizedCache)
    mode: str = "prefix"  # how it met the model: a compressed prefix, or every K/V as written (MODES)
    bits_per_element: float = math.nan
    compression_ratio: float = math.nan  # vs FP16
    compressed_perplexity: float = math.nan
    delta: float = math.nan  # all scored tokens
    context_compressed_perplexity: float = math.nan
    context_delta: float = math.nan  # the gated delta: tokens after a compressed context
    ci_low: float = math.nan  # CI of the gated delta
    ci_high: float = math.nan
    kld_mean: float = math.nan  # KL(exact || compressed), nats, over tokens after a compressed context
    kld_median: float = math.nan
    kld_p99: float = math.nan
    top1_agreement: float = math.nan  # % of those tokens whose argmax is unchanged
    keys: dict[str, float] = field(default_factory=dict)  # RMSE, SNR, cosine of all key tensors pooled
    values: dict[str, float] = field(default_factory=dict)
    layer_key_snr_db: list[float] = field(default_factory=list)
    layer_value_snr_db: list[float] = field(default_factory=list)
    # values a static per-tensor scale clamped to the format's largest finite value, per layer (vllm:fp8)
    layer_key_saturated: list[int] = field(default_factory=list)
    layer_value_saturated: list[int] = field(default_factory=list)
    passed: bool = False  # the gate: gated delta < threshold
    robust: bool = False  # and the CI's upper bound too
    window_deltas: list[float] = field(default_factory=list)  # per-window ppl delta (compressed windows)
    seconds: float = 0.0  # codec round trips of this scheme
    compression: dict[str, Any] = field(default_factory=dict)  # pooled codec metrics, per tensor included
    error: str = ""  # why a peer could not run
    retrieval_found: float = math.nan  # pass keys found (kvlib.checks.retrieval), NaN when not run
    retrieval_total: float = math.nan
    retrieval_dropped: float = math.nan  # haystacks the exact cache answers and this scheme does not
    generation_agreement: float = math.nan  # % of greedy tokens equal to the exact cache's (kvlib.checks.agreement)
    generation_divergence: float = math.nan  # mean position of the first differing token

    @property
    def verdict_text(self) -> str:
        if self.error:
            return "not run"
        if not self.passed:
            return "FAIL (NaN: the cache overflowed)" if math.isnan(self.context_delta) else "FAIL"
        if math.isnan(self.ci_high):
            return f"PASS (no CI: fewer than {MIN_CI_UNITS} windows)"
        return "PASS (robust)" if self.robust else "PASS (CI crosses the gate)"


@dataclass
class SweepResult:
    """Every scheme's result over the same windows, and which to use."""

    model: str
    corpus: str
    device: str
    dtype: str
    threshold: float
    stride: int
    context_length: int
    windows: int
    mode: str  # "prefix" or "write": what the gated delta measures (kvlib.scoring.perplexity.MODES)
    scored_tokens: int
    context_windows: int
    context_scored_tokens: int
    baseline_perplexity: float
    context_baseline_perplexity: float
    schemes: list[SchemeResult]
    recommended: str | None
    recommendation: str
    ci_method: str = CI_METHOD
    kv_geometry: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    retrieval: dict[str, Any] = field(default_factory=dict)  # RetrievalResult.to_dict(), empty when not run
    agreement: dict[str, Any] = field(default_factory=dict)  # AgreementResult.to_dict(), empty when not run
    budget: dict[str, Any] = field(default_factory=dict)  # BudgetResult.to_dict(), empty without a budget
    engines: dict[str, Any] = field(default_factory=dict)  # kvlib.runs.engines.engine_tables: per engine's menu
    context_tokens: int = 0  # tokens of the compressed contexts over the windows (prefix mode; write mode: the windows' contexts)
    transfer: dict[str, Any] = field(default_factory=dict)  # kvlib.runs.transfer.transfer_table, when asked
    first_window: int = 0  # the index of the first window scored (a confirmation scores windows past a search's)

    def scheme(self, name: str) -> SchemeResult:
        for s in self.schemes:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, path: str | os.PathLike) -> None:
        """Write the result as JSON (NaN/Inf as null), atomically."""
        write_json(self.to_dict(), path)


def write_json(d: dict[str, Any], path: str | os.PathLike) -> None:
    """JSON with NaN/Inf as null, written to a temp file and renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(_finite(d), indent=1) + "\n")
    os.replace(tmp, path)


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _per_layer(comp: CompressionMetrics | None, role: str, of: Any) -> list[Any]:
    """``of(tensor entry)`` for each layer's key or value tensor, in layer order."""
    if comp is None:
        return []
    out = {}
    for t in comp.tensors:
        parts = t["name"].split("_")
        if len(parts) == 3 and parts[0] == "layer" and parts[2] == role:
            out[int(parts[1])] = of(t)
    return [out[i] for i in sorted(out)]


def _layer_snr(comp: CompressionMetrics | None, role: str) -> list[float]:
    """Pooled SNR of each layer's key or value tensor, in layer order."""
    return _per_layer(comp, role, lambda t: pool_tensors([t], "")["snr_db"])


def scheme_result(name: str, spec: str, kind: str, ppl: PerplexityResult, threshold: float,
                  seconds: float = 0.0, mode: str = "prefix") -> SchemeResult:
    """The numbers of one scheme from its windows (gated measures: compressed windows only)."""
    ctx = [w for w in ppl.windows if w.compressed]
    b = np.array([w.baseline_nll for w in ctx])
    c = np.array([w.compressed_nll for w in ctx])
    n = np.array([w.num_targets for w in ctx])
    lo, hi = bootstrap_delta_ci(b, c, n)
    kld = KLDSummary.of([v for w in ctx for v in w.kld])
    comp = ppl.compression
    r = SchemeResult(
        name=name, spec=spec, kind=kind,
        bits_per_element=comp.bits_per_element if comp else nominal_bits(spec) if kind == CodecRoundtrip.kind else math.nan,
        compression_ratio=comp.compression_ratio if comp else math.nan,
        compressed_perplexity=ppl.compressed_perplexity, delta=ppl.delta,
        context_compressed_perplexity=ppl.context_compressed_perplexity, context_delta=ppl.context_delta,
        ci_low=lo, ci_high=hi, kld_mean=kld.mean, kld_median=kld.median, kld_p99=kld.p99,
        top1_agreement=100 * sum(w.top1_agree for w in ctx) / n.sum() if n.sum() else math.nan,
        keys=pool_tensors(comp.tensors, "_key") if comp else {},
        values=pool_tensors(comp.tensors, "_value") if comp else {},
        layer_key_snr_db=_layer_snr(comp, "key"), layer_value_snr_db=_layer_snr(comp, "value"),
        layer_key_saturated=_per_layer(comp, "key", lambda t: int(t.get("saturated", 0))),
        layer_value_saturated=_per_layer(comp, "value", lambda t: int(t.get("saturated", 0))),
        window_deltas=[w.compressed_ppl - w.baseline_ppl for w in ctx], seconds=seconds,
        compression=comp.to_dict() if comp else {}, mode=mode,
    )
    r.passed = bool(ctx) and verdict(r.context_delta, threshold)
    r.robust = r.passed and robust(r.ci_high, threshold)
    return r


def recommend(schemes: list[SchemeResult]) -> tuple[str | None, str]:
    """The fewest bits/element among the robust schemes, and a sentence saying so.

    Schemes with an entropy stage (+lossless, +wire) are left out of the pick (an entropy-coded
    cache cannot be attended to in place); where the pick has such a twin, the sentence gives the
    smallest one's size for storage and transfer."""
    ok = [s for s in schemes if s.robust and not s.error and math.isfinite(s.bits_per_element)
          and not s.spec.endswith(ENTROPY_SUFFIXES)]
    if not ok:
        coded = [s for s in schemes if s.robust and not s.error and math.isfinite(s.bits_per_element)
                 and s.spec.endswith(ENTROPY_SUFFIXES)]
        if coded:  # robust only with an entropy stage: an answer for storing or sending, not for memory
            c = min(coded, key=lambda s: (s.bits_per_element, s.context_delta))
            return None, (f"No scheme held in memory passes robustly; to store or send the cache, {c.name} does: "
                          f"{c.bits_per_element:.2f} bits/element ({c.compression_ratio:.2f}x smaller than FP16), "
                          f"gated delta {c.context_delta:+.4f} (CI {c.ci_low:+.4f} to {c.ci_high:+.4f}); an "
                          "entropy-coded cache cannot be attended to in place.")
        passing = [s.name for s in schemes if s.passed]
        if passing:
            why = (f"no CI: fewer than {MIN_CI_UNITS} windows with a compressed context" if all(
                math.isnan(s.ci_high) for s in schemes if s.passed) else "the CI crosses it")
            return None, (f"No scheme passes with {CI_LEVEL:.0%} confidence; {', '.join(passing)} pass(es) the gate "
                          f"but {why}: score more windows.")
        return None, "No scheme keeps the model's quality: none passes the perplexity gate."
    best = min(ok, key=lambda s: (s.bits_per_element, s.context_delta))
    saving = 100 * (1 - best.bits_per_element / 16)
    sentence = (f"Use {best.name} ({_shown_spec(best.spec)}): {best.bits_per_element:.2f} bits/element, "
                f"{best.compression_ratio:.2f}x smaller than FP16 ({saving:.0f}% less memory), gated delta "
                f"{best.context_delta:+.4f} (CI {best.ci_low:+.4f} to {best.ci_high:+.4f}), "
                f"top-1 agreement {best.top1_agreement:.1f}%.")
    twin = sorted((s for s in schemes if s.spec in [best.spec + x for x in ENTROPY_SUFFIXES] and not s.error),
                  key=lambda s: s.bits_per_element)
    if twin:
        sentence += (f" To store or send it, {twin[0].name} takes {twin[0].bits_per_element:.2f} bits/element "
                     f"({twin[0].compression_ratio:.2f}x), bit for bit the same cache.")
    return best.name, sentence


SPEC_SHOWN = 120  # characters of a spec a sentence quotes; a longer one (per-layer scales) is in the JSON


def _shown_spec(spec: str) -> str:
    """A spec as the recommendation quotes it: whole, or its head and where the rest is."""
    if len(spec) <= SPEC_SHOWN:
        return spec
    parts = spec.split(",")
    return f"{parts[0]},... {len(parts) - 1} more parts: the spec in the JSON's schemes"


def score_schemes(lm: Any, ids: torch.Tensor, max_length: int, stride: int, codecs: list[CodecConfig],
                  workdir: str | os.PathLike, model_name: str, threshold: float = PPL_DELTA_THRESHOLD,
                  peers: bool = False, max_windows: int | None = None, progress: bool = False,
                  store: ResultsStore | None = None, identity: RunIdentity | None = None,
                  executor: Any = None, job: ScoringJob | None = None, mode: str = "prefix",
                  architecture: str | None = None, first_window: int = 0,
                  ) -> tuple[list[SchemeResult], PerplexityResult, dict[str, float]]:
    """Score every codec (and the peers) over the same windows; the shared core
    of run_sweep and run_full_validation. Returns the scheme results, the first
    codec's PerplexityResult (windows and baseline), and bridge timings.

    ``lm`` is the model, or a function that loads it: called only when a unit is missing.
    With ``store`` and ``identity``, finished units are read from the store and new ones
    written to it as each window finishes; ``executor`` (default in-process; needs ``job``)
    computes the missing ones. The merged result does not depend on which did what.
    ``mode`` (kvlib.scoring.perplexity.MODES) enters every unit's key and every result.
    ``first_window``: score the ``max_windows`` windows from that index on (the same units as a run
    over all of them holds for those windows)."""
    missing_peer = peers_unavailable(peers) if peers else None
    peer_list = peer_transforms(peers) if peers else []
    # name -> (kind, spec as shown, spec as keyed): what each transform computes, before any is built
    # the model's architecture (the engines' write path depends on it): given, or the model's config
    architecture = architecture or getattr(getattr(lm, "config", None), "model_type", None)
    described = {c.name: (CodecRoundtrip.kind, c.spec,
                          c.spec + (write_key(c, architecture) if mode == "write" else ""))
                 for c in codecs}
    if missing_peer is None:
        described.update({t.name: (t.kind, t.spec, t.key) for t in peer_list})
    made: dict[str, Any] = {}

    def load() -> Any:
        if "lm" not in made:
            made["lm"] = lm if isinstance(lm, torch.nn.Module) or not callable(lm) else lm()
        return made["lm"]

    def transforms() -> dict[str, Any]:
        if "ts" not in made:
            made["ts"], _ = cache_transforms(codecs, workdir, model_name, peers, mode=mode, architecture=architecture)
        return made["ts"]

    t0 = time.perf_counter()
    last = None if max_windows is None else first_window + max_windows
    windows = plan_windows(ids.shape[1], max_length, stride, last)[first_window:]
    if not windows:
        raise ValueError(f"the corpus has no window from index {first_window} on "
                         f"({len(plan_windows(ids.shape[1], max_length, stride))} windows in all)")
    plan = ScoringPlan(identity or _anonymous(max_length, stride), windows,
                       {name: key if mode == "prefix" else f"{mode}: {key}" for name, (_, _, key) in described.items()})
    done, missing = plan.lookup(store if identity is not None else None)

    def on_window(index: int, outcomes: dict[str, Any]) -> None:
        plan.record(store if identity is not None else None, index, outcomes)
        done.update({(index, k): decode(encode(o)) for k, o in outcomes.items()})

    if executor is None:
        executor = SerialExecutor(load, transforms, progress)
    executor.run(job or _job_for(codecs, peers, max_length, stride, last, model_name, mode=mode), ids, missing,
                 on_window)
    res = plan.merge(done, time.perf_counter() - t0)
    out = []
    for name, (kind, spec, _) in described.items():
        out.append(scheme_result(name, spec, kind, res[name], threshold, res[name].transform_seconds, mode))
    if missing_peer is not None:
        out += [SchemeResult(name=t.name, spec=t.spec, kind=t.kind, error=missing_peer) for t in peer_list]
    clis = [t for t in made.get("ts", {}).values() if isinstance(t, CodecRoundtrip)]
    timing = {f"bridge_{k}_s": sum(t.seconds[k] for t in clis) for k in ("save", "cli", "load")}
    timing["units_reused"] = float(len(plan.windows) * len(described) - sum(len(v) for v in missing.values()))
    timing["units_computed"] = float(sum(len(v) for v in missing.values()))
    timing.update(getattr(executor, "seconds", {}) or {})
    return out, res[codecs[0].name], timing


def _anonymous(max_length: int, stride: int) -> RunIdentity:
    """An identity for a run without a store (keys are never used)."""
    return RunIdentity("", "", "", "", "", "", "", max_length, stride)


def _job_for(codecs: list[CodecConfig], peers: bool, max_length: int, stride: int, max_windows: int | None,
             model_name: str, model: str = "", device: str = "cpu", dtype: str = "float32",
             mode: str = "prefix") -> ScoringJob:
    return ScoringJob(model, device, dtype, tuple(c.spec for c in codecs), peers, max_length, stride, max_windows,
                      model_name, mode=mode)


def run_sweep(
    codecs: list[CodecConfig | str] | None = None,
    model: str = EMBEDDED,
    corpus_name: str = corpus.EMBEDDED,
    device: str | None = None,
    dtype: str | None = None,
    threshold: float = PPL_DELTA_THRESHOLD,
    stride: int = 512,
    max_windows: int | None = None,
    context_length: int | None = None,
    peers: PeerSelection = True,
    workdir: str | os.PathLike | None = None,
    verbose: bool = True,
    progress: bool | None = None,
    checks: DecodingChecks = DecodingChecks(),
    results: str | os.PathLike | None | bool = None,
    fresh: bool = False,
    ray: bool | str = False,
    budget: str | float | list[float] | None = None,
    calibration: CalibrationConfig | str | None = None,
    sensitivity: bool = False,
    mode: str = "prefix",
    calibrate_scales: bool = False,
    transfer: bool = False,
    first_window: int = 0,
    beside: str | None = None,
) -> SweepResult:
    """Compare ``codecs`` (CodecConfigs, preset names or specs; default every
    preset and int4 with the lossless stage) and transformers' QuantizedCache
    over the same windows, then on the retrieval and agreement ``checks``.

    ``peers``: which of transformers' caches run beside them (kvlib.transforms.base.PeerSelection:
    True the default, ``hf-quanto``; names such as ``"hf-quanto,hf-hqq"``; False none). One that
    cannot run here or refuses this run's cache shapes is a row saying why; an opt-in one
    (``hf-hqq``) is left out of the decoding checks.

    Every window's units go to the results store ``results`` (default ``$KVLIB_HOME/results``;
    False: none) as they finish and are read back on the next run (``fresh``: ignore them); a
    run with nothing missing (decoding checks included) loads no model. ``ray`` (True, or a
    cluster address; also when RAY_ADDRESS is set or KVLIB_RAY=1) computes the missing units on
    Ray actors.

    ``sensitivity``: also measure each (layer, role) slot's cost under each candidate scheme on
    the ``calibration`` windows (kvlib.budget); ``budget`` (bits per element, one or a list)
    implies it and validates the mixed scheme each budget allots, named ``mix@BUDGET``, beside
    the others.

    ``mode``: "prefix" (default: the context compressed once, the KVQuant-style gate) or "write"
    (every K and V quantized as written, inside the forward, as engines do; kvlib.scoring.write).

    ``calibrate_scales``: each scheme of an engine format with a static per-tensor scale (vLLM's
    fp8) is also validated with the scales calibrated on the calibration windows
    (kvlib.budget.scales), named ``SCHEME@calibrated``, beside its scale 1.

    ``transfer``: also the transfer view of the schemes (kvlib.runs.transfer: bytes on the wire
    per context token against quality; prefix mode).

    ``first_window``: score ``max_windows`` windows from that index on, not from the first (fresh
    windows to confirm what a search chose on the first ones; no budget or decoding checks then).

    ``beside``: also score the engine options in this other mode (``--engine`` runs: prefix beside
    write), for the engine tables' second column; the verdict stays ``mode``'s."""
    t_start = time.perf_counter()
    check_mode(mode)
    if beside is not None and (beside == mode or beside not in MODES):
        raise ValueError(f"beside {beside!r}: the other mode of {', '.join(MODES)} than {mode!r}")
    if first_window < 0:
        raise ValueError(f"first_window {first_window} must be >= 0")
    if first_window and (budget or sensitivity or calibrate_scales or checks.retrieval or checks.agreement):
        raise ValueError("first_window scores later windows of the schemes alone: no budget, calibration "
                         "or decoding checks (their windows are planned from the first)")
    resolved = [resolve_codec(c) for c in (codecs or default_schemes())]  # bad specs fail first
    if transfer and mode != "prefix":
        raise ValueError("the transfer view is of a finished prefix's cache sent elsewhere: prefix mode, not write")
    check_engine_modes(resolved, mode)
    budgets = budget if isinstance(budget, list) else parse_budgets(budget)
    cal_cfg = calibration if isinstance(calibration, CalibrationConfig) else CalibrationConfig.from_string(calibration or "")
    sensitivity = sensitivity or bool(budgets)
    if sensitivity:
        resolve_candidates(cal_cfg.candidates)
    if len({c.name for c in resolved}) != len(resolved):
        raise ValueError("a scheme is listed twice: " + ", ".join(c.name for c in resolved))
    run = prepare_run(RunParams(model, corpus_name, device, dtype, threshold, stride, max_windows, context_length,
                                results, fresh), verbose)
    geometry = model_geometry(run)  # a cache kvlib cannot compress fails here, before any window
    windows = plan_windows(run.ids.shape[1], run.context_length, stride,
                           None if max_windows is None else first_window + max_windows)[first_window:]
    shapes = [x for m in dict.fromkeys((mode, beside or mode)) for x in run_shapes(geometry, windows, m)]
    resolved, unavailable = drop_refused(resolved, shapes, mode)
    peers, refused_peers = select_peers(peers, geometry, windows, mode)  # a peer that cannot run: its row says why
    unavailable += [SchemeResult(name=t.name, spec=t.spec, kind=t.kind, mode=mode, error=why)
                    for t, why in refused_peers]
    planned, mixes = None, {}
    if sensitivity:
        resolved, planned, mixes = _add_mixes(run, resolved, cal_cfg, budgets, workdir,
                                              verbose if progress is None else progress, mode)
    if calibrate_scales:
        cal = calibration_tokens(cal_cfg, run.text, run.ids, run.tokenizer, run.context_length, stride, max_windows)
        twins = calibrated_scales(resolved, run.load, cal.ids, cal.starts, run.context_length, run.store,
                                  run.identity, run.say)
        resolved += list(twins.values())
        mixes.update({c.name: alias for alias, c in twins.items()})
    lazy = run.lazy()  # the decoding checks load it only for a unit not stored
    checks.check_inputs(lazy, run.tokenizer, run.ids.shape[1], run.text.name)
    executor, job = executor_for(run, resolved, peers, ray, mode, first_window)
    names = ", ".join(mixes.get(c.name, c.name) for c in resolved) + (
        " + the transformers QuantizedCache peer" if peers else "")
    run.say(f"Scoring {names} on {run.text.name} ({run.ids.shape[1]} tokens, window {run.context_length}, "
            f"stride {stride})...")
    t0 = time.perf_counter()
    loaded_before = "lm" in run.loaded
    progress = verbose if progress is None else progress
    with tempfile.TemporaryDirectory(prefix="kvlib-sweep-") as tmp:
        schemes, first, timing = score_schemes(
            run.load, run.ids, run.context_length, stride, resolved, workdir or tmp, run.name, threshold, peers,
            max_windows, progress, store=run.store, identity=run.identity, executor=executor, job=job, mode=mode,
            architecture=getattr(run.config, "model_type", None), first_window=first_window)
        seconds = time.perf_counter() - t0 - (0.0 if loaded_before else run.model_load_s)
        run.say(f"Units: {timing['units_computed']:.0f} computed, {timing['units_reused']:.0f} read from the store")
        retrieval, agreement = run_decoding_checks(lazy, run.tokenizer, run.ids, resolved, checks, workdir or tmp,
                                                   run.name, run.text.name, checked_peers(peers), progress,
                                                   store=run.store, identity=run.identity)
        other = score_beside(run, resolved, mixes, beside, workdir or tmp, threshold, progress, ray,
                             first_window) if beside else []
    for s in schemes:
        for k, v in readings(s.name, retrieval, agreement).items():
            setattr(s, k, v)
        s.name = mixes.get(s.name, s.name)
    schemes += unavailable
    schemes.sort(key=lambda s: (bool(s.error), not s.passed, s.bits_per_element, s.context_delta))
    rec, sentence = recommend(schemes)
    result = SweepResult(
        model=run.name, corpus=run.text.name, device=run.device, dtype=run.dtype_name,
        threshold=threshold, stride=stride, context_length=run.context_length, windows=first.num_windows, mode=mode,
        scored_tokens=first.scored_tokens, context_windows=sum(w.compressed for w in first.windows),
        context_scored_tokens=first.context_scored_tokens, baseline_perplexity=first.baseline_perplexity,
        context_baseline_perplexity=first.context_baseline_perplexity, schemes=schemes, recommended=rec,
        recommendation=sentence,
        kv_geometry=geometry,
        timing={"total_s": time.perf_counter() - t_start, "model_load_s": run.model_load_s, "scoring_s": seconds,
                "scored_tokens_per_s": first.scored_tokens / seconds if seconds else math.nan, **timing,
                **({"retrieval_s": retrieval.timing["total_s"]} if retrieval else {}),
                **({"agreement_s": agreement.timing["total_s"]} if agreement else {})},
        retrieval=renamed(retrieval.to_dict(), mixes) if retrieval else {},
        agreement=renamed(agreement.to_dict(), mixes) if agreement else {},
        budget=planned.to_dict() if planned else {},
        engines=engine_tables(schemes, mode, other),
        context_tokens=sum(w.context_tokens for w in first.windows if w.compressed),
        first_window=first_window,
    )
    if transfer:
        result.transfer = transfer_table(schemes, result.context_tokens)
    if verbose:
        print_sweep(result)
    return result


def score_beside(run: RunSetup, codecs: list[CodecConfig], names: dict[str, str], mode: str, workdir: Any,
                 threshold: float, progress: bool, ray: bool | str, first_window: int) -> list[SchemeResult]:
    """The engine options among ``codecs`` scored in ``mode`` too, over the same windows (their own
    units in the store), named as the sweep names them (``names``: a calibrated twin's spec is
    ``OPTION@calibrated``): what the engine tables show beside the verdict's mode."""
    menu = {row["name"]: row["mode"] for row in engine_menu("all")}
    options = [c for c in codecs if menu.get(names.get(c.name, c.name).removesuffix(CALIBRATED))
               in (mode, "write" if mode == "prefix" else mode)]
    if not options:
        return []
    run.say(f"Scoring the {len(options)} engine options in {mode} mode too, beside the verdict's...")
    executor, job = executor_for(run, options, False, ray, mode, first_window)
    out, _, _ = score_schemes(run.load, run.ids, run.context_length, run.params.stride, options, workdir, run.name,
                              threshold, False, run.params.max_windows, progress, store=run.store,
                              identity=run.identity, executor=executor, job=job, mode=mode,
                              architecture=getattr(run.config, "model_type", None), first_window=first_window)
    for s in out:
        s.name = names.get(s.name, s.name)
    return out


class AllRefused(ValueError):
    """kv-compress refuses every scheme of a sweep for this model's cache; ``rows`` says why for each."""

    def __init__(self, rows: list[SchemeResult]):
        super().__init__("kv-compress refuses every scheme for this model's cache: " + "; ".join(
            f"{r.name}: {r.error.removeprefix(UNAVAILABLE)}" for r in rows))
        self.rows = rows


def drop_refused(codecs: list[CodecConfig], shapes: list[tuple[int, str, tuple[int, ...]]], mode: str,
                 ) -> tuple[list[CodecConfig], list[SchemeResult]]:
    """The codecs kv-compress takes for every K and V of the run (``shapes``: run_shapes), and a
    "not run" row with the reason for each it refuses (an engine's option the engine refuses for
    this model, kvlib.codec.preflight): listed, never run as something else. AllRefused when it
    refuses them all."""
    refused = refusals(codecs, shapes)
    rows = [SchemeResult(name=c.name, spec=c.spec, kind=CodecRoundtrip.kind, mode=mode,
                         error=UNAVAILABLE + refused[c.name]) for c in codecs if c.name in refused]
    if codecs and len(rows) == len(codecs):
        raise AllRefused(rows)
    return [c for c in codecs if c.name not in refused], rows


def _add_mixes(run: RunSetup, resolved: list[CodecConfig], cal_cfg: CalibrationConfig, budgets: list[float],
               workdir: Any, progress: bool, mode: str = "prefix") -> tuple[list[CodecConfig], Any, dict[str, str]]:
    """Measure the slots' sensitivity on the calibration windows and add each budget's mix to the
    schemes: (schemes, the plan, {mix spec's name: mix@BUDGET}). In prefix mode the calibration
    contexts are as long as the evaluated windows' compressed contexts, so the budget is met on
    the layout evaluated (a sliding layer and a global one hold what they hold there)."""
    p = run.params
    evaluated = plan_windows(run.ids.shape[1], run.context_length, p.stride, p.max_windows)
    context = max(w.context_tokens for w in evaluated) if mode == "prefix" else None
    # a calibration window holds that context and its targets (more than a window at a small stride)
    span = max(run.context_length, (context or 0) + cal_cfg.targets + 1)
    cal = calibration_tokens(cal_cfg, run.text, run.ids, run.tokenizer, span, p.stride, p.max_windows,
                             evaluated_length=run.context_length)
    with tempfile.TemporaryDirectory(prefix="kvlib-budget-") as tmp:
        found, planned = plan_mixes(run.load, cal_cfg, budgets, cal, span, workdir or tmp, run.name,
                                    run.store, run.identity, run.say, progress, context or None)
    mixes = {m.name: f"{MIX_PREFIX}{b:g}" for m, b in zip(found, budgets)}
    resolved = resolved + [m for m in dict.fromkeys(found) if m.name not in {c.name for c in resolved}]
    return resolved, planned, mixes


def check_mode(mode: str) -> None:
    """A scoring mode kvlib has (ValueError naming the choices)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: choose one of {', '.join(MODES)}")


def executor_for(run: RunSetup, codecs: list[CodecConfig], peers: bool, ray: bool | str, mode: str = "prefix",
                 first_window: int = 0) -> tuple[Any, ScoringJob | None]:
    """Where the missing units run: in process (None), or on Ray when ``ray`` (True or an address),
    RAY_ADDRESS or KVLIB_RAY=1 asks for it (its workers plan the windows up to the last scored)."""
    if not (ray or os.environ.get("RAY_ADDRESS") or flag("KVLIB_RAY")):
        return None, None
    p = run.params
    return RayExecutor(address=ray if isinstance(ray, str) else None), _job_for(
        codecs, peers, run.context_length, p.stride,
        None if p.max_windows is None else first_window + p.max_windows, run.name, p.model, run.device,
        run.dtype_name, mode)


def renamed(d: Any, names: dict[str, str]) -> Any:
    """``d`` (a check's JSON-able result) with the schemes' names replaced as ``names`` says, in
    keys, values and sentences alike: mixed schemes are shown as mix@BUDGET, not as their long
    specs."""
    if isinstance(d, dict):
        return {names.get(k, k) if isinstance(k, str) else k: renamed(v, names) for k, v in d.items()}
    if isinstance(d, list):
        return [renamed(v, names) for v in d]
    if isinstance(d, str):  # a name, or a sentence naming schemes (a check's summary)
        if d in names:
            return names[d]
        for long, short in sorted(names.items(), key=lambda kv: -len(kv[0])):
            if "=" in long:  # a per-layer spec cannot be part of another name
                d = d.replace(long, short)
    return d


def model_geometry(run: RunSetup) -> dict[str, Any]:
    """The model's cache geometry: from the store, or from the model (loaded now, so that a
    cache kvlib cannot compress fails before any window)."""
    unit = run.store.get(unit_key(run.identity.geometry())) if run.store is not None else None
    if unit is not None:
        return unit["geometry"]
    found = geometry(run.load())
    if run.store is not None:
        run.store.put(run.identity.geometry(), {"geometry": found})
    return found


def engine_schemes(engine: str) -> list[str]:
    """An engine's menu of KV-cache formats, as kv-compress names them; ``all``: every serving
    engine's (write mode), not the KV-sharing systems' serdes (prefix mode, ``--engine lmcache``)."""
    return [row["name"] for row in engine_menu(engine) if engine != "all" or row["mode"] == "write"]


def engine_mode(engine: str) -> str:
    """How an engine's options are measured (its verdict's mode): ``write`` for a serving engine,
    which writes every token quantized; ``prefix`` for a KV-sharing system, which stores and restores
    a finished prefix's cache (``all``: the serving engines')."""
    return "write" if engine == "all" else engine_menu(engine)[0]["mode"]


def check_engine_modes(codecs: list[CodecConfig], mode: str) -> None:
    """A KV-sharing system's serde (a prefix-mode engine: LMCache) is not run in write mode, where it
    would be measured as something it never does (ValueError naming the format)."""
    if mode != "write":
        return
    prefix_only = {row["engine"] for row in engine_menu("all") if row["mode"] == "prefix"}
    for c in codecs:
        methods = {c.key.method, c.value.method, *(o.scheme.method for o in (*c.layers, *c.heads))}
        bad = sorted(m for m in methods if m.partition(":")[0] in prefix_only)
        if bad:
            raise ValueError(f"{c.name}: {bad[0]} is a serde of a stored prefix (its engine stores a finished "
                             "cache, it does not write tokens as they come): measure it with --mode prefix")


def default_schemes() -> list[str]:
    """What a sweep compares when not told: every preset, and int4 with the lossless stage."""
    return [*presets(), "int4" + LOSSLESS_SUFFIX]


def scheme_list(text: str) -> list[str]:
    """The schemes a --schemes value names: 'all' is ``default_schemes()``, else ``split_schemes``."""
    return default_schemes() if text.strip() == "all" else split_schemes(text)


def print_sweep(r: SweepResult) -> None:
    """A fixed-width table of the sweep, best first, and the recommendation."""
    w = max([16] + [len(s.name) for s in r.schemes])  # the scheme column fits the longest name
    bar = "=" * (w + 92)
    print(bar)
    print(f"  SWEEP  {r.model} on {r.corpus} ({r.dtype}, {r.device})")
    what = "after a compressed context" if r.mode == "prefix" else "with every K/V quantized as written (write mode)"
    print(f"  {r.windows} windows, {r.context_scored_tokens} tokens {what}, "
          f"baseline perplexity {r.context_baseline_perplexity:.4f}")
    print(bar)
    print(f"  {'scheme':{w}s} {'bits/el':>7s} {'ratio':>6s} {'delta gated':>11s} {f'{CI_LEVEL:.0%} CI':>19s} "
          f"{'KLD mean':>9s} {'KLD p99':>8s} {'top-1':>6s} {'key SNR':>7s} {'val SNR':>7s}  verdict")
    for s in r.schemes:
        if s.error:
            print(f"  {s.name:{w}s} not run: {s.error}")
            continue
        print(f"  {s.name:{w}s} {s.bits_per_element:7.3f} {s.compression_ratio:5.2f}x {s.context_delta:+11.4f} "
              f"[{s.ci_low:+8.4f}, {s.ci_high:+8.4f}] {s.kld_mean:9.5f} {s.kld_p99:8.4f} {s.top1_agreement:5.1f}% "
              f"{s.keys.get('snr_db', math.nan):7.2f} {s.values.get('snr_db', math.nan):7.2f}  {s.verdict_text}")
    print(bar)
    for s in r.schemes:  # what a static scale clamps (vLLM's fp8 with scale 1 and no checkpoint scales)
        sat = [(i, k, v) for i, (k, v) in enumerate(zip(s.layer_key_saturated, s.layer_value_saturated)) if k or v]
        if sat:
            worst = ", ".join(f"layer {i}: {k} K / {v} V" for i, k, v in sorted(sat, key=lambda x: -(x[1] + x[2]))[:3])
            print(f"  {s.name}: {sum(k + v for _, k, v in sat)} values clamped to the format's largest ({worst})")
    for d in (r.retrieval, r.agreement):
        if d:
            print(f"  {d['summary']}")
    print(f"  {r.recommendation}")
    print(bar)
    if r.engines:
        print_engine_tables(r.engines)
        print(bar)
    if r.budget:
        print_budget(r.budget, {s.name: s.bits_per_element for s in r.schemes})
    if r.transfer:
        print_transfer(r.transfer)
        print(bar)


def print_budget(b: dict[str, Any], stored: dict[str, float] | None = None) -> None:
    """The sensitivity table (mean KL per target when only that slot is compressed) and each
    budget's allocation: the bits asked, planned on the calibration caches (the evaluated
    layout) and ``stored`` on the evaluation windows (by scheme name, when known)."""
    sens = b["sensitivity"]
    names = sens["names"]
    print(f"  SENSITIVITY  KL(exact || one slot compressed), nats/token, on {sens['calibration']}")
    labels = [role_labels(names, sens["candidates"], r) for r in range(2)]
    w = max(11, *(len(n) + 2 for role in labels for n in role))
    print("  layer  " + "  ".join(f"{'K ' + n:>{w}s}" for n in labels[0]) + "   "
          + "  ".join(f"{'V ' + n:>{w}s}" for n in labels[1]))
    for layer, roles in enumerate(sens["kl"]):
        print(f"  {layer:5d}  " + "  ".join(f"{v:{w}.5f}" for v in roles[0]) + "   "
              + "  ".join(f"{v:{w}.5f}" for v in roles[1]))
    for m in b["mixes"]:
        kept = (stored or {}).get(f"{MIX_PREFIX}{m['budget']:g}")
        on_eval = f", {kept:.3f} stored on the evaluation windows" if kept is not None else ""
        print(f"  budget {m['budget']:g} bits/element asked: {m['bits']:.3f} planned{on_eval}; KL predicted "
              f"{m['predicted_kl']:.4f}, measured {m['measured_kl']:.4f}: {m['spec']}")

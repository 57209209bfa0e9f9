"""The same schemes on several models: does the cheapest safe compression of one
model carry over to another? One sweep per model, over the same corpus, windows
and stride (each model tokenizes the text its own way, so the windows cover the
same characters only approximately), loaded one model at a time.
"""

from __future__ import annotations

import gc
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any


from kvlib.models import corpus
from kvlib.models.sources import resolve_model
from kvlib.checks.decoding import DecodingChecks
from kvlib.checks.ruler.run import RulerConfig, RulerResult
from kvlib.codec.spec import resolve_codec
from kvlib.gates import PPL_DELTA_THRESHOLD
from kvlib.scoring.stats import spearman
from kvlib.transforms.base import PeerSelection
from kvlib.budget.plan import parse_budgets
from kvlib.runs.ruler import run_ruler_suite
from kvlib.runs.sweep import MIX_PREFIX, engine_mode, engine_schemes, run_sweep, write_json

ZOO_MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")
ZOO_SCHEMES = ("int4", "kivi4", "rot4", "q4_0", "q8_0")


@dataclass
class CrossModelResult:
    """One sweep (SweepResult.to_dict()) per model, same schemes and corpus."""

    models: list[str]
    schemes: list[str]
    corpus: str
    max_windows: int | None
    stride: int
    threshold: float
    sweeps: list[dict[str, Any]]
    timing: dict[str, float] = field(default_factory=dict)
    engine: str | None = None  # whose menu each model's "engine_tables" hold (kvlib.runs.engines)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["snr_correlation"] = snr_correlation(self.to_points())
        return d

    def to_json(self, path: str | os.PathLike) -> None:
        write_json(self.to_dict(), path)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "CrossModelResult":
        """A result written by to_json (to re-render a report without running the models again)."""
        d = json.loads(Path(path).read_text())
        try:
            return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k != "engine"}, engine=d.get("engine"))
        except KeyError as e:
            raise ValueError(f"{path}: not a kvlib cross-model result (no {e.args[0]!r})") from None

    def to_points(self) -> list[dict[str, Any]]:
        """One row per (model, scheme): gated delta, KLD, top-1, bits and key/value SNR."""
        return points(self.sweeps)


def run_models(model_names: list[str] | tuple[str, ...] = ZOO_MODELS, schemes: list[str] | tuple[str, ...] = ZOO_SCHEMES,
               corpus_name: str = corpus.EMBEDDED, max_windows: int | None = 8, stride: int = 512,
               peers: PeerSelection = True, threshold: float = PPL_DELTA_THRESHOLD, device: str | None = None,
               dtype: str | None = None, context_length: int | None = None, verbose: bool = True,
               budget: str | list[float] | None = None, ruler: RulerConfig | None = None,
               engine: str | None = None) -> CrossModelResult:
    """Sweep ``schemes`` on every model in turn (a zoo model is fetched first); ``budget`` (bits per
    element, one or a list) adds each model's own mix@BUDGET, planned on that model; ``ruler`` runs
    the RULER suite on each model's presets too (its units in the results store: a rerun resumes;
    without the presses, which the zoo report does not show); ``engine`` (a name ``--engine`` takes)
    sweeps that engine's menu on each model as ``kv-validate --engine`` does (its mode, calibrated
    twins, prefix beside write) into the model's ``engine_tables``."""
    budgets = budget if isinstance(budget, list) else parse_budgets(budget)
    if not model_names:
        raise ValueError("no models to compare")
    menu = engine_schemes(engine) if engine else []  # an unknown engine fails before any model loads
    for m in model_names:  # a bad name or path fails before the first long sweep; zoo models are fetched now
        resolve_model(m)
    t0 = time.perf_counter()
    sweeps, seconds = [], {}
    for m in model_names:
        if verbose:
            print(f"== {m}", flush=True)
        t = time.perf_counter()
        r = run_sweep(list(schemes), model=m, corpus_name=corpus_name, device=device, dtype=dtype,
                      threshold=threshold, stride=stride, max_windows=max_windows, context_length=context_length,
                      peers=peers, verbose=verbose, progress=verbose, checks=DecodingChecks(), budget=budgets)
        d = r.to_dict()
        d["model_spec"] = m
        sweeps.append(d)
        seconds[f"{m}_s"] = time.perf_counter() - t
        del r
        gc.collect()
        if engine:
            t = time.perf_counter()
            d["engine_tables"] = engine_sweep(menu, engine, m, corpus_name, device, dtype, threshold, stride,
                                              max_windows, context_length, verbose)
            seconds[f"{m}_engine_s"] = time.perf_counter() - t
            gc.collect()
        if ruler is not None:
            t = time.perf_counter()
            ran = {s["name"] for s in d["schemes"] if not s.get("error")}  # not one the model's engine refuses
            codecs = [c for c in (resolve_codec(x) for x in schemes) if c.name in ran]
            d["ruler"] = run_ruler_suite(codecs, replace(ruler, presses=()), model=m, device=device, dtype=dtype,
                                         verbose=verbose).to_dict()
            seconds[f"{m}_ruler_s"] = time.perf_counter() - t
            gc.collect()
    mixes = [f"{MIX_PREFIX}{b:g}" for b in budgets]
    return CrossModelResult(list(model_names), list(schemes) + mixes, corpus.load_corpus(corpus_name).name, max_windows,
                            stride, threshold, sweeps, {"total_s": time.perf_counter() - t0, **seconds}, engine or None)


def engine_sweep(menu: list[str], engine: str, model: str, corpus_name: str, device: str | None, dtype: str | None,
                 threshold: float, stride: int, max_windows: int | None, context_length: int | None,
                 verbose: bool) -> dict[str, Any]:
    """One model's engine tables (kvlib.runs.engines.engine_tables) over the zoo's windows, measured
    as ``kv-validate --engine`` measures them: the engine's mode, calibrated scale twins, the prefix
    mode beside a write-mode verdict. The cheapest passes are not re-run on fresh windows here
    (the CLI's --confirm-windows does that)."""
    mode = engine_mode(engine)
    r = run_sweep(menu, model=model, corpus_name=corpus_name, device=device, dtype=dtype, threshold=threshold,
                  stride=stride, max_windows=max_windows, context_length=context_length, peers=False,
                  verbose=verbose, progress=verbose, checks=DecodingChecks(), mode=mode, calibrate_scales=True,
                  beside="prefix" if mode == "write" else None)
    return r.engines


def attach_ruler(result: CrossModelResult, paths: list[str | os.PathLike]) -> None:
    """Saved RULER runs (``kv-validate --ruler --json``) beside the sweeps of the models they ran on:
    runs of one model merge (lengths, tasks or schemes; where they overlap they must agree); ValueError names
    a file that matches no model."""
    by_model: dict[int, list[RulerResult]] = {}
    for path in paths:
        try:
            r = RulerResult.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a kvlib RULER result ({type(e).__name__}: {e})") from None
        name = r.config.get("model")
        hits = [i for i, sw in enumerate(result.sweeps) if name in (sw["model"], sw.get("model_spec"))]
        if not hits:
            known = ", ".join(sw.get("model_spec", sw["model"]) for sw in result.sweeps)
            raise ValueError(f"{path}: a RULER run of {name!r}, which is not among the models ({known})")
        by_model.setdefault(hits[0], []).append(r)
    for i, runs in by_model.items():
        result.sweeps[i]["ruler"] = RulerResult.merge(runs).to_dict()


def ruler_points(sweeps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """(model, scheme, length) rows of the RULER runs beside the sweeps: the average over the tasks
    the exact cache qualifies on, its CI, and how many tasks that is."""
    rows = []
    for sw in sweeps:
        d = sw.get("ruler")
        if not d:
            continue
        r = RulerResult.from_dict(d)
        for n in r.lengths:
            tasks, q = r.run_and_qualifying(n)
            for name, meta in r.schemes.items():
                acc, lo, hi = r.average(name, n, qualifying_only=True) if q else (math.nan,) * 3
                rows.append({"model": sw.get("model_spec", sw["model"]), "scheme": name, "kind": meta["kind"],
                             "length": n, "accuracy": acc, "ci_low": lo, "ci_high": hi, "qualifying": q,
                             "tasks": len(tasks)})
    return rows


def points(sweeps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """(model, scheme) rows of every sweep, schemes that ran only."""
    rows = []
    for sw in sweeps:
        for s in sw["schemes"]:
            if s.get("error"):
                continue
            rows.append({"model": sw.get("model_spec", sw["model"]), "scheme": s["name"], "kind": s["kind"],
                         "bits": s["bits_per_element"], "delta": s["context_delta"], "ci_low": s["ci_low"],
                         "ci_high": s["ci_high"], "kld": s["kld_mean"], "top1": s["top1_agreement"],
                         "key_snr": (s.get("keys") or {}).get("snr_db", math.nan),
                         "value_snr": (s.get("values") or {}).get("snr_db", math.nan),
                         "passed": s["passed"], "robust": s["robust"]})
    return rows


def snr_correlation(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Does SNR predict the damage? Rank correlation of key/value SNR with KLD, pooled over
    every (model, scheme) and within each model. KLD, not delta: it is never negative and
    does not saturate at the noise floor. A good predictor gives strongly negative values."""
    out: dict[str, Any] = {"pooled": {}, "per_model": {}}
    for role in ("key_snr", "value_snr"):
        out["pooled"][role] = spearman([r[role] for r in rows], [r["kld"] for r in rows])
    for m in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == m]
        out["per_model"][m] = {role: spearman([r[role] for r in mine], [r["kld"] for r in mine])
                               for role in ("key_snr", "value_snr")}
    return out

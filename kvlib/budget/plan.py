"""Mixed precision under a bit budget, end to end: calibration windows, the sensitivity pass,
the exact allocation, and the check that the slots' costs predict the mix's.

``plan_mixes`` returns the mixed codecs (one per budget) for the sweep to validate on the
evaluation windows like any other scheme, and a ``BudgetResult`` for the report. The sensitivity
table is a unit of the results store: a rerun reads it instead of measuring it again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kvlib.models import corpus as corpora
from kvlib.budget.allocate import Allocation, allocate
from kvlib.codec.spec import CodecConfig, preset_bits, resolve_codec
from kvlib.scoring.perplexity import plan_windows
from kvlib.scoring.provenance import RunIdentity, ids_digest
from kvlib.budget.pricing import measure_sensitivity
from kvlib.budget.sensitivity import (CalibrationConfig, Sensitivity, calibration_window, measure_mix, resolve_candidates)
from kvlib.scoring.store import ResultsStore, unit_key
from kvlib.transforms.codec import cache_transforms


@dataclass
class Calibration:
    """The calibration tokens and where they come from."""

    ids: torch.Tensor  # [1, N]
    starts: list[int]  # each window's first token
    description: str


@dataclass
class MixCheck:
    """One budget's allocation and how its predicted KL compares with the measured one."""

    allocation: Allocation
    measured_kl: float  # the mix's mean KL on the calibration windows

    def to_dict(self) -> dict[str, Any]:
        return {**self.allocation.to_dict(), "measured_kl": self.measured_kl}


@dataclass
class BudgetResult:
    """What the report shows of the budget planning."""

    calibration: str  # CalibrationConfig.to_string()
    sensitivity: Sensitivity
    mixes: list[MixCheck] = field(default_factory=list)
    reused: bool = False  # the sensitivity table came from the results store
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"calibration": self.calibration, "sensitivity": self.sensitivity.to_dict(),
                "mixes": [m.to_dict() for m in self.mixes], "reused": self.reused, "seconds": self.seconds}


def calibration_tokens(cfg: CalibrationConfig, eval_corpus: corpora.Corpus, eval_ids: torch.Tensor, tokenizer: Any,
                       length: int, stride: int, max_windows: int | None,
                       evaluated_length: int | None = None) -> Calibration:
    """Calibration windows of ``length`` tokens that never overlap the evaluated ones (windows of
    ``evaluated_length``, default ``length``): the embedded corpus when another is evaluated
    ("auto"), a named corpus, or else the evaluated corpus's tokens after its last evaluated window
    (ValueError when there are not enough)."""
    if cfg.corpus == "auto":
        text = corpora.load_corpus(corpora.EMBEDDED) if eval_corpus.name != corpora.EMBEDDED_NAME else eval_corpus
    else:
        text = corpora.load_corpus(cfg.corpus)
    same = text.name == eval_corpus.name
    ids = eval_ids if same else corpora.tokenize(tokenizer, text)
    first = plan_windows(eval_ids.shape[1], evaluated_length or length, stride, max_windows)[-1].end if same else 0
    starts = [first + i * length for i in range(cfg.windows)]
    if starts[-1] + length > ids.shape[1]:
        where = f"after the evaluated windows (token {first})" if same else ""
        raise ValueError(f"calibration: {text.name} has {ids.shape[1]} tokens, too few for {cfg.windows} windows of "
                         f"{length} {where}; evaluate fewer windows or name another calibration corpus")
    spans = ", ".join(f"[{s}, {s + length})" for s in starts)
    return Calibration(ids, starts, f"{text.name}, tokens {spans} (scored: the last {cfg.targets} of each)")


def sensitivity_key(identity: RunIdentity, cal: Calibration, cfg: CalibrationConfig, codecs: list[CodecConfig],
                    length: int, context: int | None = None) -> dict[str, Any]:
    """The identity of a sensitivity table: the run's model, precision and code, the calibration
    tokens, window length, context, targets, the candidates and the measure."""
    return {"model": identity.model, "dtype": identity.dtype, "device": identity.device,
            "tokenizer": identity.tokenizer, "code": identity.code, "versions": identity.versions,
            "unit": "sensitivity", "tokens": ids_digest(cal.ids), "starts": cal.starts, "length": length,
            "context": context, "targets": cfg.targets, "candidates": [c.spec for c in codecs],
            "measure": cfg.measure, **({"heads": True} if cfg.heads else {})}


@dataclass
class _Planning:
    """One planning run's shared state: the model, the calibration windows (run once, when
    first needed), and the results store with the sensitivity table's key."""

    load: Callable[[], Any]
    cfg: CalibrationConfig
    cal: Calibration
    length: int
    workdir: Any
    model_name: str
    store: ResultsStore | None
    key: dict[str, Any] | None
    say: Callable[..., None]
    context: int | None = None  # the evaluated windows' context tokens: the layout the budget is met on
    windows: list[Any] = field(default_factory=list)

    def calibration_windows(self) -> list[Any]:
        if not self.windows:
            with torch.no_grad():
                self.windows.extend(calibration_window(self.load(), self.cal.ids, s, self.length, self.cfg.targets,
                                                       self.context) for s in self.cal.starts)
        return self.windows

    def stored(self, key: dict[str, Any] | None) -> dict[str, Any] | None:
        return self.store.get(unit_key(key)) if self.store is not None and key is not None else None

    def keep(self, key: dict[str, Any] | None, body: dict[str, Any]) -> None:
        if self.store is not None and key is not None:
            self.store.put(key, body)

    def sensitivity(self, codecs: list[CodecConfig], progress: bool) -> tuple[Sensitivity, bool]:
        """The table, from the store or measured now (and stored); whether it was reused."""
        unit = self.stored(self.key)
        if unit is not None:
            self.say(f"Sensitivity: read from the results store ({self.cal.description})")
            return Sensitivity.from_dict(unit["sensitivity"]), True
        self.say(f"Sensitivity of {len(codecs)} candidates ({', '.join(c.name for c in codecs)}) per layer and role "
                 f"on {self.cal.description}, measure {self.cfg.measure}...")
        ts, _ = cache_transforms(codecs, self.workdir, self.model_name)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(desc="sensitivity", unit="forward")
        tick = (lambda done, total: (setattr(bar, "total", total), bar.update(done - bar.n))) if bar is not None else None
        with torch.no_grad():
            sens = measure_sensitivity(self.load(), self.calibration_windows(), codecs, ts, self.cal.description, tick,
                                       self.cfg.measure, self.cfg.heads)
        if bar is not None:
            bar.close()
        head = f", the LM head on {sens.head_tokens} tokens" if sens.measure == "fast" else ""
        self.say(f"  {sens.forwards} suffix forwards in {sens.seconds:.1f} s "
                 f"(prefix reuse ran {100 * sens.layers_run:.0f} % of the decoder layers{head})")
        self.keep(self.key, {"sensitivity": sens.to_dict()})
        return sens, False

    def measured_kl(self, mix: CodecConfig) -> float:
        """The mix's KL on the calibration windows, from the store or measured now (and stored)."""
        key = {**self.key, "unit": "mix", "mix": mix.spec} if self.key is not None else None
        unit = self.stored(key)
        if unit is not None:
            return float(unit["measured_kl"])
        ts, _ = cache_transforms([mix], self.workdir, self.model_name)
        with torch.no_grad():
            measured = measure_mix(self.load(), self.calibration_windows(), mix, ts)
        self.keep(key, {"measured_kl": measured})
        return measured


def plan_mixes(load: Callable[[], Any], cfg: CalibrationConfig, budgets: list[float], cal: Calibration,
               length: int, workdir: Any, model_name: str, store: ResultsStore | None = None,
               identity: RunIdentity | None = None, say: Callable[..., None] = print, progress: bool = False,
               context: int | None = None) -> tuple[list[CodecConfig], BudgetResult]:
    """The mixed codec of each budget, and what the report shows of how they were chosen;
    ``context``: the evaluated windows' context tokens, so that the calibration caches (and the
    bits the budget is met with) have the evaluated layout (default: all but the targets)."""
    t0 = time.perf_counter()
    codecs = resolve_candidates(cfg.candidates)
    key = sensitivity_key(identity, cal, cfg, codecs, length, context) if identity is not None else None
    run = _Planning(load, cfg, cal, length, workdir, model_name, store, key, say, context)
    sens, reused = run.sensitivity(codecs, progress)
    result = BudgetResult(cfg.to_string(), sens, reused=reused)
    mixes = []
    for b in budgets:
        a = allocate(sens, b)
        mix = resolve_codec(a.spec)
        measured = run.measured_kl(mix)
        say(f"Budget {b:g} bits/element: {a.bits:.3f} stored, KL predicted {a.predicted_kl:.4f}, measured "
            f"{measured:.4f} on the calibration windows\n  --scheme '{mix.spec}'")
        result.mixes.append(MixCheck(a, measured))
        mixes.append(mix)
    result.seconds = time.perf_counter() - t0
    return mixes, result


def sensitivity_table(load: Callable[[], Any], cfg: CalibrationConfig, cal: Calibration, length: int, workdir: Any,
                      model_name: str, store: ResultsStore | None = None, identity: RunIdentity | None = None,
                      say: Callable[..., None] = print, progress: bool = False, context: int | None = None,
                      codecs: list[CodecConfig] | None = None) -> tuple[Sensitivity, bool]:
    """The sensitivity table alone (no allocation), from the store or measured now (and stored), and
    whether it was reused. ``codecs``: what it prices (default the calibration's candidates); one
    with per-layer overrides is priced as it is (an engine format spelled on every layer)."""
    codecs = resolve_candidates(cfg.candidates) if codecs is None else codecs
    key = sensitivity_key(identity, cal, cfg, codecs, length, context) if identity is not None else None
    return _Planning(load, cfg, cal, length, workdir, model_name, store, key, say, context).sensitivity(codecs, progress)


def similar_presets(budgets: list[float], within: float = 1.0) -> list[str]:
    """The presets a mix is compared with when none are named: those within ``within`` bits per
    element of a budget."""
    return [name for name, bits in preset_bits().items() if any(abs(bits - b) <= within for b in budgets)]


def parse_budgets(text: str | float | None) -> list[float]:
    """"3.25" or "3.25,4.25" as bits per element (ValueError for anything else)."""
    if text is None or text == "":
        return []
    if isinstance(text, (int, float)):
        vals = [float(text)]
    else:
        try:
            vals = [float(x) for x in str(text).split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"budget {text!r}: want bits per element, e.g. 3.25 or 3.25,4.25") from None
    for v in vals:
        if not 1 <= v <= 16:
            raise ValueError(f"budget {v:g} bits/element is outside [1, 16]")
    return vals


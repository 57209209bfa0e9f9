"""A scoring run as independent units: per window, its baseline and each scheme's result.
``ScoringPlan`` names every unit by its content key, finds the finished ones in a results
store, records new ones as they finish, and merges them all, in window order, into the same
PerplexityResults a single uninterrupted pass gives, whatever computed them and when.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvlib.codec.metrics import CompressionMetrics
from kvlib.scoring.perplexity import PerplexityResult, Window, WindowResult, summarize
from kvlib.scoring.provenance import RunIdentity
from kvlib.scoring.store import ResultsStore, unit_key

# One scheme's outcome on one window: its WindowResult and codec metrics (None: no codec ran).
Outcome = tuple[WindowResult, "CompressionMetrics | None"]


def encode(outcome: Outcome) -> dict[str, Any]:
    """A unit's body: plain JSON values (floats round-trip exactly)."""
    wr, m = outcome
    return {"result": asdict(wr), "metrics": m.to_dict() if m is not None else None}


def decode(body: dict[str, Any]) -> Outcome:
    m = body.get("metrics")
    return WindowResult(**body["result"]), (CompressionMetrics.from_dict(m) if m is not None else None)


@dataclass
class ScoringPlan:
    """The units of one scoring run: ``windows`` × ``specs`` (name → canonical spec)."""

    identity: RunIdentity
    windows: list[Window]
    specs: dict[str, str]

    def _window(self, index: int) -> Window:
        return next(w for w in self.windows if w.index == index)

    def lookup(self, store: ResultsStore | None) -> tuple[dict[tuple[int, str], Outcome], dict[int, list[str]]]:
        """The finished units (by window index and name) and, per window, the names still missing."""
        done: dict[tuple[int, str], Outcome] = {}
        missing: dict[int, list[str]] = {}
        for w in self.windows:
            for name, spec in self.specs.items():
                unit = store.get(unit_key(self.identity.scheme(w, spec))) if store is not None else None
                if unit is None:
                    missing.setdefault(w.index, []).append(name)
                else:
                    done[w.index, name] = decode(unit)
        return done, missing

    def record(self, store: ResultsStore | None, index: int, outcomes: dict[str, Outcome]) -> None:
        """Store one window's new outcomes: its baseline and each scheme's result."""
        if store is None:
            return
        w = self._window(index)
        first = next(iter(outcomes.values()))[0]
        store.put(self.identity.window(w), {"baseline_nll": first.baseline_nll, "num_targets": w.num_targets,
                                            "context_tokens": first.context_tokens})
        for name, outcome in outcomes.items():
            store.put(self.identity.scheme(w, self.specs[name]), encode(outcome))

    def merge(self, done: dict[tuple[int, str], Outcome], seconds: float) -> dict[str, PerplexityResult]:
        """Every scheme's PerplexityResult from its units, in window order."""
        out = {}
        for name in self.specs:
            got = [done[w.index, name] for w in self.windows]
            out[name] = summarize([r for r, _ in got], [m for _, m in got if m is not None],
                                  self.identity.context_length, self.identity.stride, seconds)
        return out


@dataclass
class CheckUnits:
    """A decoding check's units (one per scheme and batch of prompts): what the store holds, and
    where new ones go. Without a store or identity, nothing is found and nothing is kept."""

    store: ResultsStore | None
    identity: RunIdentity | None
    check: str  # "retrieval" or "agreement"

    def _ident(self, inputs: str, scheme: str) -> dict[str, Any]:
        assert self.identity is not None
        return self.identity.decoding(self.check, inputs, scheme)

    def get(self, inputs: str, scheme: str) -> dict[str, Any] | None:
        if self.store is None or self.identity is None:
            return None
        return self.store.get(unit_key(self._ident(inputs, scheme)))

    def put(self, inputs: str, scheme: str, body: dict[str, Any]) -> None:
        if self.store is not None and self.identity is not None:
            self.store.put(self._ident(inputs, scheme), body)

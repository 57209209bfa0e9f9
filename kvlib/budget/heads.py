"""Per-head sensitivity: does one KV head of a slot cost far more than another?

A per-head allocation only pays where a (layer, role) slot's heads differ by an order of magnitude.
This prices each head alone: the exact cache with only that head of that slot replaced by a
candidate's reconstruction, by the same measures as the slots (``kvlib.budget.pricing``). The heads
of a slot add up to about the slot's own cost, not exactly: the KL is quadratic in the change, and
heads' cross terms are of the same order (Qwen2.5's layer-0 keys: 0.066 + 0.087 alone, 0.663 together).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable


from kvlib.budget.allocate import solve
from kvlib.budget.pricing import PRICERS, KV
from kvlib.budget.sensitivity import ROLES, CalibrationWindow, Sensitivity, reconstructions
from kvlib.cache.layout import cache_layers
from kvlib.codec.spec import CodecConfig

SPREAD = 10.0  # "an order of magnitude": the ratio of a slot's costliest head to its cheapest


@dataclass
class HeadSensitivity:
    """``kl[layer][role][head]``: mean nats per target with only that head under ``candidate``."""

    candidate: str
    kl: list[list[list[float]]]
    calibration: str
    targets: int
    measure: str
    seconds: float = 0.0
    forwards: int = 0

    def spread(self, layer: int, role: int) -> float:
        """The slot's costliest head over its cheapest (inf when the cheapest costs nothing)."""
        heads = self.kl[layer][role]
        lo, hi = min(heads), max(heads)
        return hi / lo if lo > 0 else (math.inf if hi > 0 else 1.0)

    def spread_slots(self, threshold: float = SPREAD) -> list[tuple[int, int]]:
        """The (layer, role) slots whose heads differ by ``threshold`` or more."""
        return [(layer, r) for layer in range(len(self.kl)) for r in range(len(ROLES))
                if len(self.kl[layer][r]) > 1 and self.spread(layer, r) >= threshold]

    def share(self, slots: list[tuple[int, int]]) -> float:
        """Those slots' part of the whole cache's cost (every head of every slot summed)."""
        total = sum(sum(h) for layer in self.kl for h in layer)
        return sum(sum(self.kl[layer][r]) for layer, r in slots) / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def head_variants(exact: list[KV], recon: list[KV], layer: int) -> list[KV]:
    """The layer's (key, value) with one head of one role replaced: each key head, then each value head."""
    k, v = exact[layer]
    rk, rv = recon[layer]
    out = []
    for role, (x, r) in enumerate(((k, rk), (v, rv))):
        for h in range(x.shape[1]):
            y = x.clone()
            y[:, h] = r[:, h]
            out.append((y, v) if role == 0 else (k, y))
    return out


def measure_heads(model: Any, windows: list[CalibrationWindow], codec: CodecConfig, transform: Any,
                  calibration: str, measure: str = "fast",
                  progress: Callable[[int, int], None] | None = None) -> HeadSensitivity:
    """Every head of every slot priced alone under ``codec`` on ``windows``, by ``measure``."""
    t0 = time.perf_counter()
    pricer = PRICERS[measure]()
    nl = len(windows[0].context.layers)
    kl: list[list[list[float]]] = []
    done = 0
    for w in windows:
        exact = cache_layers(w.context)
        recon = reconstructions(w, {codec.name: transform})[codec.name][0]
        pricer.prepare(model, w)
        for layer in range(nl):
            costs = pricer.price(model, w, exact, layer, head_variants(exact, recon, layer))
            heads = exact[layer][0].shape[1]
            if len(kl) <= layer:
                kl.append([[0.0] * heads for _ in ROLES])
            for r in range(len(ROLES)):
                for h in range(heads):
                    kl[layer][r][h] += costs[r * heads + h] / len(windows)
            done += 1
            if progress is not None:
                progress(done, nl * len(windows))
        del recon
    return HeadSensitivity(candidate=codec.spec, kl=kl, calibration=calibration,
                           targets=sum(w.logp.shape[0] for w in windows), measure=measure,
                           seconds=time.perf_counter() - t0, forwards=pricer.forwards)


def per_head_estimate(s: Sensitivity, heads: HeadSensitivity, budget: float, scale: int = 16) -> tuple[float, float]:
    """What a per-head allocation would buy at ``budget`` bits per element, estimated: (the slot
    allocation's predicted KL, the per-head one's). A head's cost under a candidate is taken as
    its slot's times the head's share of the slot under ``heads.candidate``; its bytes, a 1/H
    share of the slot's; both knapsacks exact, sizes in units of ``scale`` bytes."""
    elements = sum(s.elements[layer][r] for layer in range(s.num_layers) for r in range(len(ROLES)))
    capacity = math.floor(budget * elements / 8 / scale)
    slot_costs, slot_sizes, head_costs, head_sizes = [], [], [], []
    for layer in range(s.num_layers):
        for r in range(len(ROLES)):
            kl, nbytes = s.kl[layer][r], s.stored_bytes[layer][r]
            slot_costs.append(kl)
            slot_sizes.append([b // scale for b in nbytes])
            shares = heads.kl[layer][r]
            total = sum(shares)
            for h in shares:
                share = h / total if total > 0 else 1 / len(shares)
                head_costs.append([c * share for c in kl])
                head_sizes.append([b // len(shares) // scale for b in nbytes])
    slots, per_head = solve(slot_costs, slot_sizes, capacity), solve(head_costs, head_sizes, capacity)
    if slots is None or per_head is None:
        raise ValueError(f"budget {budget} bits/element is below the cheapest candidates'")
    return slots[1], per_head[1]

"""A mixed-precision cache under a bit budget: one candidate scheme per (layer, role) slot.

The choice minimises the summed slot costs (``Sensitivity.kl``) subject to the stored bits per
element, over all slots and weighted by the elements each holds, being at most the budget. It is
solved exactly, as a multiple-choice knapsack over the slots' stored bytes: a dynamic programme
over partial choices that keeps, for each total size, only the cheapest in cost, and drops any
choice that another beats in both size and cost (which cannot be part of a better solution).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from kvlib.codec.spec import CodecConfig, resolve_codec
from kvlib.budget.sensitivity import ROLES, Sensitivity, resolve_candidates


@dataclass(frozen=True)
class Allocation:
    """The chosen candidate of each slot, and what the choice predicts and costs."""

    budget: float  # bits per element allowed
    choice: tuple[tuple[int, int], ...]  # per layer: the candidate index of (key, value)
    bits: float  # bits per element the choice stores
    predicted_kl: float  # the sum of the chosen slots' costs (nats per target)
    spec: str  # the per-layer spec that stores this choice (canonical)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _slots(s: Sensitivity) -> list[tuple[int, int]]:
    return [(layer, r) for layer in range(s.num_layers) for r in range(len(ROLES))]


def solve(costs: list[list[float]], sizes: list[list[int]], capacity: int) -> tuple[list[int], float, int] | None:
    """The exact multiple-choice knapsack: one option per item, total size <= capacity, least
    total cost (ties: the smaller size, then the lower options in item order). None when no
    choice fits. Returns (option per item, cost, size)."""
    # states: size -> (cost, back-pointer); back-pointer = (option, previous state) as a linked list
    states: dict[int, tuple[float, Any]] = {0: (0.0, None)}
    for cs, ss in zip(costs, sizes):
        nxt: dict[int, tuple[float, Any]] = {}
        for size, (cost, back) in states.items():
            for j, (c, s) in enumerate(zip(cs, ss)):
                t = size + s
                if t > capacity:
                    continue
                cand = (cost + c, (j, back))
                if t not in nxt or cand[0] < nxt[t][0]:
                    nxt[t] = cand
        # Pareto pruning: by size ascending, keep a state only if it is cheaper than every smaller one.
        states, best = {}, math.inf
        for t in sorted(nxt):
            if nxt[t][0] < best:
                states[t], best = nxt[t], nxt[t][0]
        if not states:
            return None
    size = min(states, key=lambda t: (states[t][0], t))
    cost, back = states[size]
    picks: list[int] = []
    while back is not None:
        picks.append(back[0])
        back = back[1]
    return picks[::-1], cost, size


def spec_of(s: Sensitivity, codecs: list[CodecConfig], choice: list[int]) -> CodecConfig:
    """The per-layer spec of a choice: each role's most common scheme as its default (the
    cheaper on ties), the other slots as overrides, then the candidates' entropy stage if any;
    canonical, from the CLI."""
    defaults, overrides = [], []
    for r, role in enumerate(ROLES):
        schemes = [c.key if role == "key" else c.value for c in codecs]
        picks = [choice[layer * len(ROLES) + r] for layer in range(s.num_layers)]
        counts = Counter(picks)
        default = min(counts, key=lambda j: (-counts[j], s.bits(0, r, j), j))
        defaults.append(f"{role[0]}={schemes[default].spec}")
        overrides += [f"{role[0]}{layer}={schemes[j].spec}" for layer, j in enumerate(picks) if j != default]
    return resolve_codec(",".join(defaults + overrides) + codecs[0].entropy_suffix)


def allocate(s: Sensitivity, budget: float) -> Allocation:
    """The least predicted KL under ``budget`` bits per element (ValueError when even the
    cheapest candidate of every slot exceeds it)."""
    slots = _slots(s)
    costs = [s.kl[layer][r] for layer, r in slots]
    sizes = [s.stored_bytes[layer][r] for layer, r in slots]
    elements = sum(s.elements[layer][r] for layer, r in slots)
    capacity = math.floor(budget * elements / 8 + 1e-9)
    found = solve(costs, sizes, capacity)
    if found is None:
        cheapest = 8 * sum(min(x) for x in sizes) / elements
        raise ValueError(f"budget {budget} bits/element is below the cheapest candidates' {cheapest:.3f}")
    picks, cost, size = found
    codecs = resolve_candidates(tuple(s.candidates))
    mix = spec_of(s, codecs, picks)
    choice = tuple((picks[2 * layer], picks[2 * layer + 1]) for layer in range(s.num_layers))
    return Allocation(budget=budget, choice=choice, bits=8 * size / elements, predicted_kl=cost, spec=mix.spec)

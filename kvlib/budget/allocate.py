"""A mixed-precision cache under a bit budget: one candidate scheme per (layer, role) slot.

The choice minimises the summed slot costs (``Sensitivity.kl``) subject to the stored bits per
element, over all slots and weighted by the elements each holds, being at most the budget. It is
solved exactly, as a multiple-choice knapsack over the slots' stored bytes: a dynamic programme
over partial choices that keeps, for each total size, only the cheapest in cost, and drops any
choice that another beats in both size and cost (which cannot be part of a better solution).

With per-head costs (``Sensitivity.head_kl``, ``--calibration 'heads=on'``) the items are the KV
heads of every slot, each priced alone, each storing its slot's bytes over its heads (kv-compress
stores such a slot a head at a time: ``k3h1=SCHEME``); the same knapsack, its sizes rounded up to
``HEAD_UNITS`` units of the budget so that it stays small, and so the choice never stores more
than the budget where a head part stores its share of the slot exactly (a fixed-rate code; with
an entropy stage each part codes with its own tables, and the stored bits, which the validation
prints beside the asked ones, may exceed the plan's). A head is priced with the candidate's reconstruction of the whole tensor, which is
what its part stores except for a candidate with outliers or sparsity (a part selects its fraction
of the head): the validated mix is what kv-compress stores either way.
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
    # per layer, per role, the candidate of each KV head (a per-head allocation; choice then holds each
    # slot's most common one, its spec's slot scheme)
    head_choice: tuple[tuple[tuple[int, ...], ...], ...] = ()

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


HEAD_UNITS = 200_000  # the per-head knapsack's capacity in size units


def _slot_pick(s: Sensitivity, layer: int, r: int, heads: list[int]) -> int:
    """A slot's scheme under a per-head choice: its heads' most common candidate (the cheaper on ties)."""
    counts = Counter(heads)
    return min(counts, key=lambda j: (-counts[j], s.bits(layer, r, j), j))


def spec_of(s: Sensitivity, codecs: list[CodecConfig], choice: list[int],
            heads: list[list[list[int]]] | None = None) -> CodecConfig:
    """The per-layer spec of a choice: each role's most common scheme as its default (the
    cheaper on ties), the other slots as overrides, each head whose candidate (``heads[layer][role]``)
    is not its slot's as a head override, then the candidates' entropy stage if any; canonical, from
    the CLI."""
    defaults, overrides = [], []
    for r, role in enumerate(ROLES):
        schemes = [c.key if role == "key" else c.value for c in codecs]
        picks = [choice[layer * len(ROLES) + r] for layer in range(s.num_layers)]
        counts = Counter(picks)
        default = min(counts, key=lambda j: (-counts[j], s.bits(0, r, j), j))
        defaults.append(f"{role[0]}={schemes[default].spec}")
        overrides += [f"{role[0]}{layer}={schemes[j].spec}" for layer, j in enumerate(picks) if j != default]
        for layer in range(s.num_layers) if heads else ():
            overrides += [f"{role[0]}{layer}h{h}={schemes[j].spec}" for h, j in enumerate(heads[layer][r])
                          if j != picks[layer]]
    return resolve_codec(",".join(defaults + overrides) + codecs[0].entropy_suffix)


def allocate(s: Sensitivity, budget: float) -> Allocation:
    """The least predicted KL under ``budget`` bits per element (ValueError when even the
    cheapest candidate of every slot exceeds it); per head when the table prices heads."""
    if s.head_kl:
        return _allocate_heads(s, budget)
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


def _allocate_heads(s: Sensitivity, budget: float) -> Allocation:
    """The least predicted KL under ``budget`` with one candidate per KV head (module docstring)."""
    if not budget > 0:
        raise ValueError(f"budget {budget} bits/element: want a positive number")
    items = [(layer, r, h) for layer, r in _slots(s) for h in range(len(s.head_kl[layer][r]))]
    elements = sum(s.elements[layer][r] for layer, r in _slots(s))
    allowed = budget * elements / 8  # bytes

    def head_bytes(layer: int, r: int, c: int) -> float:
        return s.stored_bytes[layer][r][c] / len(s.head_kl[layer][r])

    unit = allowed / HEAD_UNITS
    costs = [s.head_kl[layer][r][h] for layer, r, h in items]
    sizes = [[math.ceil(head_bytes(layer, r, c) / unit - 1e-9) for c in range(len(s.candidates))] for layer, r, _ in items]
    found = solve(costs, sizes, HEAD_UNITS)
    if found is None:
        cheapest = 8 * sum(min(s.stored_bytes[layer][r]) for layer, r in _slots(s)) / elements
        raise ValueError(f"budget {budget} bits/element is below the cheapest candidates' {cheapest:.3f} "
                         f"(per head, sizes rounded up to {unit:.1f}-byte units)")
    picks, cost, _ = found
    heads: list[list[list[int]]] = [[[] for _ in ROLES] for _ in range(s.num_layers)]
    for (layer, r, _), j in zip(items, picks):
        heads[layer][r].append(j)
    slot = [_slot_pick(s, layer, r, heads[layer][r]) for layer, r in _slots(s)]
    mix = spec_of(s, resolve_candidates(tuple(s.candidates)), slot, heads)
    stored = sum(head_bytes(layer, r, j) for (layer, r, _), j in zip(items, picks))
    choice = tuple((slot[2 * layer], slot[2 * layer + 1]) for layer in range(s.num_layers))
    return Allocation(budget=budget, choice=choice, bits=8 * stored / elements, predicted_kl=cost, spec=mix.spec,
                      head_choice=tuple(tuple(tuple(hs) for hs in roles) for roles in heads))

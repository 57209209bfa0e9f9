"""Budgets over the knobs an engine really has: the cheapest setting of them that passes, measured
in write mode (as the engine writes its cache), printed as the flags to pass.

An engine's knobs are a class in ``KNOBS``: it lists its settings, each a kv-compress spec with the
engine's flags and its nominal bits per element. The search validates them in order of bits, a
level of equal bits at a time (one sweep each, so the results store keeps every unit), and stops at
the first level where one passes robustly (the CI's upper bound under the gate): the cheapest
robust setting. Settings past that level are never run.

llama.cpp (``-ctk``/``-ctv``, llama.cpp 0c1e57098 as vendored by llama-cpp-python 0.3.36:
``common/arg.cpp`` takes one cache type for K and one for V, applied to every layer): every
pair of its types, f16 included.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from kvlib.codec.spec import engine_menu, resolve_codec
from kvlib.gates import PPL_DELTA_THRESHOLD


@dataclass(frozen=True)
class Setting:
    """One setting of an engine's knobs."""

    spec: str  # the kv-compress spec that computes it
    flags: str  # as the engine takes it
    bits: float  # nominal bits per element, keys and values averaged


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


KNOBS: dict[str, Callable[[], Any]] = {"llama.cpp": LlamaCppTypes}


@dataclass
class KnobSearch:
    """The settings validated, in order, and the cheapest that passes robustly (None: none did)."""

    engine: str
    mode: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    cheapest: dict[str, Any] | None = None
    untried: int = 0  # settings above the level where the search stopped

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def levels(settings: list[Setting]) -> list[list[Setting]]:
    """The settings grouped by equal bits, fewest first."""
    return [list(g) for _, g in itertools.groupby(settings, key=lambda s: s.bits)]


def cheapest_setting(engine: str, sweep: Callable[[list[str]], Any], say: Callable[..., None] = print,
                     max_bits: float = 16.0) -> KnobSearch:
    """Validate ``engine``'s settings a level at a time with ``sweep`` (a list of specs -> a
    SweepResult in write mode) until one passes robustly."""
    if engine not in KNOBS:
        raise ValueError(f"engine {engine!r}: knob search knows {', '.join(KNOBS)}")
    settings = [s for s in KNOBS[engine]().settings() if s.bits <= max_bits]
    found = KnobSearch(engine, "write")
    groups = levels(settings)
    for i, group in enumerate(groups):
        say(f"{engine}: {len(group)} setting(s) at {group[0].bits:g} bits/element: "
            + ", ".join(s.flags for s in group))
        result = sweep([s.spec for s in group])
        found.mode = result.mode
        by_name = {s.name: s for s in result.schemes}
        for st in group:
            r = by_name[resolve_codec(st.spec).name]
            found.rows.append({"flags": st.flags, "spec": st.spec, "bits_per_element": r.bits_per_element,
                               "context_delta": r.context_delta, "ci_low": r.ci_low, "ci_high": r.ci_high,
                               "kld_mean": r.kld_mean, "robust": r.robust, "passed": r.passed})
        ok = [row for row in found.rows[-len(group):] if row["robust"]]
        if ok:
            found.cheapest = min(ok, key=lambda row: (row["bits_per_element"], row["context_delta"]))
            found.untried = sum(len(g) for g in groups[i + 1:])
            break
    return found


def print_search(s: KnobSearch) -> None:
    print(f"  {s.engine}: settings validated in {s.mode} mode, fewest bits first (gate {PPL_DELTA_THRESHOLD})")
    for r in s.rows:
        verdict = "pass (robust)" if r["robust"] else "pass" if r["passed"] else "FAIL"
        print(f"    {r['flags']:28s} {r['bits_per_element']:6.3f} bits  delta {r['context_delta']:+.4f} "
              f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]  {verdict}")
    if s.cheapest is None:
        print(f"  no setting of {s.engine}'s passes robustly")
    else:
        print(f"  cheapest that passes robustly: {s.cheapest['flags']} ({s.cheapest['bits_per_element']:.3f} bits/element; "
              f"{s.untried} costlier settings not run)")

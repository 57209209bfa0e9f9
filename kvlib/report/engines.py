"""The engine tables of saved ``kv-validate --engine`` runs as markdown, for docs/: each engine's
options with their flags, bits, both modes' deltas and the verdict, then the cheapest option each
engine passes with. Runs of different engines (``--engine llama.cpp``, ``--engine vllm``, ...)
merge into one summary.

``python -m kvlib.report.engines RUN.json [RUN.json ...]`` prints it. The tables are recomputed
from each run's schemes by the code that prints them (kvlib.runs.engines), so a saved run reads
as the current code reads it (bits as the engine stores them, for one).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from typing import Any

from kvlib.gates import MIN_CI_UNITS
from kvlib.runs.engines import engine_tables
from kvlib.runs.sweep import SchemeResult

_FLOATS = {f.name for f in dataclasses.fields(SchemeResult) if f.type in ("float", float)}


def scheme_of(d: dict[str, Any]) -> SchemeResult:
    """A saved scheme row (JSON: NaN saved as null) as the SchemeResult it was."""
    known = {f.name for f in dataclasses.fields(SchemeResult)}
    return SchemeResult(**{k: (math.nan if v is None and k in _FLOATS else v) for k, v in d.items() if k in known})


def tables_of(run: dict[str, Any]) -> dict[str, Any]:
    """A saved run's engine tables, recomputed from its schemes; each row keeps the other mode's
    numbers the run saved beside it."""
    tables = engine_tables([scheme_of(s) for s in run["schemes"]], run["mode"])
    saved_tables = run.get("engines") or {}
    saved = {r["option"]: r for t in saved_tables.values() for r in t["rows"]}
    for engine, t in tables.items():
        for r in t["rows"]:
            r.update({k: v for k, v in saved.get(r["option"], {}).items() if k in ("beside", "confirmation", "confirmed")})
        if saved_tables.get(engine, {}).get("confirmed_on_fresh_windows"):  # the answer held on fresh windows
            t.update({k: saved_tables[engine][k] for k in ("cheapest", "cheapest_flags", "confirmed_on_fresh_windows")})
        t["windows"], t["model"] = run["windows"], run["model"]
    return tables


def _num(v: Any, spec: str) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec).replace("-", "−")


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _ci(lo: Any, hi: Any) -> str:
    """A CI as the tables show it; "(no CI)" where the run had too few windows for one (the note says so)."""
    return "(no CI)" if _missing(lo) and _missing(hi) else f"[{_num(lo, '+.4f')}, {_num(hi, '+.4f')}]"


def _delta(r: dict[str, Any]) -> str:
    """A gated delta with its CI; NaN where the output was (an overflowed cache), not a missing CI."""
    return "NaN" if _missing(r["context_delta"]) else f"{_num(r['context_delta'], '+.4f')} {_ci(r['ci_low'], r['ci_high'])}"


def _row(r: dict[str, Any], cheapest: str | None, beside: bool = True) -> str:
    flags = f"`{r['flags']}`"
    name = f"**`{r['option']}`**" if r["option"] == cheapest else f"`{r['option']}`"
    if r.get("unavailable"):
        return (f"| {name} | {flags} | – | – | – | – | – | – | unavailable for this model: {r['unavailable']} |"
                + (" – |" if beside else ""))
    b = r.get("beside")
    other = _delta(b) if b else "not run"
    c = r.get("confirmation")
    verdict = r["verdict"] + (f"; on {c['windows']} fresh windows {_num(c['context_delta'], '+.4f')} "
                              f"{_ci(c['ci_low'], c['ci_high'])}, {'confirmed' if c['robust'] else 'not confirmed'}"
                              if c else "") + (f": cheapest in {r['option'].split(':')[0]}" if r["option"] == cheapest else "")
    nan = r["context_delta"] is None or math.isnan(r["context_delta"])  # a NaN output: no KLD or top-1 to show
    top1 = "–" if nan else f"{_num(r['top1_agreement'], '.1f')} %"
    return (f"| {name} | {flags} | {r.get('scales') or '–'} | {r['bits_per_element']:.3g} | "
            f"{_delta(r)} | {_num(r['kld_mean'], '.5f')} | "
            f"{top1} | {r.get('saturated', 0) or '–'} | {verdict} |"
            + (f" {other} |" if beside else ""))


def _fresh(r: dict[str, Any]) -> str:
    """The confirmation of an option on fresh windows, as the summary shows it ("not run" without one)."""
    c = r.get("confirmation")
    return (f"{_num(c['context_delta'], '+.4f')} {_ci(c['ci_low'], c['ci_high'])} on {c['windows']}"
            if c else "not run")


def markdown(tables: dict[str, Any]) -> str:
    """Each engine's table (passing options by bits, then the failing, then the unavailable), and
    with more than one engine, the cheapest passing option of each."""
    out, no_ci = [], False
    for engine, t in tables.items():
        rows = sorted(t["rows"], key=lambda r: (bool(r.get("unavailable")), not r.get("robust"),
                                                r.get("bits_per_element", 0), r.get("context_delta", 0)))
        beside = any("beside" in r for r in rows)
        other = f" Δ gated, {'prefix' if t['mode'] == 'write' else 'write'} mode [95 % CI] |" if beside else ""
        out += [f"**{engine}** ({t['version']}; {t['model']}, {t['windows']} windows, verdict in {t['mode']} mode):", "",
                "| option | flags | static scales | bits/el | Δ gated [95 % CI] | KLD | top-1 | clamped | verdict |" + other,
                "|---|---|---|---|---|---|---|---|---|" + ("---|" if beside else ""),
                *(_row(r, t["cheapest"], beside) for r in rows), ""]
        no_ci = no_ci or any(_missing((r.get("beside") or {}).get("ci_low", 0)) for r in rows)
    best = sorted(((next(r for r in t["rows"] if r["option"] == t["cheapest"]), e) for e, t in tables.items()
                   if t["cheapest"]), key=lambda x: (x[0]["bits_per_element"], x[0]["context_delta"]))
    if len(tables) > 1:
        out += ["| engine | cheapest option that passes robustly | flags | bits/el | Δ gated [95 % CI] "
                "| on fresh windows [95 % CI] |", "|---|---|---|---|---|---|"]
        out += [f"| {e} | `{r['option']}` | `{r['flags']}` | {r['bits_per_element']:.3g} | "
                f"{_num(r['context_delta'], '+.4f')} {_ci(r['ci_low'], r['ci_high'])} | {_fresh(r)} |" for r, e in best]
        out += [f"| {e} | none passes robustly | | | | |" for e, t in tables.items() if not t["cheapest"]]
    if no_ci:  # prefix mode scores one window fewer than write mode: the first has no prefix to compress
        out += ["", f"(no CI): fewer than {MIN_CI_UNITS} windows with a compressed context in that mode (prefix "
                "mode's first window has none), so the delta is shown without one."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m kvlib.report.engines RUN.json [RUN.json ...] (kv-validate --engine ... --json)",
              file=sys.stderr)
        return 2
    tables: dict[str, Any] = {}
    for p in paths:
        try:
            with open(p) as f:
                run = json.load(f)
            found = tables_of(run)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"kvlib.report.engines: {p}: not a saved kv-validate --engine run ({type(e).__name__}: {e})",
                  file=sys.stderr)
            return 2
        if set(found) & set(tables):
            print(f"kvlib.report.engines: {p}: engine {sorted(set(found) & set(tables))[0]} is in two runs", file=sys.stderr)
            return 2
        tables.update(found)
    if not tables:
        print(f"kvlib.report.engines: {', '.join(paths)}: no engine option in the run(s) (kv-validate --engine ...)",
              file=sys.stderr)
        return 2
    print(markdown(tables), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

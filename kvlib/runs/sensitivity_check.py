"""The fast sensitivity measure against the full one, on one model, in one run: their cost (suffix
forwards and seconds), how the slots rank (Spearman over every (layer, role, candidate)) and whether
the budgets allot the same mixes. ``make sensitivity-check MODEL=gemma3-270m``. With ``--heads
CANDIDATE``: each KV head priced alone, to see whether a per-head choice would pay.

The calibration is the sweep's own default when WikiText-2 is evaluated (the embedded corpus, two
windows of 2048 tokens, contexts of the prefix mode's 1,535 tokens, the last 128 scored), with the
default candidates; both measures run on the same exact windows and the same reconstructions.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from kvlib.budget.allocate import allocate
from kvlib.budget.heads import SPREAD, measure_heads, per_head_estimate
from kvlib.budget.pricing import measure_sensitivity
from kvlib.budget.sensitivity import ROLES, CalibrationConfig, Sensitivity, calibration_window, resolve_candidates
from kvlib.models import corpus as corpora
from kvlib.models.sources import load_model_and_tokenizer
from kvlib.runs.sweep import write_json
from kvlib.scoring.stats import spearman
from kvlib.transforms.codec import cache_transforms


def flat(s: Sensitivity) -> list[float]:
    return [c for layer in s.kl for role in layer for c in role]


def calibrate(model_name: str, cfg: CalibrationConfig, length: int, stride: int) -> tuple[Any, list, int]:
    """The model and the sweep's default calibration windows on the embedded corpus (contexts of
    the prefix mode's length, so the caches have the evaluated layout)."""
    model, tok = load_model_and_tokenizer(model_name, device="cpu")
    ids = corpora.tokenize(tok, corpora.load_corpus(corpora.EMBEDDED))
    context = length - stride - 1
    with torch.no_grad():
        windows = [calibration_window(model, ids, i * length, length, cfg.targets, context) for i in range(cfg.windows)]
    return model, windows, context


def compare(model_name: str, budgets: tuple[float, ...] = (2.5, 3.25, 4.25), length: int = 2048, stride: int = 512,
            cfg: CalibrationConfig = CalibrationConfig(), say: Any = print) -> dict[str, Any]:
    """Both measures on the same windows; what they cost and whether they agree."""
    model, windows, context = calibrate(model_name, cfg, length, stride)
    codecs = resolve_candidates(cfg.candidates)
    out: dict[str, Any] = {"model": model_name, "candidates": [c.name for c in codecs], "context": context,
                           "targets": cfg.targets, "windows": cfg.windows}
    with torch.no_grad(), tempfile.TemporaryDirectory(prefix="kvlib-sensitivity-") as tmp:
        ts, _ = cache_transforms(codecs, Path(tmp), model_name)
        runs = {}
        for measure in ("full", "fast"):
            say(f"{measure} measure...")
            t0 = time.perf_counter()
            runs[measure] = measure_sensitivity(model, windows, codecs, ts, "embedded", measure=measure)
            out[f"{measure}_s"] = time.perf_counter() - t0
            out[f"{measure}_forwards"] = runs[measure].forwards
    full, fast = runs["full"], runs["fast"]
    out.update(entries=len(flat(full)), spearman=spearman(flat(full), flat(fast)),
               head_tokens=fast.head_tokens, head_tail=fast.head_tail, full=full.to_dict(), fast=fast.to_dict())
    out["allocations"] = []
    for b in budgets:
        try:
            a, f = allocate(full, b), allocate(fast, b)
        except ValueError as e:  # below the cheapest candidates: no allocation to compare
            out["allocations"].append({"budget": b, "error": str(e)})
            continue
        out["allocations"].append({"budget": b, "same": a.choice == f.choice, "full_spec": a.spec, "fast_spec": f.spec,
                                   "full_bits": a.bits, "fast_bits": f.bits,
                                   "slots_differing": sum(x != y for x, y in zip(sum(map(list, a.choice), []),
                                                                                  sum(map(list, f.choice), [])))})
    return out


def head_spread(model_name: str, candidate: str, length: int = 2048, stride: int = 512,
                cfg: CalibrationConfig = CalibrationConfig(), budgets: tuple[float, ...] = ()) -> dict[str, Any]:
    """Each KV head of each slot priced alone under ``candidate`` (the fast measure): which slots'
    heads differ by an order of magnitude, and what share of the cost they hold; with ``budgets``,
    the slots priced under the calibration's candidates too, and what a per-head allocation would
    buy at each budget, estimated (``per_head_estimate``)."""
    model, windows, context = calibrate(model_name, cfg, length, stride)
    codec = resolve_candidates((candidate,))[0]
    codecs = resolve_candidates(cfg.candidates) if budgets else []
    with torch.no_grad(), tempfile.TemporaryDirectory(prefix="kvlib-sensitivity-") as tmp:
        ts, _ = cache_transforms([codec] + [c for c in codecs if c.name != codec.name], Path(tmp), model_name)
        heads = measure_heads(model, windows, codec, ts[codec.name], "embedded", measure=cfg.measure)
        slots = measure_sensitivity(model, windows, codecs, ts, "embedded", measure=cfg.measure) if budgets else None
    wide = heads.spread_slots(SPREAD)
    estimates = [dict(zip(("budget", "slot_kl", "per_head_kl"), (b, *per_head_estimate(slots, heads, b))))
                 for b in budgets]
    return {"model": model_name, "candidate": codec.name, "context": context, "windows": cfg.windows,
            "heads": heads.to_dict(), "threshold": SPREAD, "spread_slots": wide, "spread_share": heads.share(wide),
            "slots": sum(1 for layer in heads.kl for h in layer if len(h) > 1),
            "spreads": [[heads.spread(la, r) for r in range(len(ROLES))] for la in range(len(heads.kl))],
            "estimates": estimates}


def print_spread(r: dict[str, Any]) -> None:
    kl = r["heads"]["kl"]
    print(f"{r['model']}: each KV head alone under {r['candidate']}, {r['windows']} windows, contexts of "
          f"{r['context']} tokens ({r['heads']['forwards']} forwards, {r['heads']['seconds']:.1f} s)")
    if not r["slots"]:
        print("  one KV head per layer: nothing to choose per head")
        return
    print("  layer  role   costliest/cheapest head  head costs (nats)")
    for la, layer in enumerate(kl):
        for ro, costs in enumerate(layer):
            print(f"  {la:5d}  {ROLES[ro]:5s}  {r['spreads'][la][ro]:23.1f}  " + " ".join(f"{c:.2e}" for c in costs))
    print(f"  {len(r['spread_slots'])} of {r['slots']} slots have heads {r['threshold']:g}x apart or more, holding "
          f"{100 * r['spread_share']:.1f} % of the cost")
    for e in r["estimates"]:
        print(f"  budget {e['budget']:g}: predicted KL {e['slot_kl']:.4f} with a scheme per slot, {e['per_head_kl']:.4f} "
              f"per head (estimated: a head's share of its slot as under {r['candidate']})")


def print_comparison(r: dict[str, Any]) -> None:
    print(f"{r['model']}: {len(r['candidates'])} candidates, {r['windows']} windows, contexts of {r['context']} tokens, "
          f"{r['targets']} targets each")
    print(f"  full measure: {r['full_forwards']:5d} forwards, {r['full_s']:8.1f} s")
    print(f"  fast measure: {r['fast_forwards']:5d} forwards, {r['fast_s']:8.1f} s  (the LM head on {r['head_tokens']} "
          f"tokens holding {100 * (1 - r['head_tail']):.2f} % of the exact probability)")
    print(f"  fast / full: forwards {r['fast_forwards'] / r['full_forwards']:.3f}, time {r['fast_s'] / r['full_s']:.3f}")
    print(f"  Spearman over {r['entries']} (layer, role, candidate) costs: {r['spearman']:.4f}")
    for a in r["allocations"]:
        if "error" in a:
            print(f"  budget {a['budget']:g}: {a['error']}")
            continue
        print(f"  budget {a['budget']:g}: {'the same allocation' if a['same'] else 'DIFFERENT allocations'} "
              f"({a['slots_differing']} slots differ; {a['full_bits']:.3f} and {a['fast_bits']:.3f} bits)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvlib.runs.sensitivity_check", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--calibration", default="", help="windows=, targets=, candidates= (the sweep's form)")
    ap.add_argument("--heads", default=None, metavar="CANDIDATE",
                    help="instead: price each KV head alone under CANDIDATE and print how far a slot's heads differ")
    ap.add_argument("--estimate", default="", metavar="BUDGETS",
                    help="with --heads: also what a per-head allocation would buy at these bits per element, estimated")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        cfg = CalibrationConfig.from_string(a.calibration)
        budgets = tuple(float(x) for x in a.estimate.split(",") if x.strip()) if a.estimate else ()
        r = head_spread(a.model, a.heads, cfg=cfg, budgets=budgets) if a.heads else compare(a.model, cfg=cfg)
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"sensitivity-check: error: {e}", file=sys.stderr)
        return 2
    (print_spread if a.heads else print_comparison)(r)
    if a.json:
        write_json(r, a.json)  # an infinite spread (a head that costs nothing) as null
    return 0


if __name__ == "__main__":
    sys.exit(main())

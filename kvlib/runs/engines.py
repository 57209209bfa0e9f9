"""A sweep's results as each engine's menu: per engine, every option as the engine names it, the
flags to pass, bits/element, the gated delta with its CI, KLD, top-1, the verdict, and the cheapest
option that passes (robustly: the CI's upper bound under the gate, as kvlib's recommendation);
across engines, one summary. The menu and flags are kv-compress's (``schemes -engine all``)."""

from __future__ import annotations

from typing import Any, Callable

from kvlib.budget.scales import CALIBRATED
from kvlib.codec.spec import engine_menu


def _scales(name: str, static: bool) -> str:
    """Where a static-scale format's scales come from: none in the checkpoint (1.0), or calibrated."""
    if not static:
        return ""
    return "calibrated k_scale/v_scale in the checkpoint" if name.endswith(CALIBRATED) else "1.0 (none in the checkpoint)"


UNAVAILABLE = "unavailable for this model: "  # a refused scheme's error, then kv-compress's reason
MODEL_DTYPE_BITS = 16.0  # a layer an engine skips stores the model's dtype (fp16/bf16 when serving)


def engine_bits(s: Any) -> float:
    """Bits per element as the engine stores the cache: kvlib's stored bits, but a tensor kept exact
    (a layer vLLM's TurboQuant or --kv-cache-dtype-skip-layers skips: method ``none``) at the model's
    16-bit serving dtype, where a float32 CPU run keeps it in float32."""
    tensors = (s.compression or {}).get("tensors") or []
    if not any(t.get("scheme") == "none" and t.get("bits_per_element", 0) > MODEL_DTYPE_BITS for t in tensors):
        return s.bits_per_element
    bits = sum(t["num_elements"] * (min(t["bits_per_element"], MODEL_DTYPE_BITS) if t.get("scheme") == "none"
                                    else t["bits_per_element"]) for t in tensors)
    return bits / sum(t["num_elements"] for t in tensors)


def _beside(s: Any) -> dict[str, Any]:
    """An option's numbers in the other mode (prefix beside write): the gated delta, its CI, verdict."""
    return {"mode": s.mode, "context_delta": s.context_delta, "ci_low": s.ci_low, "ci_high": s.ci_high,
            "kld_mean": s.kld_mean, "verdict": s.verdict_text, "robust": s.robust}


def engine_tables(schemes: list[Any], mode: str, beside: list[Any] = ()) -> dict[str, Any]:
    """{engine: {"version", "mode", "rows", "cheapest"}} for the schemes that are an engine's option
    (``SCHEME@calibrated``: the option with calibrated static scales); empty when none is. ``beside``:
    the same options scored in the other mode, each row's ``beside`` (the verdict stays ``mode``'s)."""
    menu = {row["name"]: row for row in engine_menu("all")}
    other = {s.name: _beside(s) for s in beside if not s.error}
    tables: dict[str, Any] = {}
    for s in schemes:
        row = menu.get(s.name.removesuffix(CALIBRATED))
        if row is None:
            continue
        t = tables.setdefault(row["engine"], {"version": row["engine_version"], "mode": mode, "rows": []})
        if s.error:  # refused for this model (kvlib.codec.preflight): listed with the engine's reason
            t["rows"].append({"option": s.name, "flags": row["flags"], "scales": "", "evidence": row["evidence"],
                              "unavailable": s.error.removeprefix(UNAVAILABLE),
                              "verdict": "unavailable", "robust": False})
            continue
        t["rows"].append({
            "option": s.name, "flags": row["flags"],
            "scales": _scales(s.name, row["key_scheme"].get("scale", 0) > 0),
            "bits_per_element": engine_bits(s), "stored_bits_per_element": s.bits_per_element,
            "context_delta": s.context_delta, "ci_low": s.ci_low,
            "ci_high": s.ci_high, "kld_mean": s.kld_mean, "top1_agreement": s.top1_agreement,
            "verdict": s.verdict_text, "robust": s.robust, "evidence": row["evidence"],
            "saturated": sum(s.layer_key_saturated) + sum(s.layer_value_saturated),
            **({"beside": other[s.name]} if s.name in other else {})})
    for t in tables.values():
        ok = [r for r in t["rows"] if r["robust"]]
        best = min(ok, key=lambda r: (r["bits_per_element"], r["context_delta"])) if ok else None
        t["cheapest"] = best["option"] if best else None
        t["cheapest_flags"] = (best["flags"] + (f" (scales: {best['scales']})" if best["scales"] else "")) if best else None
    return tables


def confirm_cheapest(tables: dict[str, Any], specs: dict[str, str], confirm: Callable[[list[str]], Any],
                     say: Callable[..., None] = print) -> None:
    """Each engine's cheapest robust option is its answer only once it passes robustly again on
    fresh windows (``confirm``: a sweep of those windows; kvlib.runs.knobs does the same for a
    knob search, for the same reason: the first of many noisy intervals to clear the gate is
    favoured by luck). Robust options are tried fewest bits first until one holds; each tried row
    gets ``confirmation`` (its delta and CI there) and ``confirmed``; ``cheapest`` becomes the
    first that held (None: none did). ``specs``: option name -> the spec it ran as."""
    for engine, t in tables.items():
        t["cheapest"] = t["cheapest_flags"] = None
        ok = sorted((r for r in t["rows"] if r.get("robust")), key=lambda r: (r["bits_per_element"], r["context_delta"]))
        for r in ok:
            res = confirm([specs[r["option"]]])
            s = res.schemes[0]
            r["confirmation"] = {"first_window": res.first_window, "windows": res.windows,
                                 "context_delta": s.context_delta, "ci_low": s.ci_low, "ci_high": s.ci_high,
                                 "robust": s.robust}
            r["confirmed"] = bool(s.robust)
            say(f"  confirming {r['option']} on fresh windows: delta {s.context_delta:+.4f} "
                f"[{s.ci_low:+.4f}, {s.ci_high:+.4f}], {'holds' if s.robust else 'does not hold'}")
            if s.robust:
                t["cheapest"] = r["option"]
                t["cheapest_flags"] = r["flags"] + (f" (scales: {r['scales']})" if r["scales"] else "")
                break
        t["confirmed_on_fresh_windows"] = True


def _ci_text(lo: Any, hi: Any) -> str:
    """A CI as the run prints it; "(no CI)" where there were too few windows for one."""
    return "(no CI)" if lo is None or hi is None or lo != lo or hi != hi else f"[{lo:+.4f}, {hi:+.4f}]"


def print_engine_tables(tables: dict[str, Any]) -> None:
    """Each engine's table, its cheapest passing option, and (with more than one engine) the summary."""
    for engine, t in tables.items():
        w = max(len(r["option"]) for r in t["rows"])
        print(f"  {engine} ({t['version']}), {t['mode']} mode:")
        for r in t["rows"]:
            if r.get("unavailable"):
                print(f"    {r['option']:{w}s} unavailable for this model: {r['unavailable']}")
                continue
            print(f"    {r['option']:{w}s} {r['bits_per_element']:6.3f} b/el  delta {r['context_delta']:+.4f} "
                  f"{_ci_text(r['ci_low'], r['ci_high'])}  {r['verdict']:26s} {r['flags']}"
                  + (f" (scales: {r['scales']})" if r["scales"] else "")
                  + (f"; {b['mode']} mode {b['context_delta']:+.4f} {_ci_text(b['ci_low'], b['ci_high'])}"
                     if (b := r.get("beside")) else "")
                  + (f"; on fresh windows {c['context_delta']:+.4f} [{c['ci_low']:+.4f}, {c['ci_high']:+.4f}]"
                     f" ({'confirmed' if c['robust'] else 'not confirmed'})" if (c := r.get("confirmation")) else ""))
        held = ", confirmed on fresh windows" if t.get("confirmed_on_fresh_windows") else ""
        print(f"  cheapest option that passes in {engine}{held}: "
              + (f"{t['cheapest']} ({t['cheapest_flags']})" if t["cheapest"] else "none"))
    if len(tables) > 1:
        ranked = sorted(((t["rows"][[r["option"] for r in t["rows"]].index(t["cheapest"])], e)
                         for e, t in tables.items() if t["cheapest"]), key=lambda x: (x[0]["bits_per_element"],
                                                                                      x[0]["context_delta"]))
        print("  across engines (cheapest passing option each): " + ("; ".join(
            f"{e}: {r['option']} {r['bits_per_element']:.3f} b/el, delta {r['context_delta']:+.4f}" for r, e in ranked)
            or "none passes robustly"))

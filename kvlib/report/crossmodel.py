"""Tables, plots and readings of the cross-model report (reports/zoo.html), built
from a CrossModelResult or its JSON, so the notebook only calls and displays."""

from __future__ import annotations

import html
import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from kvlib.runs.crossmodel import CrossModelResult, points, ruler_points, snr_correlation
from kvlib.runs.sweep import MIX_PREFIX
from kvlib.gates import CI_LEVEL, RULER_EXACT_FLOOR
from kvlib.report.common import Figure, fmt, html_table, length_label
from kvlib.report.common import timing_table as _timing_table


def _as_dict(result: CrossModelResult | dict[str, Any]) -> dict[str, Any]:
    return result.to_dict() if isinstance(result, CrossModelResult) else result


def geometry_rows(result: CrossModelResult | dict[str, Any]) -> list[list[str]]:
    """Per model: name, KV geometry, layer types, windows scored, baseline perplexity, time."""
    r = _as_dict(result)
    rows = []
    for sw in r["sweeps"]:
        g = sw.get("kv_geometry") or {}
        spec = sw.get("model_spec", sw["model"])
        rows.append([html.escape(spec), html.escape(sw["model"]), str(g.get("num_layers", "?")),
                     f"{g.get('num_kv_heads', '?')} / {g.get('num_query_heads', '?')}", str(g.get("head_dim", "?")),
                     html.escape(g.get("layers", "")), f"{sw['windows']} ({sw['context_scored_tokens']} tokens)",
                     fmt(sw["context_baseline_perplexity"], ".3f"),
                     fmt((r.get("timing") or {}).get(f"{spec}_s"), ".0f") + " s"])
    return rows


def geometry_table(result: CrossModelResult | dict[str, Any]):
    return html_table("kvlib-zoo-models", ["model", "weights", "layers", "KV / query heads", "head_dim", "layer types",
                                       "windows (gated tokens)", "baseline ppl (gated)", "time"],
                  geometry_rows(result), wrap=(1, 5))


def _cell(p: dict[str, Any] | None, with_bits: bool = False) -> str:
    if p is None:
        return "–"
    color = "#1a7f37" if p["robust"] else ("#9a6700" if p["passed"] else "#cf222e")
    bits = f' · {fmt(p["bits"], ".3f")} bits stored' if with_bits else ""
    return (f'<span style="color:{color};font-weight:600">{fmt(p["delta"], "+.3f")}</span>'
            f'<br><span style="color:#57606a;font-size:11px">[{fmt(p["ci_low"], "+.3f")}, {fmt(p["ci_high"], "+.3f")}]'
            f' KLD {fmt(p["kld"], ".4f")} · top-1 {fmt(p["top1"], ".1f")} %{bits}</span>')


def delta_rows(result: CrossModelResult | dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Scheme × model cells: gated delta (colour: robust pass / pass / fail), its CI, KLD, top-1."""
    r = _as_dict(result)
    pts = points(r["sweeps"])
    models = [sw.get("model_spec", sw["model"]) for sw in r["sweeps"]]
    schemes = list(dict.fromkeys([*(x for x in r["schemes"] if any(p["scheme"] == x for p in pts)),
                                  *(p["scheme"] for p in pts)]))  # as asked, then the peer's rows
    by = {(p["model"], p["scheme"]): p for p in pts}
    bits = {p["scheme"]: p["bits"] for p in pts}
    # a mix is planned per model, so its bits are each cell's; the column says what was asked
    rows = [[html.escape(s), f"≤ {s[len(MIX_PREFIX):]}" if s.startswith(MIX_PREFIX) else fmt(bits[s], ".2f")]
            + [_cell(by.get((m, s)), s.startswith(MIX_PREFIX)) for m in models] for s in schemes]
    return ["scheme", "bits/elem", *models], rows


def delta_table(result: CrossModelResult | dict[str, Any]):
    headers, rows = delta_rows(result)
    return html_table("kvlib-zoo-deltas", headers, rows)


def ruler_rows(result: CrossModelResult | dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The RULER columns: per model and length, each scheme's average over the tasks the exact cache
    does there (its CI), the exact cache's first; empty when no model has a RULER run."""
    r = _as_dict(result)
    pts = [p for p in ruler_points(r["sweeps"]) if p["kind"] != "evict"]
    if not pts:
        return [], []
    cols = list(dict.fromkeys((p["model"], p["length"]) for p in pts))
    by = {(p["model"], p["length"], p["scheme"]): p for p in pts}
    names = list(dict.fromkeys(["exact", *r["schemes"], *(p["scheme"] for p in pts)]))
    names = [s for s in names if any(k[2] == s for k in by)]

    def cell(p: dict[str, Any] | None, exact: dict[str, Any] | None) -> str:
        if p is None or (p["qualifying"] and math.isnan(p["accuracy"])):
            return "–"
        if not p["qualifying"]:
            return '<span style="color:#57606a">no task qualifies</span>'
        lost = exact is not None and p["ci_high"] < exact["accuracy"]  # below the exact cache beyond its CI
        style = ' style="color:#cf222e;font-weight:600"' if lost else ""
        return (f'<span{style}>{fmt(p["accuracy"], ".0f")} %</span><br><span style="color:#57606a;font-size:11px">'
                f'[{fmt(p["ci_low"], ".0f")}, {fmt(p["ci_high"], ".0f")}]</span>')

    headers = ["cache", *(f"{m} · {length_label(n)}" for m, n in cols)]
    rows = [[html.escape(s)] + [cell(by.get((m, n, s)), by.get((m, n, "exact"))) for m, n in cols] for s in names]
    return headers, rows


def _engine_cell(row: dict[str, Any] | None) -> str:
    """One option on one model: the gated delta in the engine's mode (colour: robust pass / pass /
    fail), its CI, KLD, top-1 and bits as the engine stores them; grey with the reason where the
    engine refuses the option for the model."""
    if row is None:
        return "–"
    if row.get("unavailable"):
        return f'<span style="color:#777" title="{html.escape(row["unavailable"])}">unavailable</span>'
    color = "#1a7f37" if row["robust"] else ("#9a6700" if row["verdict"].startswith("PASS") else "#cf222e")
    b = row.get("beside")
    other = (f' · {b["mode"]} {fmt(b["context_delta"], "+.3f")}' if b else "")
    return (f'<span style="color:{color};font-weight:600">{fmt(row["context_delta"], "+.3f")}</span>'
            f'<br><span style="color:#57606a;font-size:11px">[{fmt(row["ci_low"], "+.3f")}, {fmt(row["ci_high"], "+.3f")}]'
            f' KLD {fmt(row["kld_mean"], ".4f")} · top-1 {fmt(row["top1_agreement"], ".1f")} %'
            f' · {fmt(row["bits_per_element"], ".2f")} bits{other}</span>')


def engine_rows(result: CrossModelResult | dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Per engine (``make zoo ZOO_ENGINE=...``): option × model cells (kvlib.runs.engines' rows), the
    flags to pass, and last the cheapest option that passes robustly on each model; empty without one."""
    r = _as_dict(result)
    models = [sw.get("model_spec", sw["model"]) for sw in r["sweeps"]]
    tables: dict[str, dict[str, Any]] = {}
    for m, sw in zip(models, r["sweeps"]):
        for engine, t in (sw.get("engine_tables") or {}).items():
            tables.setdefault(engine, {})[m] = t
    out = {}
    for engine, per_model in tables.items():
        by = {(m, row["option"]): row for m, t in per_model.items() for row in t["rows"]}
        flags = {row["option"]: row["flags"] for t in per_model.values() for row in t["rows"]}
        rows = [[html.escape(o), f"<code>{html.escape(f)}</code>"] + [_engine_cell(by.get((m, o))) for m in models]
                for o, f in flags.items()]
        best = [per_model[m]["cheapest"] if m in per_model else None for m in models]
        rows.append(["<b>cheapest that passes</b>", ""] + [f"<b>{html.escape(b)}</b>" if b else "none passes robustly"
                                                          for b in best])
        mode = next(iter(per_model.values()))["mode"]
        out[engine] = (["option", "flags", *(f"{m} ({mode} mode)" for m in models)], rows)
    return out


def engine_table(result: CrossModelResult | dict[str, Any]):
    """engine_rows as one HTML table per engine, or None when no engine's menu ran."""
    from IPython.display import HTML

    tables = engine_rows(result)
    if not tables:
        return None
    parts = [f"<h4>{html.escape(e)}</h4>" + html_table(f"kvlib-zoo-engine-{e}", h, rows, wrap=(1,)).data
             for e, (h, rows) in tables.items()]
    return HTML("".join(parts))


def ruler_table(result: CrossModelResult | dict[str, Any]):
    headers, rows = ruler_rows(result)
    return html_table("kvlib-zoo-ruler", headers, rows) if rows else None


def ruler_reading(result: CrossModelResult | dict[str, Any]) -> str:
    """Which tasks each model qualifies on at each length (where the schemes are compared), in words."""
    pts = ruler_points(_as_dict(result)["sweeps"])
    if not pts:
        return ("No RULER run beside these sweeps: `make zoo ZOO_RULER_LENGTHS=4096,8192` runs the suite on "
                "every model, or `ZOO_RULER_JSON=...` attaches saved runs (`kv-validate --ruler --json`).")
    seen = {(p["model"], p["length"]): p for p in pts if p["scheme"] == "exact"}
    parts = [f"{html.escape(m)} at {length_label(n)}: {len(p['qualifying'])} of {p['tasks']} tasks"
             + (f" ({', '.join(p['qualifying'])})" if p["qualifying"] else "") for (m, n), p in seen.items()]
    return (f"RULER average (%) over the tasks the exact cache does at that length (accuracy ≥ {RULER_EXACT_FLOOR:.0f} "
            f"%; the others are the model's floor, where the schemes are not compared), with its {CI_LEVEL:.0%} CI; red: "
            "below the exact cache beyond that CI. "
            "Qualifying: "
            + "; ".join(parts) + ".")


def recommendation_rows(result: CrossModelResult | dict[str, Any]) -> list[list[str]]:
    r = _as_dict(result)
    return [[html.escape(sw.get("model_spec", sw["model"])), html.escape(sw["recommended"] or "none"),
             html.escape(sw["recommendation"])] for sw in r["sweeps"]]


def recommendation_table(result: CrossModelResult | dict[str, Any]):
    return html_table("kvlib-zoo-recommendations", ["model", "use", "why"], recommendation_rows(result), wrap=(2,))


def plot_snr_vs_kld(result: CrossModelResult | dict[str, Any]) -> Figure:
    """Key and value SNR against KLD, one colour per model: does SNR predict the damage across models?"""
    r = _as_dict(result)
    pts = points(r["sweeps"])
    models = list(dict.fromkeys(p["model"] for p in pts))
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), constrained_layout=True, sharey=True)
    for ax, role, label in ((axes[0], "key_snr", "key SNR (dB)"), (axes[1], "value_snr", "value SNR (dB)")):
        for i, m in enumerate(models):
            mine = [p for p in pts if p["model"] == m and math.isfinite(p[role] or math.nan) and (p["kld"] or 0) > 0]
            for kind, marker in (("kvq", "o"), ("peer", "D")):  # the peer's rows as diamonds, as in the sweep
                ks = [p for p in mine if p["kind"] == kind]
                ax.scatter([p[role] for p in ks], [p["kld"] for p in ks], color=cmap(i), s=28, marker=marker,
                           label=m if kind == "kvq" else None)
            for p in mine:
                ax.annotate(p["scheme"], (p[role], p["kld"]), fontsize=6.5, color=cmap(i), xytext=(3, 2),
                            textcoords="offset points")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_title(f"{label.split(' (')[0]} against KL divergence")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean KL(exact ‖ compressed), nats (log)")
    axes[0].legend(fontsize=8)
    plt.close(fig)
    corr = snr_correlation(pts)["pooled"]
    return Figure(fig, f"Key and value SNR against mean KL divergence per model and scheme; pooled rank correlation "
                       f"key {fmt(corr['key_snr'], '+.2f')}, value {fmt(corr['value_snr'], '+.2f')}")


def snr_reading(result: CrossModelResult | dict[str, Any]) -> str:
    """What the numbers say about SNR as a predictor, in words computed from them."""
    r = _as_dict(result)
    pts = points(r["sweeps"])
    c = snr_correlation(pts)
    pooled, per = c["pooled"], c["per_model"]
    within = [v["key_snr"] for v in per.values() if math.isfinite(v["key_snr"])]
    lines = [f"Rank correlation (Spearman) of SNR with KL divergence over all {len(pts)} model × scheme points: "
             f"key SNR {fmt(pooled['key_snr'], '+.2f')}, value SNR {fmt(pooled['value_snr'], '+.2f')} "
             f"(−1: higher SNR always means less damage)."]
    if within:
        lines.append("Within each model, key SNR: " + ", ".join(
            f"{html.escape(m)} {fmt(v['key_snr'], '+.2f')}" for m, v in per.items()) + ".")
        mean_within = float(np.nanmean(within))
        if math.isfinite(pooled["key_snr"]):
            lines.append(f"Pooled over models the key-SNR correlation is {pooled['key_snr']:+.2f}, against "
                         f"{mean_within:+.2f} within a model on average"
                         + (": SNR orders schemes within a model better than across models." if
                            mean_within - pooled["key_snr"] < -0.15 else ": SNR orders the damage roughly on all of "
                            "them, but the scale differs per model."))
    lines += _transfer(pts)
    best = {}
    for p in pts:
        if p["robust"] and (p["model"] not in best or p["bits"] < best[p["model"]]["bits"]):
            best[p["model"]] = p
    if best:
        lines.append("Cheapest robust scheme per model: " + ", ".join(
            f"{html.escape(m)} → {html.escape(p['scheme'])} ({p['bits']:.2f} bits)" for m, p in best.items()) + ".")
    return " ".join(lines)


def _transfer(pts: list[dict[str, Any]]) -> list[str]:
    """Whether a key-SNR threshold carries over: the worst key SNR one model passes robustly at,
    against the best another fails at (kvlib's codecs only)."""
    ok: dict[str, dict[str, Any]] = {}
    bad: dict[str, dict[str, Any]] = {}
    for p in pts:
        if p["kind"] != "kvq" or not math.isfinite(p["key_snr"] or math.nan):
            continue
        m = p["model"]
        if p["robust"] and (m not in ok or p["key_snr"] < ok[m]["key_snr"]):
            ok[m] = p
        if not p["passed"] and (m not in bad or p["key_snr"] > bad[m]["key_snr"]):
            bad[m] = p
    pairs = [(b, o) for b in bad.values() for o in ok.values() if b["model"] != o["model"] and b["key_snr"] > o["key_snr"]]
    if not pairs:
        return ["No model fails at a key SNR another passes at: on these models one key-SNR threshold would do."]
    b, o = max(pairs, key=lambda bo: bo[0]["key_snr"] - bo[1]["key_snr"])
    return [f"A key-SNR threshold does not carry over from one model to another: {html.escape(b['model'])} fails with "
            f"{html.escape(b['scheme'])} at key SNR {b['key_snr']:.1f} dB (gated Δ {b['delta']:+.3f}) where "
            f"{html.escape(o['model'])} passes robustly with {html.escape(o['scheme'])} at {o['key_snr']:.1f} dB "
            f"(Δ {o['delta']:+.3f})."]


def banner(result: CrossModelResult | dict[str, Any]):
    from IPython.display import HTML

    r = _as_dict(result)
    n = len(r["sweeps"])
    ok = sum(sw["recommended"] is not None for sw in r["sweeps"])
    color = "#1a7f37" if ok == n else "#9a6700"
    recs = " · ".join(f"{html.escape(sw.get('model_spec', sw['model']))}: {html.escape(sw['recommended'] or 'none')}"
                      for sw in r["sweeps"])
    return HTML(
        f'<div class="kvlib-banner" style="border-left:8px solid {color};background:{color}14;padding:12px 16px;'
        f'margin:8px 0;font-family:sans-serif"><div style="font-size:22px;font-weight:700;color:{color}">'
        f'{ok} of {n} models have a robust scheme</div><div style="font-size:15px;margin-top:4px">{recs}</div>'
        f'<div style="font-size:12px;color:#57606a;margin-top:4px">{html.escape(r["corpus"])} · at most '
        f'{r["max_windows"]} windows, stride {r["stride"]} · gate: gated perplexity delta &lt; {r["threshold"]:g}, '
        f'robust when its {CI_LEVEL:.0%} CI is below it too</div></div>')


def timing_table(result: CrossModelResult | dict[str, Any]):
    """Each model's sweep time and the total."""
    return _timing_table(_as_dict(result).get("timing") or {})

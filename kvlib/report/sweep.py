"""What the sweep report shows: the recommendation, the Pareto plot of cost
against quality, the ranked table and per-layer SNR for every scheme, built
from a SweepResult (or its JSON) so the notebook only calls and displays."""

from __future__ import annotations

import html
import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from kvlib.gates import CI_LEVEL, CI_METHOD
from kvlib.report.common import Figure, as_number, fmt, mark_sliding_layers, place_labels
from kvlib.runs.sweep import MIX_PREFIX, SweepResult

PEER_COLOR, KVQ_COLOR, FAIL_COLOR = "#8250df", "#1f77b4", "#cf222e"


def _as_dict(result: SweepResult | dict[str, Any]) -> dict[str, Any]:
    return result.to_dict() if isinstance(result, SweepResult) else result


def _ran(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in r["schemes"] if not s.get("error")]


def banner(result: SweepResult | dict[str, Any]):
    """The recommendation: the cheapest scheme that passes with confidence."""
    from IPython.display import HTML

    r = _as_dict(result)
    ok = r["recommended"] is not None
    color, word = ("#1a7f37", f"USE {r['recommended']}") if ok else ("#cf222e", "NO SCHEME PASSES WITH CONFIDENCE")
    layers = (r.get("kv_geometry") or {}).get("layers")
    sub = (f"{html.escape(r['model'])}{f' ({layers})' if layers else ''} &middot; {html.escape(r['corpus'])} &middot; {r['dtype']} &middot; {r['windows']} windows, "
           f"{r['context_scored_tokens']} tokens " + ("after a compressed context" if r.get("mode", "prefix") == "prefix"
                                                       else "with every K/V quantized as written (write mode)")
           + " &middot; gate: gated perplexity delta "
           f"&lt; {r['threshold']:g}, robust when its {CI_LEVEL:.0%} CI is below it too")
    return HTML(
        f'<div class="kvlib-banner" data-verdict="{html.escape(word)}" style="border-left:8px solid {color};'
        f'background:{color}14;padding:12px 16px;margin:8px 0;font-family:sans-serif">'
        f'<div style="font-size:26px;font-weight:700;color:{color}">{html.escape(word)}</div>'
        f'<div style="font-size:15px;margin-top:4px">{html.escape(r["recommendation"])}</div>'
        + "".join(f'<div style="font-size:13px;margin-top:4px">{html.escape(d["summary"])}</div>'
                  for d in (r.get("retrieval"), r.get("agreement")) if d) +
        f'<div style="font-size:12px;color:#57606a;margin-top:4px">{sub}</div></div>'
    )


def frontier(schemes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Pareto frontier: schemes no other beats on both bits/element and gated delta."""
    pts = sorted((s for s in schemes if math.isfinite(s["bits_per_element"] or math.nan)),
                 key=lambda s: (s["bits_per_element"], s["context_delta"]))
    out, best = [], math.inf
    for s in pts:
        if s["context_delta"] < best:
            out.append(s)
            best = s["context_delta"]
    return out


def plot_pareto(result: SweepResult | dict[str, Any]) -> Figure:
    """Bits/element against gated delta (symlog, CI bars, threshold, frontier) and against mean KLD."""
    r = _as_dict(result)
    ss = _ran(r)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(12.5, 9.5), constrained_layout=True, height_ratios=[3, 2])
    for s in ss:
        x, y = s["bits_per_element"], s["context_delta"]
        color = PEER_COLOR if s["kind"] == "peer" else (KVQ_COLOR if s["passed"] else FAIL_COLOR)
        mixed = s["name"].startswith(MIX_PREFIX)
        marker = "D" if s["kind"] == "peer" else "*" if mixed else "o"
        lo, hi = as_number(s["ci_low"]), as_number(s["ci_high"])  # no CI (too few windows): no bar
        err = [[max(0.0, y - lo) if math.isfinite(lo) else 0.0], [max(0.0, hi - y) if math.isfinite(hi) else 0.0]]
        ax.errorbar([x], [y], yerr=err, fmt=marker, color=color, ms=11 if mixed else 6, capsize=3, lw=1)
        ax2.scatter([x], [max(s["kld_mean"], 1e-6)], marker=marker, color=color, s=110 if mixed else 30)
    fr = frontier(ss)
    if fr:
        ax.step([s["bits_per_element"] for s in fr], [s["context_delta"] for s in fr], where="post",
                color="#57606a", lw=1, ls="--", label="Pareto frontier")
    ax.axhline(r["threshold"], color=FAIL_COLOR, lw=1, label=f"gate: delta < {r['threshold']:g}")
    ax.axhline(0, color="black", lw=0.5)
    ax.set_yscale("symlog", linthresh=0.01, linscale=0.5)
    for a in (ax, ax2):  # room for the labels at the edges
        a.margins(x=0.12, y=0.12)
    ax.set_xlabel("bits per element (measured, including scales, zero points, outliers, residual)")
    ax.set_ylabel("gated perplexity delta (symlog)")
    mixes = any(s["name"].startswith(MIX_PREFIX) for s in ss)
    ax.set_title(f"Cost against quality: {CI_LEVEL:.0%} CI bars, ◆ = transformers' QuantizedCache"
                 + (", ★ = a scheme per layer and role under a bit budget" if mixes else ""))
    ax.legend(loc="upper right", fontsize=8)
    ax2.set_yscale("log")
    ax2.set_xlabel("bits per element")
    ax2.set_ylabel("mean KL(exact || compressed), nats")
    ax2.set_title("Next-token distribution shift")
    for a, key in ((ax, "context_delta"), (ax2, "kld_mean")):
        place_labels(fig, a, [(s["bits_per_element"], s[key] if key == "context_delta" else max(s[key], 1e-6),
                                s["name"], PEER_COLOR if s["kind"] == "peer" else (KVQ_COLOR if s["passed"] else FAIL_COLOR))
                               for s in ss])
    best = r["recommended"] or "none"
    alt = (f"Pareto plot of {len(ss)} schemes: bits per element against gated perplexity delta with {CI_LEVEL:.0%} "
           f"confidence intervals, the {r['threshold']:g} threshold line and the frontier; and against mean KL "
           f"divergence. Recommended: {best}. " + "; ".join(
               f"{s['name']}: {s['bits_per_element']:.2f} bits, delta {s['context_delta']:+.3f}" for s in ss))
    return Figure(fig, alt)


def ranked_rows(result: SweepResult | dict[str, Any]) -> list[list[str]]:
    """The table's cells, ranked as the sweep ranks them (passing first, then by bits)."""
    rows = []
    for s in _as_dict(result)["schemes"]:
        if s.get("error"):
            why = s["error"] if s["error"].startswith("unavailable") else f"not run: {s['error']}"
            rows.append([s["name"], *["–"] * (len(HEADERS) - 2), why])
            continue
        verdict = ("PASS (robust)" if s["robust"] else "PASS (CI crosses gate)") if s["passed"] else "FAIL"
        rows.append([
            s["name"], fmt(s["bits_per_element"], ".3f"), fmt(s["compression_ratio"], ".2f") + "x",
            fmt(s["delta"], "+.4f"), fmt(s["context_delta"], "+.4f"),
            f"{fmt(s['ci_low'], '+.4f')} to {fmt(s['ci_high'], '+.4f')}",
            fmt(s["kld_mean"], ".5f"), fmt(s["kld_p99"], ".4f"), fmt(s["top1_agreement"], ".2f") + " %",
            fmt((s["keys"] or {}).get("snr_db"), ".2f"), fmt((s["values"] or {}).get("snr_db"), ".2f"),
            _found(s), fmt(s.get("generation_agreement"), ".1f") + " %", verdict,
        ])
    return rows


HEADERS = ["Scheme", "Bits/el", "vs FP16", "Δ all", "Δ gated", f"{CI_LEVEL:.0%} CI (gated)", "KLD mean", "KLD p99",
           "Top-1", "Key SNR dB", "Value SNR dB", "Pass keys", "Gen. agree", "Verdict"]


def _found(s: dict[str, Any]) -> str:
    """Pass keys found, e.g. "19/20", or a dash when retrieval did not run."""
    found, total = s.get("retrieval_found"), s.get("retrieval_total")
    if found is None or total is None or math.isnan(float(found)):
        return "–"
    return f"{found:.0f}/{total:.0f}"


def ranked_table(result: SweepResult | dict[str, Any]):
    """The ranked table as HTML (id ``kvlib-sweep-table``), the spec of each scheme on hover."""
    from IPython.display import HTML

    r = _as_dict(result)
    head = "".join(f'<th style="text-align:{"left" if i in (0, len(HEADERS) - 1) else "right"}">{html.escape(h)}</th>'
                   for i, h in enumerate(HEADERS))
    body = ""
    for s, row in zip(r["schemes"], ranked_rows(r)):
        color = "#1a7f37" if s.get("robust") else ("#9a6700" if s.get("passed") else "#cf222e")
        if (s.get("error") or "").startswith("unavailable"):  # the engine refuses it for this model: no verdict
            color = "#777"
        cells = f'<th style="text-align:left" title="{html.escape(s["spec"])}">{html.escape(row[0])}</th>'
        cells += "".join(f'<td style="text-align:right;white-space:nowrap">{html.escape(c)}</td>' for c in row[1:-1])
        cells += f'<td style="color:{color};font-weight:600">{html.escape(row[-1])}</td>'
        body += f"<tr>{cells}</tr>"
    return HTML(f'<table id="kvlib-sweep-table" style="font-size:12.5px;max-width:100%"><thead><tr>{head}</tr>'
                f'</thead><tbody>{body}</tbody></table>')


def engine_tables(result: SweepResult | dict[str, Any]):
    """Each engine's menu (kvlib.runs.engines): the option as the engine names it, the flags to pass,
    bits/element, gated delta with CI, KLD, top-1, verdict; the cheapest option that passes; and with
    more than one engine, the cheapest passing option of each side by side. Empty without one."""
    from IPython.display import HTML

    tables = _as_dict(result).get("engines") or {}
    out = ""
    for engine, t in tables.items():
        beside = any("beside" in r for r in t["rows"])
        rows = "".join(_engine_row(r, beside) for r in t["rows"])
        best = (f"<b>{html.escape(t['cheapest'])}</b>: {html.escape(t['cheapest_flags'])}" if t["cheapest"]
                else "none passes robustly")
        out += (f"<h4>{html.escape(engine)} <small>({html.escape(t['version'])}, {t['mode']} mode)</small></h4>"
                f"<table class='kvlib-engine-table' style='font-size:12.5px'><thead><tr><th style='text-align:left'>option"
                f"</th><th style='text-align:left'>flags</th><th style='text-align:left'>static scales</th><th>bits/el</th><th>Δ gated</th><th>CI</th><th>KLD</th>"
                f"<th>top-1</th><th>clamped</th><th style='text-align:left'>verdict ({t['mode']} mode)</th>"
                + (f"<th>Δ gated, {'prefix' if t['mode'] == 'write' else 'write'} mode [CI]</th>" if beside else "")
                + f"</tr></thead><tbody>{rows}"
                f"</tbody></table><p>Cheapest option that passes in {html.escape(engine)}: {best}</p>")
    return HTML(out)


def _engine_row(r: dict[str, Any], beside: bool = True) -> str:
    """One option's row; an option the engine refuses for this model spans the numbers with its reason;
    ``beside``: the table has the other mode's column."""
    head = (f"<tr><th style='text-align:left'>{html.escape(r['option'])}</th><td style='text-align:left'><code>"
            f"{html.escape(r['flags'])}</code></td><td style='text-align:left'>{html.escape(r.get('scales', ''))}</td>")
    if r.get("unavailable"):
        return (head + "<td colspan='6' style='text-align:left;color:#777'>–</td><td colspan='" + ("2" if beside else "1")
                + f"' style='text-align:left;color:#777'>unavailable for this model: {html.escape(r['unavailable'])}</td></tr>")
    b = r.get("beside")
    other = f"{_fmt(b['context_delta'])} [{_fmt(b['ci_low'])}, {_fmt(b['ci_high'])}]" if b else "not run"
    return (head + f"<td>{r['bits_per_element']:.3f}</td><td>{_fmt(r['context_delta'])}</td>"
            f"<td>[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]</td><td>{fmt(r['kld_mean'], '.5f')}</td>"
            f"<td>{fmt(r['top1_agreement'], '.1f')}%</td>"
            f"<td>{r['saturated']}</td><td style='text-align:left'>{html.escape(r['verdict'])}</td>"
            + (f"<td style='white-space:nowrap'>{other}</td>" if beside else "") + "</tr>")


def _fmt(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.4f}"


def specs_table(result: SweepResult | dict[str, Any]):
    """What each row is: its exact spec (from the CLI) or the peer's configuration."""
    from IPython.display import HTML

    rows = "".join(f"<tr><th style='text-align:left'>{html.escape(s['name'])}</th><td style='text-align:left'><code>"
                   f"{html.escape(s['spec'])}</code></td></tr>" for s in _as_dict(result)["schemes"])
    return HTML(f'<table id="kvlib-sweep-specs" style="font-size:12.5px"><thead><tr><th style="text-align:left">'
                f'Scheme</th><th style="text-align:left">Spec</th></tr></thead><tbody>{rows}</tbody></table>')


def plot_layer_snr(result: SweepResult | dict[str, Any]) -> Figure:
    """Key and value SNR per layer for every scheme: which layers each scheme hurts."""
    r = _as_dict(result)
    ss = [s for s in _ran(r) if s["layer_key_snr_db"]]
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.4), constrained_layout=True, sharey=True)
    cmap = plt.get_cmap("tab20")
    for i, s in enumerate(ss):
        ls = ":" if s["kind"] == "peer" else "-"
        for ax, key in zip(axes, ("layer_key_snr_db", "layer_value_snr_db")):
            y = np.array([math.nan if v is None else v for v in s[key]], dtype=float)
            ax.plot(np.arange(len(y)), y, ls, color=cmap(i % 20), lw=1.4, label=s["name"])
    for ax, role in zip(axes, ("Keys", "Values")):
        mark_sliding_layers(ax, r)
        ax.set_title(f"{role}: SNR per layer, pooled over every window's context cache")
        ax.set_xlabel("layer")
    axes[0].set_ylabel("SNR (dB)")
    axes[1].legend(fontsize=7.5, ncol=2, loc="lower right")
    alt = ("Per-layer SNR of keys and values for every scheme. Mean key SNR: " +
           "; ".join(f"{s['name']} {np.nanmean([math.nan if v is None else v for v in s['layer_key_snr_db']]):.1f} dB"
                     for s in ss))
    return Figure(fig, alt)


def method_note() -> str:
    """How the numbers are made, for the report's text (the gates module's words)."""
    return CI_METHOD

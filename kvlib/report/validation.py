"""Step 5: what the validation report shows. Tables and figures built from a
ValidationResult (or its JSON), so the notebooks only call and display.

Figures are created with pyplot and closed at once: the notebook shows each
exactly once through ``display``.
"""

from __future__ import annotations

import html
import math
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import numpy as np
import pandas as pd

from kvlib.gates import CI_LEVEL, MIN_CI_UNITS
from kvlib.runs.validate import ValidationResult
from kvlib.report.common import (KEY_COLOR, VALUE_COLOR, Figure, as_number, finite_array, fmt, mark_sliding_layers,
                                 tensors_by_layer)


def _as_dict(result: ValidationResult | dict[str, Any]) -> dict[str, Any]:
    return result.to_dict() if isinstance(result, ValidationResult) else result


def banner(result: ValidationResult | dict[str, Any]):
    """The PASS/FAIL banner: the gated delta against the threshold."""
    from IPython.display import HTML

    r = _as_dict(result)
    ok = bool(r["passed"])
    color, word = ("#1a7f37", "PASS") if ok else ("#cf222e", "FAIL")
    if r.get("context_windows", 0) or not math.isnan(as_number(r.get("context_delta"))):
        detail = (f"perplexity delta {fmt(r['context_delta'], '+.4f')} "
                  f"{'&lt;' if ok else '&ge;'} threshold {r['threshold']:g} "
                  f"({fmt(r['context_baseline_perplexity'], '.3f')} &rarr; {fmt(r['context_compressed_perplexity'], '.3f')}, "
                  f"windows with a compressed context)")
        if not math.isnan(as_number(r.get("ci_low"))):
            robust = "below" if r.get("robust") else "crosses"
            detail += (f"<br>{CI_LEVEL:.0%} CI {fmt(r['ci_low'], '+.4f')} to {fmt(r['ci_high'], '+.4f')}: its upper "
                       f"bound {robust} the threshold; KL divergence {fmt(r.get('kld_mean'), '.4f')} nats, top-1 "
                       f"agreement {fmt(r.get('top1_agreement'), '.1f')} %")
        else:
            detail += (f"<br>no CI: fewer than {MIN_CI_UNITS} windows with a compressed context, so the pass is not "
                       f"robust (score more windows)")
    else:
        detail = html.escape(r.get("verdict", ""))
    checks = "".join(f"<br>{html.escape(d['summary'])}" for d in (r.get("retrieval"), r.get("agreement")) if d)
    if checks:
        detail += f'<div style="font-size:13px;color:#24292f;margin-top:4px">Beside the verdict{checks}</div>'
    parts = [r["model"], f"{r['scheme_name']} ({r['scheme']})" if r['scheme_name'] != r['scheme'] else r['scheme'], r["corpus"]]
    sub = " &middot; ".join(html.escape(p) for p in parts if p and p != "none")
    return HTML(
        f'<div class="kvlib-banner" data-verdict="{word}" style="border-left:8px solid {color};background:{color}14;'
        f'padding:12px 16px;margin:8px 0;font-family:sans-serif">'
        f'<div style="font-size:26px;font-weight:700;color:{color}">{word}</div>'
        f'<div style="font-size:15px;margin-top:4px">{detail}</div>'
        f'<div style="font-size:12px;color:#57606a;margin-top:4px">{sub}</div></div>'
    )


def summary_rows(result: ValidationResult | dict[str, Any]) -> list[tuple[str, str, str]]:
    """(metric, value, note) rows of the summary table, values formatted as shown."""
    r = _as_dict(result)
    c = r.get("compression") or {}
    th = c.get("thresholds") or {}
    packed = c.get("compressed_size_bytes")
    rows = [
        ("Model", r["model"], f"device {r.get('device', '')}, {r.get('dtype') or 'float32'}"),
        layout_row(r),
        ("Scheme", r["scheme_name"], r["scheme"] if r["scheme"] != r["scheme_name"] else ""),
        ("Corpus", r["corpus"], ""),
        ("Windows", str(r["windows"]), f"{r['context_windows']} with a compressed context; length {r['context_length']}, stride {r['stride']}"),
        ("Scored tokens", str(r["scored_tokens"]), f"{r['context_scored_tokens']} after a compressed context"),
        ("Baseline perplexity", fmt(r["baseline_perplexity"], ".4f"), "exact KV cache, all scored tokens"),
        ("Compressed perplexity", fmt(r["compressed_perplexity"], ".4f"), "context KV cache through kv-compress"),
        ("Delta (all tokens)", fmt(r["delta"], "+.4f"), f"{fmt(r['delta_percent'], '+.2f')} %"),
        ("Delta (gated)", fmt(r["context_delta"], "+.4f"),
         f"{fmt(r['context_baseline_perplexity'], '.4f')} → {fmt(r['context_compressed_perplexity'], '.4f')}; gate &lt; {r['threshold']:g}"),
        (f"{CI_LEVEL:.0%} CI of the gated delta", f"{fmt(r.get('ci_low'), '+.4f')} to {fmt(r.get('ci_high'), '+.4f')}",
         f"none: fewer than {MIN_CI_UNITS} windows with a compressed context, so no verdict is robust"
         if math.isnan(as_number(r.get("ci_high"))) else
         "robust: the upper bound is below the threshold too" if r.get("robust") else
         ("the upper bound crosses the threshold" if r["passed"] else "") + "; bootstrap over windows"),
        ("KL divergence (mean / median / p99)",
         f"{fmt(r.get('kld_mean'), '.5f')} / {fmt(r.get('kld_median'), '.5f')} / {fmt(r.get('kld_p99'), '.4f')}",
         "nats, exact vs compressed next-token distribution, tokens after a compressed context"),
        ("Top-1 agreement", fmt(r.get("top1_agreement"), ".2f") + " %", "tokens whose most likely next token is unchanged"),
        ("Compression ratio", fmt(r["compression_ratio"], ".3f") + "x", f"vs FP16; {fmt(c.get('bits_per_element'), '.3f')} bits/element"),
        ("Stored size", f"{packed:,} B" if packed else "–",
         ", ".join(f"{k} {v:,}" for k, v in (c.get("stored_bytes") or {}).items()) + f" B, all windows' caches; "
         f"FP16 {c.get('original_size_bytes', 0):,} B"),
        ("RMSE", fmt(r["rmse"], ".6f"), f"gate &lt; {th.get('max_rmse', 0.1):g}"),
        ("SNR", fmt(r["snr_db"], ".2f") + " dB", f"gate &gt; {th.get('min_snr_db', 18):g} dB"),
        ("Cosine similarity", fmt(r["cosine_similarity"], ".6f"), f"gate &gt; {th.get('min_cosine_similarity', 0.99):g}"),
        ("Max error", fmt(r["max_error"], ".4f"), ""),
        *[(f"{label}: SNR / RMSE / cosine",
           f"{fmt(m.get('snr_db'), '.2f')} dB / {fmt(m.get('rmse'), '.4f')} / {fmt(m.get('cosine_similarity'), '.5f')}",
           f"all {label.lower()} tensors pooled")
          for label, m in (("Keys", r.get("keys") or {}), ("Values", r.get("values") or {})) if m],
        *_check_rows(r),
        ("Quality level", r["quality_level"] or "–", "codec gates " + ("passed" if r["quality_passed"] else "failed")),
        ("Violations", "; ".join(r["violations"]) or "none", ""),
    ]
    return rows


def _check_rows(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Summary rows of the retrieval and agreement checks, when they ran."""
    rows = []
    if r.get("retrieval"):
        d = r["retrieval"]
        ex, s = d["exact"], d["schemes"][0]
        rows.append(("Pass-key retrieval", f"{s['found']}/{s['total']}",
                     f"exact cache {ex['found']}/{ex['total']}; {s['dropped']} lost against it; lengths "
                     f"{', '.join(map(str, d['lengths']))} tokens"))
    if r.get("agreement"):
        d = r["agreement"]
        s = d["schemes"][0]
        rows.append(("Generation agreement", fmt(s["agreement"], ".1f") + " %",
                     f"greedy tokens equal to the exact cache's; {s['identical']}/{len(s['tokens'])} continuations "
                     f"identical, first divergence at token {fmt(s['mean_divergence'], '.1f')} of "
                     f"{d['config']['new_tokens']} on average"))
    return rows


def summary_table(result: ValidationResult | dict[str, Any]):
    """The summary as an HTML table (id ``kvlib-summary``)."""
    from IPython.display import HTML

    body = "".join(
        f'<tr><th style="text-align:left">{html.escape(m)}</th><td class="value" style="text-align:right">{html.escape(v)}</td>'
        f'<td style="color:#57606a">{note}</td></tr>'
        for m, v, note in summary_rows(result)
    )
    return HTML(f'<table id="kvlib-summary" style="font-size:13px;max-width:100%"><thead><tr><th>Metric</th>'
                f'<th>Value</th><th>Note</th></tr></thead><tbody>{body}</tbody></table>')


def layout_row(r: dict[str, Any]) -> tuple[str, str, str]:
    """The summary row of the cache's geometry and layer types."""
    g = r.get("kv_geometry") or {}
    sliding = any(g.get("layer_windows") or [])
    return ("KV cache", f"{g.get('num_layers', '?')} layers × {g.get('num_kv_heads', '?')} KV heads × "
            f"head_dim {g.get('head_dim', '?')}",
            html.escape(g.get("layers", "")) + ("; sliding layers store (and the codec compresses) only their last "
                                                "window − 1 tokens" if sliding else ""))


def plot_layer_metrics(result: ValidationResult | dict[str, Any],
                       title: str = "Reconstruction quality per layer, pooled over all windows' context caches"):
    """SNR, RMSE and cosine similarity per layer, keys against values, with the codec's gates."""
    r = _as_dict(result)
    layers, by = tensors_by_layer(r)
    th = (r.get("compression") or {}).get("thresholds") or {"max_rmse": 0.1, "min_snr_db": 18, "min_cosine_similarity": 0.99}
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), constrained_layout=True)
    specs = [("snr_db", "SNR (dB)", th["min_snr_db"], "higher is better"),
             ("rmse", "RMSE (cache units)", th["max_rmse"], "lower is better"),
             ("cosine_similarity", "cosine similarity", th["min_cosine_similarity"], "higher is better")]
    for ax, (key, label, gate, hint) in zip(axes, specs):
        for kind, color in (("key", KEY_COLOR), ("value", VALUE_COLOR)):
            ys = finite_array([by[kind][l][key] for l in layers])
            ax.plot(layers, ys, marker="o", ms=3, color=color, label=f"{kind}s")
        ax.axhline(gate, color="#57606a", ls="--", lw=1, label=f"gate {gate:g}")
        mark_sliding_layers(ax, r)
        ax.set_xlabel("layer")
        ax.set_ylabel(label)
        ax.set_title(f"{label} per layer ({hint})")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    plt.close(fig)
    return Figure(fig, f"Per-layer SNR, RMSE and cosine similarity of the reconstructed keys and values ({r['scheme_name']}), with the codec's gates")


def plot_error_histograms(result: ValidationResult | dict[str, Any]):
    """Per-layer histograms of |reconstruction error| (the CLI's fixed log2 bins), keys and values."""
    r = _as_dict(result)
    layers, by = tensors_by_layer(r)
    edges = np.array((r.get("compression") or {}).get("error_histogram_edges", []), dtype=float)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True, sharey=True)
    # Show bins from the first to the last one holding any element.
    hists = {k: np.array([by[k][l]["error_histogram"] for l in layers], dtype=float) for k in ("key", "value")}
    used = np.nonzero((hists["key"].sum(0) + hists["value"].sum(0)) > 0)[0]
    lo, hi = (used.min(), used.max() + 1) if used.size else (0, len(edges) - 1)
    for ax, kind in zip(axes, ("key", "value")):
        h = hists[kind][:, lo:hi]
        share = h / np.maximum(h.sum(1, keepdims=True), 1)
        im = ax.imshow(share, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest",
                       extent=(lo - 0.5, hi - 0.5, layers[0] - 0.5, layers[-1] + 0.5))
        ticks = list(range(lo, hi, max(1, math.ceil((hi - lo) / 7))))
        ax.set_xticks(ticks)
        ax.set_xticklabels([("0" if edges[i] == 0 else f"$2^{{{int(round(math.log2(edges[i])))}}}$") for i in ticks])
        ax.set_xlabel("|error| bin, lower edge (cache units; each bin spans a factor of 2)")
        ax.set_title(f"{kind}s: share of elements per |error| bin")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(False)
    axes[0].set_ylabel("layer")
    fig.colorbar(im, ax=axes, label="share of the layer's elements", shrink=0.9)
    plt.close(fig)
    return Figure(fig, f"Per-layer histograms of the absolute reconstruction error of keys and values ({r['scheme_name']})")


def plot_head_snr_heatmap(result: ValidationResult | dict[str, Any]):
    """SNR per layer and KV head, keys and values side by side."""
    r = _as_dict(result)
    layers, by = tensors_by_layer(r)
    k = np.array([finite_array(by["key"][l]["head_snr_db"]) for l in layers])
    v = np.array([finite_array(by["value"][l]["head_snr_db"]) for l in layers])
    heads = k.shape[1]
    grid = np.concatenate([k, np.full((len(layers), 1), np.nan), v], axis=1)
    vmin, vmax = np.nanmin(grid), np.nanmax(grid)
    fig, ax = plt.subplots(figsize=(max(5.5, 1.0 * (2 * heads + 1) + 3), max(4, 0.24 * len(layers) + 1.5)), constrained_layout=True)
    im = ax.imshow(grid, aspect="auto", origin="lower", cmap="RdYlGn", vmin=vmin, vmax=vmax, interpolation="nearest")
    labels = [f"K h{h}" for h in range(heads)] + [""] + [f"V h{h}" for h in range(heads)]
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.set_yticks(range(0, len(layers), max(1, len(layers) // 15)))
    ax.set_yticklabels([str(layers[i]) for i in range(0, len(layers), max(1, len(layers) // 15))])
    ax.set_xlabel("KV head (keys | values)")
    ax.set_ylabel("layer")
    ax.set_title("SNR (dB) per layer and KV head")
    ax.grid(False)
    if len(layers) * (2 * heads) <= 400:
        for (i, j), val in np.ndenumerate(grid):
            if not np.isnan(val):
                ax.text(j, i, f"{val:.0f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="SNR (dB)")
    plt.close(fig)
    return Figure(fig, f"Heatmap of SNR in dB per layer and KV head ({r['scheme_name']})")


def plot_window_perplexity(result: ValidationResult | dict[str, Any]):
    """Perplexity of each window's targets, exact cache against compressed cache."""
    r = _as_dict(result)
    w = r["window_nlls"]
    idx = np.array([x["index"] for x in w])
    base = np.array([x["baseline_ppl"] for x in w], dtype=float)
    comp = np.array([x["compressed_ppl"] for x in w], dtype=float)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 3.6), constrained_layout=True)
    width = 0.4
    ax.bar(idx - width / 2, base, width, label="exact cache", color="#8c959f")
    ax.bar(idx + width / 2, comp, width, label="compressed cache", color="#0969da")
    ax.set_xlabel("window")
    ax.set_ylabel("perplexity of the window's targets")
    ax.set_title("Per-window perplexity")
    ax.set_xticks(idx)
    ax.set_xticklabels([f"{i}\n(no ctx)" if not x["compressed"] else str(i) for i, x in zip(idx, w)], fontsize=8)
    ax.legend(fontsize=8)
    ax2.axhline(0, color="#57606a", lw=1)
    ax2.bar(idx, comp - base, color=["#8c959f" if not x["compressed"] else "#0969da" for x in w])
    ax2.axhline(r["threshold"], color="#cf222e", ls="--", lw=1, label=f"threshold {r['threshold']:g}")
    ax2.set_xlabel("window")
    ax2.set_ylabel("compressed − exact perplexity")
    ax2.set_title("Per-window perplexity delta")
    ax2.set_xticks(idx)
    ax2.legend(fontsize=8)
    plt.close(fig)
    return Figure(fig, f"Per-window perplexity with the exact and the compressed cache, and the per-window delta ({r['scheme_name']})")


def quick_test_table(result: ValidationResult | dict[str, Any]):
    """The quick test's metrics as a table (id ``kvlib-summary``)."""
    from IPython.display import HTML

    r = _as_dict(result)
    c = r["compression"]
    g = r["kv_geometry"]
    rows = [
        ("Synthetic cache", f"{g['num_layers']} layers × {g['num_kv_heads']} KV heads × {g['seq_len']} tokens × {g['head_dim']}", r["model"]),
        ("Compression ratio", fmt(r["compression_ratio"], ".3f") + "x", f"{c['compressed_size_bytes']:,} B packed vs {c['original_size_bytes']:,} B FP16"),
        ("RMSE", fmt(r["rmse"], ".6f"), "gate &lt; 0.1"),
        ("SNR", fmt(r["snr_db"], ".2f") + " dB", "gate &gt; 18 dB"),
        ("Cosine similarity", fmt(r["cosine_similarity"], ".6f"), "gate &gt; 0.99"),
        ("Max error", fmt(r["max_error"], ".4f"), ""),
        ("Quality level", r["quality_level"], "; ".join(r["violations"]) or "no violations"),
        ("Verdict", r["verdict"], ""),
    ]
    body = "".join(f'<tr><th style="text-align:left">{html.escape(m)}</th><td class="value" style="text-align:right">'
                   f'{html.escape(v)}</td><td style="color:#57606a">{n}</td></tr>' for m, v, n in rows)
    return HTML(f'<table id="kvlib-summary" style="font-size:13px"><thead><tr><th>Metric</th><th>Value</th>'
                f'<th>Note</th></tr></thead><tbody>{body}</tbody></table>')


def windows_table(result: ValidationResult | dict[str, Any]) -> pd.DataFrame:
    """Per-window detail: span, targets, and both perplexities."""
    r = _as_dict(result)
    df = pd.DataFrame(r["window_nlls"])
    df["delta"] = df["compressed_ppl"] - df["baseline_ppl"]
    return df[["index", "begin", "end", "targets", "context_tokens", "baseline_ppl", "compressed_ppl", "delta"]].round(4)

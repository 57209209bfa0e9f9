"""The transfer view in the report: bytes on the wire per context token against the gated delta
(kvlib.runs.transfer), as a table and a plot, from a SweepResult or its JSON."""

from __future__ import annotations

import html
import math
from typing import Any

import matplotlib.pyplot as plt

from kvlib.report.common import Figure, as_number, fmt
from kvlib.runs.sweep import SweepResult
from kvlib.runs.transfer import TRANSFER_ENGINE

SERDE_COLOR, PLAIN_COLOR, WIRE_COLOR, PEER_COLOR = "#8250df", "#57606a", "#1a7f37", "#bc4c00"
BOLD = ' style="font-weight:bold"'  # the answer's row


def _as_dict(result: SweepResult | dict[str, Any]) -> dict[str, Any]:
    return result.to_dict() if isinstance(result, SweepResult) else result


def _view(result: SweepResult | dict[str, Any]) -> dict[str, Any]:
    return _as_dict(result).get("transfer") or {}


def _kind(row: dict[str, Any]) -> str:
    if row.get("kind") == "peer":
        return "peer"
    return "serde" if row["scheme"].startswith(TRANSFER_ENGINE + ":") else "wire" if row["wire"] else "plain"


def transfer_table(result: SweepResult | dict[str, Any]):
    """Fewest bytes first: bytes per context token, times smaller than FP16, gated delta with CI,
    KLD, top-1, codec speed and verdict; the fewest bytes that pass robustly. Empty without the view."""
    from IPython.display import HTML

    t = _view(result)
    if not t.get("rows"):
        return HTML("")
    rows = "".join(
        f"<tr{BOLD if r['scheme'] == t['fewest'] else ''}><th style='text-align:left'>"
        f"{html.escape(r['scheme'])}</th><td>{r['bytes_per_token']:.1f}</td><td>{r['times_smaller']:.2f}×</td>"
        f"<td>{r['bits_per_element']:.3f}</td><td>{r['context_delta']:+.4f}</td>"
        f"<td>[{fmt(r['ci_low'], '+.4f')}, {fmt(r['ci_high'], '+.4f')}]</td><td>{r['kld_mean']:.5f}</td>"
        f"<td>{r['top1_agreement']:.1f}%</td><td>{fmt(r['codec_mb_s'], '.0f')}</td>"
        f"<td style='text-align:left'>{html.escape(r['verdict'])}</td></tr>" for r in t["rows"])
    best = next((r for r in t["rows"] if r["scheme"] == t["fewest"]), None)
    answer = (f"<b>{html.escape(best['scheme'])}</b>: {best['bytes_per_token']:.1f} bytes per context token, "
              f"{best['times_smaller']:.2f}× smaller than FP16 ({best['fp16_bytes_per_token']:.0f} bytes/token), "
              f"gated delta {best['context_delta']:+.4f}" if best else "none passes robustly")
    return HTML(f"<table id='kvlib-transfer' style='font-size:12.5px'><thead><tr><th style='text-align:left'>scheme</th>"
                f"<th>bytes/token</th><th>vs FP16</th><th>bits/el</th><th>Δ gated</th><th>CI</th><th>KLD</th><th>top-1</th>"
                f"<th>codec MB/s</th><th style='text-align:left'>verdict</th></tr></thead><tbody>{rows}</tbody></table>"
                f"<p>Fewest bytes on the wire that pass robustly: {answer}.</p>")


def plot_transfer(result: SweepResult | dict[str, Any]) -> Figure | None:
    """Bytes per context token against the gated delta (symlog, CI bars, the gate): LMCache's
    serdes, kvlib's presets, and the same presets with the wire stage."""
    t, threshold = _view(result), _as_dict(result)["threshold"]
    if not t.get("rows"):
        return None
    fig, ax = plt.subplots(figsize=(12.5, 6), constrained_layout=True)
    colors = {"serde": SERDE_COLOR, "plain": PLAIN_COLOR, "wire": WIRE_COLOR, "peer": PEER_COLOR}
    labels = {"serde": "LMCache serde", "plain": "kvlib scheme", "wire": "kvlib scheme +wire",
              "peer": "transformers' QuantizedCache"}
    seen = set()
    for r in t["rows"]:
        k = _kind(r)
        x, y = r["bytes_per_token"], r["context_delta"]
        lo, hi = as_number(r["ci_low"]), as_number(r["ci_high"])
        err = [[max(0.0, y - lo) if math.isfinite(lo) else 0.0], [max(0.0, hi - y) if math.isfinite(hi) else 0.0]]
        ax.errorbar([x], [y], yerr=err, fmt="s" if k == "serde" else "o", color=colors[k], capsize=3, lw=1,
                    label=None if k in seen else labels[k])
        seen.add(k)
        ax.annotate(r["scheme"], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=colors[k])
    ax.axhline(threshold, color="#cf222e", lw=1, label=f"gate: delta < {threshold:g}")
    ax.axhline(0, color="black", lw=0.5)
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=0.01, linscale=0.5)
    ax.set_xlabel(f"bytes on the wire per context token (FP16: {t['rows'][0]['fp16_bytes_per_token']:.0f}; log)")
    ax.set_ylabel("gated perplexity delta (symlog)")
    ax.set_title("A prefix's cache on the wire: bytes against quality")
    ax.legend(loc="upper right", fontsize=8)
    alt = (f"Transfer plot of {len(t['rows'])} schemes: bytes per context token against gated perplexity delta. "
           f"Fewest bytes that pass robustly: {t['fewest'] or 'none'}.")
    return Figure(fig, alt)

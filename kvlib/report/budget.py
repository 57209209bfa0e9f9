"""What the report shows of mixed precision: the layer x role x candidate sensitivity heatmap,
each budget's allocation drawn per layer, and how the mixes' predicted KL compares with the
measured one and with their gated delta on the evaluation windows. Built from a SweepResult (or
its JSON) so the notebook only calls and displays."""

from __future__ import annotations

import html
import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from kvlib.budget.sensitivity import role_labels
from kvlib.report.common import Figure, fmt
from kvlib.runs.sweep import MIX_PREFIX, SweepResult

ROLE_NAMES = ("keys", "values")


def _budget(result: SweepResult | dict[str, Any]) -> dict[str, Any]:
    r = result.to_dict() if isinstance(result, SweepResult) else result
    return r.get("budget") or {}


def plot_sensitivity(result: SweepResult | dict[str, Any]) -> Figure | None:
    """Heatmap of log10 mean KL per (layer, role, candidate): which slots are sensitive."""
    b = _budget(result)
    if not b:
        return None
    sens = b["sensitivity"]
    kl = np.array(sens["kl"], dtype=float)  # [layers, 2, candidates]
    names = sens["names"]
    nl, _, nc = kl.shape
    fig, axes = plt.subplots(1, 2, figsize=(12.5, max(4.0, 0.22 * nl + 1.8)), constrained_layout=True, sharey=True)
    vals = np.log10(np.clip(kl, 1e-7, None))
    lo, hi = np.nanmin(vals), np.nanmax(vals)
    for r, ax in enumerate(axes):
        im = ax.imshow(vals[:, r, :], aspect="auto", cmap="magma_r", vmin=lo, vmax=hi, interpolation="nearest")
        ax.set_xticks(range(nc), role_labels(sens["names"], sens["candidates"], r), rotation=30, ha="right")
        ax.set_title(f"{ROLE_NAMES[r]}: only this slot compressed")
        ax.set_xlabel("candidate")
    axes[0].set_ylabel("layer")
    axes[0].set_yticks(range(0, nl, max(1, nl // 15)))
    fig.colorbar(im, ax=axes, label="log10 mean KL(exact || slot compressed), nats/token", shrink=0.8)
    worst = sorted(((kl[la, r, 0], la, r) for la in range(nl) for r in range(2)), reverse=True)[:3]
    alt = (f"Sensitivity heatmap over {nl} layers, keys and values, {nc} candidates ({', '.join(names)}). "
           f"Most sensitive under {names[0]}: " + "; ".join(f"layer {la} {ROLE_NAMES[r]} {v:.4f}" for v, la, r in worst))
    return Figure(fig, alt)


def plot_allocation(result: SweepResult | dict[str, Any]) -> Figure | None:
    """Each budget's choice, drawn per layer: the bits per element its keys and values store."""
    b = _budget(result)
    if not b or not b["mixes"]:
        return None
    sens = b["sensitivity"]
    names = sens["names"]
    nl = len(sens["kl"])
    bits = np.array([[[8 * sens["stored_bytes"][la][r][c] / max(sens["elements"][la][r], 1) for c in range(len(names))]
                      for r in range(2)] for la in range(nl)])
    mixes = b["mixes"]
    fig, axes = plt.subplots(len(mixes), 1, figsize=(12.5, 2.8 * len(mixes) + 0.6), constrained_layout=True,
                             squeeze=False)
    x = np.arange(nl)
    for ax, m in zip(axes[:, 0], mixes):
        for r, (off, color) in enumerate(((-0.2, "#1f77b4"), (0.2, "#ff7f0e"))):
            if m.get("head_choice"):  # per head: the slot's bits are its heads' mean
                heights = [float(np.mean([bits[la, r, c] for c in m["head_choice"][la][r]])) for la in range(nl)]
            else:
                heights = [bits[la, r, m["choice"][la][r]] for la in range(nl)]
            ax.bar(x + off, heights, width=0.4, color=color, label=ROLE_NAMES[r])
        ax.axhline(m["budget"], color="#cf222e", lw=1, ls="--", label=f"budget {m['budget']:g}")
        ax.set_ylabel("bits / element" + (" (heads' mean)" if m.get("head_choice") else ""))
        ax.set_xticks(x[:: max(1, nl // 30)])
        ax.set_title(f"{MIX_PREFIX}{m['budget']:g}: {m['bits']:.3f} bits/element stored; KL predicted "
                     f"{m['predicted_kl']:.4f}, measured {m['measured_kl']:.4f}", fontsize=10)
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8)
    axes[-1, 0].set_xlabel("layer")
    levels = sorted({round(float(v), 3) for v in bits.reshape(-1)})
    alt = (f"Allocation per layer for {len(mixes)} budget(s); candidate sizes {levels} bits/element. "
           + "; ".join(f"budget {m['budget']:g}: {m['bits']:.3f} bits, spec {m['spec']}" for m in mixes))
    return Figure(fig, alt)


def budget_rows(result: SweepResult | dict[str, Any]) -> list[list[str]]:
    """One row per budget: what it stores, the calibration KL predicted and measured, and its
    gated delta on the evaluation windows with the verdict."""
    r = result.to_dict() if isinstance(result, SweepResult) else result
    b = _budget(r)
    rows = []
    by_name = {s["name"]: s for s in r["schemes"]}
    for m in b.get("mixes", []):
        s = by_name.get(f"{MIX_PREFIX}{m['budget']:g}", {})
        ratio = m["measured_kl"] / m["predicted_kl"] if m["predicted_kl"] > 0 else math.nan
        rows.append([f"{MIX_PREFIX}{m['budget']:g}", f"{m['budget']:g}", f"{m['bits']:.3f}",
                     fmt(s.get("bits_per_element"), ".3f"),
                     f"{m['predicted_kl']:.4f}", f"{m['measured_kl']:.4f}", fmt(ratio, ".2f"),
                     fmt(s.get("context_delta"), "+.4f"),
                     f"[{fmt(s.get('ci_low'), '+.3f')}, {fmt(s.get('ci_high'), '+.3f')}]",
                     fmt(s.get("kld_mean"), ".4f"),
                     "PASS (robust)" if s.get("robust") else "PASS" if s.get("passed") else "FAIL"])
    return rows


BUDGET_HEADERS = ["mix", "bits asked", "bits planned (calibration)", "bits stored (evaluation)", "KL predicted", "KL measured",
                  "measured / predicted", "gated delta", "CI", "KL (evaluation)", "verdict"]


def budget_table(result: SweepResult | dict[str, Any]):
    """The budgets' table (a styled DataFrame), or None without a budget."""
    rows = budget_rows(result)
    if not rows:
        return None
    return pd.DataFrame(rows, columns=BUDGET_HEADERS).style.hide(axis="index")


def budget_note(result: SweepResult | dict[str, Any]):
    """How the mixes were chosen and on which windows, and the spec each can be reused as."""
    from IPython.display import HTML

    b = _budget(result)
    if not b:
        return HTML("<p>No sensitivity pass in this run (give a budget to add one).</p>")
    sens = b["sensitivity"]
    how = ("read from the results store" if b.get("reused") else
           f"{sens['forwards']} suffix forwards in {sens['seconds']:.0f} s; prefix reuse ran "
           f"{100 * sens['layers_run']:.0f} % of the decoder layers")
    if sens.get("measure") == "fast":
        how += (f"; measured fast: one batched forward per layer, the LM head on the exact run's "
                f"{sens['head_tokens']} most likely tokens (they hold {100 * (1 - sens['head_tail']):.1f} % of its "
                f"probability)")
    if sens.get("context_tokens"):
        how += f"; contexts of {sens['context_tokens']} tokens, the evaluated windows' layout"
    specs = "".join(f"<li><code>{MIX_PREFIX}{m['budget']:g}</code>: <code>--scheme '{html.escape(m['spec'])}'</code></li>"
                    for m in b["mixes"])
    return HTML(
        f"<p><b>Calibration</b> (never the evaluated windows): {html.escape(sens['calibration'])}; "
        f"{sens['targets']} scored tokens. A slot's cost is the mean KL(exact || compressed) of the next-token "
        f"distribution when only that layer's keys or values go through the candidate, everything else exact "
        f"({how}). Each budget's choice minimises the summed costs with the stored bits per element, weighted by "
        f"the elements each slot holds, at most the budget: an exact multiple-choice knapsack over the slots' "
        f"stored bytes. <i>KL predicted</i> is that sum; <i>KL measured</i> scores the whole mix on the same "
        f"windows.</p><ul>{specs}</ul>")

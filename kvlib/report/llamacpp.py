"""What the llama.cpp report shows: each cache type's perplexity delta as ``llama-perplexity`` computes
it beside kvlib's write-mode delta for the same ``llama.cpp:*`` option, each with its CI, the CI of
their difference and the agreement goal; and one plot of the two deltas against each other. Built
from ``SideBySide`` runs (``make peer-llamacpp``'s JSON)."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt

from kvlib.gates import CI_LEVEL
from kvlib.report.common import Figure, fmt, html_table
from kvlib.runs.llamacpp import AGREE_ABS, AGREE_REL, Comparison, SideBySide, weights_label

HEADERS = ["setting", "flags", "llama.cpp perplexity", "llama.cpp Δ [CI]", "kvlib write-mode perplexity",
           "kvlib Δ [CI]", "kvlib − llama.cpp [CI]", "agreement goal"]


def _ci(v: float, ci: tuple[float, float], spec: str = "+.3f") -> str:
    return f"<b>{fmt(v, spec)}</b> <small>[{fmt(ci[0], spec)}, {fmt(ci[1], spec)}]</small>"


def agreement(c: Comparison) -> str:
    """'met (9.6 %)', 'met (0.02 bound)' or 'NOT met (…)': the goal is the larger of 15 % of
    llama.cpp's delta and 0.02."""
    diff = abs(c.kvlib_delta - c.engine_delta)
    rel = AGREE_REL * abs(c.engine_delta) >= AGREE_ABS
    how = f"{diff / abs(c.engine_delta) * 100:.1f} %" if rel else f"{AGREE_ABS:g} bound"
    return f"met ({how})" if c.agrees else f"<b>NOT met</b> ({how})"


def comparison_table(r: SideBySide):
    """One row per setting, the f16 baselines first."""
    rows = [["f16 K and V (each side's baseline)", "<code>llama-perplexity -ctk f16 -ctv f16</code>", fmt(r.engine_base_ppl, ".4f"), "",
             fmt(r.kvlib_base_ppl, ".4f"), "", "", ""]]
    for c in r.rows:
        lo, hi = c.diff_ci
        rows.append([html.escape(c.setting.label), f"<code>{html.escape(c.setting.flags)}</code>",
                     fmt(c.engine_ppl, ".4f"), _ci(c.engine_delta, c.engine_ci), fmt(c.kvlib_ppl, ".4f"),
                     _ci(c.kvlib_delta, c.kvlib_ci), _ci(c.kvlib_delta - c.engine_delta, (lo, hi)), agreement(c)])
    return html_table("kvlib-llamacpp", HEADERS, rows, wrap=(0, 1))


def plot_differences(runs: list[SideBySide]) -> Figure:
    """A forest plot: per setting, kvlib's delta minus llama.cpp's with its paired CI, over the
    agreement goal's band for that setting (the larger of 15 % of llama.cpp's delta and 0.02)."""
    rows = [(r, c) for r in runs for c in r.rows]
    fig, ax = plt.subplots(figsize=(7.2, 0.9 + 0.3 * len(rows)), constrained_layout=True)
    for i, (r, c) in enumerate(rows):
        bound = max(AGREE_REL * abs(c.engine_delta), AGREE_ABS)
        ax.add_patch(plt.Rectangle((-bound, i - 0.4), 2 * bound, 0.8, color="#1a7f37", alpha=0.15, lw=0))
        lo, hi = c.diff_ci
        d = c.kvlib_delta - c.engine_delta
        color = "#1f77b4" if c.agrees else "#d62728"
        ax.errorbar([d], [i], xerr=[[d - lo], [hi - d]], fmt="o", color=color, ms=5, capsize=3, lw=1)
    ax.axvline(0, color="#555555", lw=0.8)
    ax.set_yticks(range(len(rows)), [f"{c.setting.label} ({r.model.split('.')[0]}{', F32 weights' if r.engine_weights == 'f32' else ''}, "
                                     f"{r.chunks} chunks)"
                                     for r, c in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("kvlib's write-mode Δ perplexity minus llama.cpp's (each against its own f16 cache)")
    ax.set_title(f"green: the agreement goal; bars: {CI_LEVEL:.0%} paired CIs over chunks; red: goal not met",
                 fontsize=9)
    return Figure(fig, f"kvlib's delta minus llama.cpp's for {len(rows)} settings with {CI_LEVEL:.0%} CIs, "
                       "the agreement goal shaded")


def reading(r: SideBySide) -> str:
    """The run in a few sentences: how many settings meet the goal, which do not, and the time each side took."""
    bad = [c for c in r.rows if not c.agrees]
    reused = f" (kvlib's side from `{r.kvlib_from}`)" if r.kvlib_from else ""
    says = [f"**{r.model}** on `{r.text}`, {r.chunks} chunks of {r.n_ctx} tokens, llama.cpp on {weights_label(r)}"
            f"{reused}: **{len(r.rows) - len(bad)} of {len(r.rows)}** settings meet the agreement goal."]
    for c in bad:
        lo, hi = c.diff_ci
        spans = "spans zero" if lo <= 0 <= hi else "excludes zero"
        says.append(f"{c.setting.label}: llama.cpp {c.engine_delta:+.3f}, kvlib {c.kvlib_delta:+.3f}; the CI of "
                    f"the difference [{lo:+.3f}, {hi:+.3f}] {spans}.")
    s = r.seconds
    if s.get("llama.cpp_s") and s.get("kvlib_s"):
        says.append(f"llama.cpp's {len(r.rows) + 1} runs took {s['llama.cpp_s']:,.0f} s, kvlib's write mode on the "
                    f"same chunks {s['kvlib_s']:,.0f} s ({s['kvlib_s'] / s['llama.cpp_s']:.2f}×).")
    return " ".join(says)

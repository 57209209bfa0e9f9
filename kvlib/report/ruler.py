"""What the RULER report shows: a task × length heatmap per cache (floors hatched), RULER's average
per length with its CI, and both families — quantization and eviction — on one accuracy-vs-bytes
plot per length. Built from a ``RulerResult``."""

from __future__ import annotations

import html
import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LinearSegmentedColormap

from kvlib.checks.ruler.run import EXACT, RulerResult
from kvlib.gates import RULER_EXACT_FLOOR
from kvlib.report.common import Figure, fmt, length_label, place_labels

_CMAP = LinearSegmentedColormap.from_list("kvlib_ruler", ["#cf222e", "#f2cc60", "#1a7f37"])
_PRESS_COLORS = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#ff7f0e")
_KIND_STYLE = {"exact": ("#000000", "*", "exact cache"), "kvq": ("#1f77b4", "o", "quantization (kvlib codec)"),
               "evict": ("#d62728", "s", "eviction (kvpress presses)"), "transform": ("#7f7f7f", "D", "other")}


class HTML:
    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_html_(self) -> str:
        return self.text


def _columns(r: RulerResult) -> list[tuple[str, int]]:
    """The (task, length) cells a run measured, length by length."""
    return [(t, n) for n in r.lengths for t in r.tasks() if r.scores(EXACT, t, n)]


_KIND_ORDER = {"exact": 0, "kvq": 1, "transform": 2, "evict": 3}


def ordered(r: RulerResult) -> list[str]:
    """The caches as a reader compares them: the exact cache, then the codecs from most bits to fewest,
    then other transforms, then the eviction peers from most kept bytes to fewest (run order on ties)."""
    def key(item: tuple[int, str]) -> tuple[int, float, int]:
        i, name = item
        meta = r.schemes[name]
        bits = meta.get("bits")
        return (_KIND_ORDER.get(meta["kind"], 2), -bits if bits is not None and not math.isnan(bits) else math.inf, i)
    return [name for _, name in sorted(enumerate(r.schemes), key=key)]


def plot_heatmaps(r: RulerResult) -> Figure:
    """Accuracy per cache (rows, the exact cache first) and (task, length) cell (columns); a hatched
    column is a floor (the exact cache is below the qualifying accuracy there, the schemes not
    compared), a blank cell one that was not run."""
    cols, names = _columns(r), ordered(r)
    acc = np.array([[r.cell(name, t, n)[0] for t, n in cols] for name in names]) / 100
    fig, ax = plt.subplots(figsize=(2.2 + 0.95 * len(cols), 0.9 + 0.27 * len(names)), constrained_layout=True)
    ax.imshow(np.ma.masked_invalid(acc), cmap=_CMAP, vmin=0, vmax=1, aspect="auto")
    for j, (t, n) in enumerate(cols):
        if not r.qualifies(t, n):
            ax.add_patch(plt.Rectangle((j - 0.5, -0.5), 1, len(names), fill=False, hatch="///", lw=0,
                                       color="#999999"))
        for i in range(len(names)):
            v = acc[i, j]
            if not math.isnan(v):
                ax.text(j, i, fmt(v * 100, ".0f"), ha="center", va="center", fontsize=7.5,
                        color="white" if v < 0.3 or v > 0.7 else "black")
    ax.set_xticks(range(len(cols)), [f"{t}\n{length_label(n)}" for t, n in cols],
                  fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.grid(False)
    return Figure(fig, f"RULER accuracy (%) of {len(names)} caches per task and length; hatched columns are floors")


def average_table(r: RulerResult) -> HTML:
    """RULER's average per length (over all tasks, and over the qualifying ones) with CIs, and the
    cache's size, per cache."""
    head = "".join(f"<th>{n} tokens: all tasks</th><th>{n}: qualifying</th><th>{n}: MB</th>" for n in r.lengths)
    rows = []
    for name in ordered(r):
        meta, cells = r.schemes[name], []
        for n in r.lengths:
            for q in (False, True):
                a, lo, hi = r.average(name, n, qualifying_only=q)
                ci = f" [{fmt(lo, '.1f')}, {fmt(hi, '.1f')}]" if not math.isnan(lo) else ""
                cells.append(f"<td>{fmt(a, '.1f')}{ci}</td>")
            cells.append(f"<td>{fmt(r.megabytes(name, n), '.1f')}</td>")
        bits = meta.get("bits")
        what = {"exact": "16-bit cache", "kvq": f"{fmt(bits, '.2f')} bits/element",
                "evict": f"keeps {fmt(bits / 16 * 100 if bits is not None else math.nan, '.1f')} % of the tokens "
                         f"(the bytes of {meta.get('compared_to', '')})"}.get(meta["kind"], meta["kind"])
        rows.append(f"<tr><td><code>{html.escape(name)}</code></td><td>{html.escape(what)}</td>{''.join(cells)}</tr>")
    return HTML(f"<table><tr><th>cache</th><th>what</th>{head}</tr>{''.join(rows)}</table>")


def cell_table(r: RulerResult) -> HTML:
    """Every cache (rows) on every (task, length) (columns): accuracy with its CI, floors marked."""
    cols = _columns(r)
    head = "".join(f"<th>{html.escape(t)}<br>{n}" + (" <em>(floor)</em>" if not r.qualifies(t, n) else "")
                   + f"<br><small>{len(r.scores(EXACT, t, n))} samples</small></th>" for t, n in cols)
    rows = []
    for name in ordered(r):
        cells = []
        for t, n in cols:
            a, lo, hi = r.cell(name, t, n)
            ci = f" <small>[{fmt(lo, '.0f')}, {fmt(hi, '.0f')}]</small>" if not math.isnan(lo) else ""
            cells.append(f"<td>{fmt(a, '.0f')}{ci}</td>")
        rows.append(f"<tr><td><code>{html.escape(name)}</code></td>{''.join(cells)}</tr>")
    return HTML(f"<table><tr><th>cache</th>{head}</tr>{''.join(rows)}</table>")


def plot_accuracy_vs_bytes(r: RulerResult) -> Figure:
    """Per length: each cache's RULER average over the qualifying tasks (with its CI) against its
    cache's size; the codecs as labelled points, each eviction press as one line across its bytes."""
    fig, axes = plt.subplots(1, len(r.lengths), figsize=(8.5 * len(r.lengths), 5.6), squeeze=False,
                             constrained_layout=True)
    for ax, n in zip(axes.flat, r.lengths):
        labels: list[tuple[float, float, str, str]] = []
        lines: dict[str, list[tuple[float, float, float, float]]] = {}
        for name, meta in r.schemes.items():
            a, lo, hi = r.average(name, n, qualifying_only=True)
            mb = r.megabytes(name, n)
            if math.isnan(a) or math.isnan(mb) or mb <= 0:  # no size known: no place on a log axis
                continue
            if meta["kind"] == "evict":
                lines.setdefault(name.split("@", 1)[0], []).append((mb, a, lo, hi))
                continue
            color, marker, label = _KIND_STYLE.get(meta["kind"], _KIND_STYLE["transform"])
            yerr = None if math.isnan(lo) else [[a - lo], [hi - a]]
            ax.errorbar([mb], [a], yerr=yerr, fmt=marker, color=color, capsize=3,
                        label=label if not any(h.get_label() == label for h in ax.lines + ax.containers) else None)
            labels.append((mb, a, name, color))
        for k, (press, pts) in enumerate(sorted(lines.items())):
            pts.sort()
            x, y = [p[0] for p in pts], [p[1] for p in pts]
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax.errorbar(x, y, yerr=None if any(math.isnan(e) for e in err[0]) else err, fmt="s-",
                        color=_PRESS_COLORS[k % len(_PRESS_COLORS)], capsize=2, ms=4, lw=1.2, alpha=0.85,
                        label=f"eviction: {press} (at each scheme's bytes)")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_ylim(-5, 108)
        ax.set_xlabel("context cache (MB, log scale)")
        ax.set_ylabel("RULER average, qualifying tasks (%)")
        ax.set_title(f"{n} tokens")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)  # below: no point hidden
        place_labels(fig, ax, labels)  # after the axes' limits: labels clear of each other and the markers
    return Figure(fig, "RULER average against cache size, quantization and eviction, one panel per length")


def reading(r: RulerResult) -> str:
    """Plain language: which cells qualify, and per qualifying cell the caches that lose more than
    the CI allows (their CI's upper end below the exact cache's accuracy)."""
    out = []
    for n in r.lengths:
        tasks = [t for t in r.tasks() if r.scores(EXACT, t, n)]
        q = [t for t in tasks if r.qualifies(t, n)]
        floors = [t for t in tasks if t not in q]
        out.append(f"- **{n} tokens**: the exact cache reaches {RULER_EXACT_FLOOR:.0f} % on {len(q)} of "
                   f"{len(tasks)} tasks" + (f" (floors: {', '.join(floors)})" if floors else "") + ".")
        for t in q:
            exact = r.cell(EXACT, t, n)[0]
            for kind, what in (("kvq", "quantized"), ("evict", "evicted"), ("transform", "other")):
                worse = [name for name, m in r.schemes.items() if m["kind"] == kind and r.cell(name, t, n)[2] < exact]
                same = [name for name, m in r.schemes.items() if m["kind"] == kind and r.cell(name, t, n)[2] >= exact]
                if worse or same:
                    out.append(f"  - {t}, {what} caches: " + (f"below the exact cache beyond their CI: "
                               f"{', '.join(f'`{w}`' for w in worse)}" if worse else "none below the exact cache "
                               "beyond its CI") + (f"; within it: {len(same)}" if worse and same else "") + ".")
    for note in r.notes:
        out.append(f"- note: {note}")
    return "\n".join(out)

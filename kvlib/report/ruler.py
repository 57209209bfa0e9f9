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
from kvlib.report.common import Figure, fmt

_CMAP = LinearSegmentedColormap.from_list("kvlib_ruler", ["#cf222e", "#f2cc60", "#1a7f37"])
_KIND_STYLE = {"exact": ("#000000", "*", "exact cache"), "kvq": ("#1f77b4", "o", "quantization (kvlib codec)"),
               "evict": ("#d62728", "s", "eviction (kvpress presses)"), "transform": ("#7f7f7f", "D", "other")}


class HTML:
    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_html_(self) -> str:
        return self.text


def plot_heatmaps(r: RulerResult, ncols: int = 4) -> Figure:
    """Accuracy per (task, length), one panel per cache, the exact cache first; a hatched cell is a
    floor (the exact cache is below the qualifying accuracy there)."""
    tasks, names = r.tasks(), list(r.schemes)
    ncols = min(ncols, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=((1.4 + 0.75 * len(r.lengths)) * ncols + 1.2,
                                                    (0.8 + 0.34 * len(tasks)) * nrows + 0.4),
                             squeeze=False, constrained_layout=True)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for k, (ax, name) in enumerate(zip(axes.flat, names)):
        acc = np.array([[r.cell(name, t, n)[0] for n in r.lengths] for t in tasks]) / 100
        ax.imshow(acc, cmap=_CMAP, vmin=0, vmax=1, aspect="auto")
        for i, t in enumerate(tasks):
            for j, n in enumerate(r.lengths):
                floor = not r.qualifies(t, n)
                if floor:
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", lw=0,
                                               color="#555555"))
                ax.text(j, i, fmt(acc[i, j] * 100, ".0f"), ha="center", va="center", fontsize=8,
                        color="white" if not math.isnan(acc[i, j]) and (acc[i, j] < 0.3 or acc[i, j] > 0.7)
                        else "black")
        ax.set_xticks(range(len(r.lengths)), [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in r.lengths])
        ax.set_yticks(range(len(tasks)), tasks if k % ncols == 0 else [""] * len(tasks))
        ax.set_title(name, fontsize=9)
        ax.grid(False)
    return Figure(fig, f"RULER accuracy per task and length for {len(names)} caches; hatched cells are floors")


def average_table(r: RulerResult) -> HTML:
    """RULER's average per length (over all tasks, and over the qualifying ones) with CIs, and the
    cache's size, per cache."""
    head = "".join(f"<th>{n} tokens: all tasks</th><th>{n}: qualifying</th><th>{n}: MB</th>" for n in r.lengths)
    rows = []
    for name, meta in r.schemes.items():
        cells = []
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
    """Every (task, length): the exact cache's accuracy and each cache's, with CIs; floors marked."""
    names = list(r.schemes)
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = []
    for n in r.lengths:
        for t in r.tasks():
            floor = not r.qualifies(t, n)
            cells = []
            for name in names:
                a, lo, hi = r.cell(name, t, n)
                ci = f" <small>[{fmt(lo, '.0f')}, {fmt(hi, '.0f')}]</small>" if not math.isnan(lo) else ""
                cells.append(f"<td>{fmt(a, '.0f')}{ci}</td>")
            tag = " <em>(floor)</em>" if floor else ""
            rows.append(f"<tr><td>{n}</td><td>{t}{tag}</td><td>{len(r.scores(EXACT, t, n))}</td>{''.join(cells)}</tr>")
    return HTML(f"<table><tr><th>length</th><th>task</th><th>samples</th>{head}</tr>{''.join(rows)}</table>")


def plot_accuracy_vs_bytes(r: RulerResult) -> Figure:
    """Per length: each cache's RULER average over the qualifying tasks (with its CI) against its
    cache's size; quantization and eviction on one plot."""
    fig, axes = plt.subplots(1, len(r.lengths), figsize=(5.2 * len(r.lengths), 3.8), squeeze=False,
                             constrained_layout=True)
    for ax, n in zip(axes.flat, r.lengths):
        seen, placed = set(), []
        for name, meta in r.schemes.items():
            a, lo, hi = r.average(name, n, qualifying_only=True)
            mb = r.megabytes(name, n)
            if math.isnan(a) or math.isnan(mb):
                continue
            color, marker, label = _KIND_STYLE.get(meta["kind"], _KIND_STYLE["transform"])
            yerr = None if math.isnan(lo) else [[a - lo], [hi - a]]
            ax.errorbar([mb], [a], yerr=yerr, fmt=marker, color=color, capsize=3,
                        label=None if label in seen else label)
            seen.add(label)
            near = sum(abs(math.log(mb / m)) < 0.05 and abs(a - y) < 4 for m, y in placed)
            placed.append((mb, a))
            ax.annotate(name, (mb, a), textcoords="offset points", xytext=(6, 4 + 10 * near), fontsize=7.5)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_ylim(-5, 105)
        ax.set_xlabel("context cache (MB, log scale)")
        ax.set_ylabel("RULER average, qualifying tasks (%)")
        ax.set_title(f"{n} tokens")
        ax.legend(fontsize=8, loc="lower right")
    return Figure(fig, "RULER average against cache size, quantization and eviction, one panel per length")


def reading(r: RulerResult) -> str:
    """Plain language: which cells qualify, and where a cache loses more than the CI allows."""
    tasks = r.tasks()
    out = []
    for n in r.lengths:
        q = [t for t in tasks if r.qualifies(t, n)]
        floors = [t for t in tasks if t not in q]
        out.append(f"- **{n} tokens**: the exact cache reaches {RULER_EXACT_FLOOR:.0f} % on {len(q)} of "
                   f"{len(tasks)} tasks" + (f" (floors: {', '.join(floors)})" if floors else "") + ".")
        for name in r.schemes:
            if name == EXACT:
                continue
            worse = [t for t in q if r.cell(name, t, n)[2] < r.cell(EXACT, t, n)[0]]
            if worse:
                out.append(f"  - `{name}` scores below the exact cache beyond its CI on {', '.join(worse)}.")
    for note in r.notes:
        out.append(f"- note: {note}")
    return "\n".join(out)

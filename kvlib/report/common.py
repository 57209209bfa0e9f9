"""What every report shares: matplotlib's settings, the Figure wrapper, number formatting,
sliding-layer marks and the timing table.

Figures are created with pyplot and closed at once: the notebook shows each
exactly once through ``display``.
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

import matplotlib

import matplotlib.pyplot as plt
import numpy as np


matplotlib.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "axes.grid": True, "grid.alpha": 0.3,
                            "font.size": 10, "axes.titlesize": 11})

KEY_COLOR, VALUE_COLOR = "#1f77b4", "#d62728"


class Figure:
    """A figure shown as an embedded PNG with alt text (rendered now, then closed)."""

    def __init__(self, fig: Any, alt: str) -> None:
        import base64
        import io

        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        plt.close(fig)
        self.alt, self.png = alt, buf.getvalue()
        self._b64 = base64.b64encode(self.png).decode()

    def _repr_html_(self) -> str:
        return (f'<img alt="{html.escape(self.alt, quote=True)}" src="data:image/png;base64,{self._b64}" '
                f'style="max-width:100%;height:auto">')


def setup_notebook() -> None:
    """Quiet the libraries' progress bars and warnings so the rendered report holds results only."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    logging.getLogger("datasets").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def as_number(v: Any) -> float:
    return math.nan if v is None else float(v)


def fmt(v: Any, spec: str) -> str:
    """Format a number for the report; missing values (NaN/None) as an en dash."""
    x = as_number(v)
    return "–" if math.isnan(x) else format(x, spec)


def tensors_by_layer(result: dict[str, Any]) -> tuple[list[int], dict[str, dict[int, dict[str, Any]]]]:
    by: dict[str, dict[int, dict[str, Any]]] = {"key": {}, "value": {}}
    for t in (result.get("compression") or {}).get("tensors", []):
        m = re.fullmatch(r"layer_(\d+)_(key|value)", t["name"])
        if m:
            by[m.group(2)][int(m.group(1))] = t
    layers = sorted(set(by["key"]) | set(by["value"]))
    return layers, by


def mark_sliding_layers(ax: Any, result: dict[str, Any]) -> None:
    """Shade the sliding-window layers of a per-layer plot (they store only the last window - 1 tokens)."""
    windows = (result.get("kv_geometry") or {}).get("layer_windows") or []
    sliding = [i for i, w in enumerate(windows) if w]
    for j, i in enumerate(sliding):
        ax.axvspan(i - 0.5, i + 0.5, color="#e8edf3", zorder=0, lw=0,
                   label=f"sliding-window layer ({'/'.join(str(w) for w in sorted(set(windows) - {0}))} tokens)"
                   if j == 0 else None)


def finite_array(values: list[Any]) -> np.ndarray:
    return np.array([as_number(v) for v in values], dtype=float)


_TIMING_LABELS = {
    "model_load_s": "model load", "perplexity_s": "scoring (perplexity windows)", "scoring_s": "scoring (perplexity windows)",
    "bridge_s": "  of which codec round trips", "bridge_save_s": "  bridge: save", "bridge_cli_s": "  bridge: kv-compress",
    "bridge_load_s": "  bridge: load", "retrieval_s": "pass-key retrieval", "agreement_s": "generation agreement",
    "total_s": "total",
}


def fmt_seconds(v: float) -> str:
    """A duration as a reader wants it: '14.8 s', or '213 ms' below a second."""
    return f"{v:.1f} s" if v >= 1 else f"{v * 1000:.0f} ms"


def timing_rows(timing: dict[str, float]) -> list[tuple[str, str]]:
    """(step, time) rows of a run's timing dict, in the order a run takes them; tokens/s as a rate."""
    rows = [(label, fmt_seconds(timing[k])) for k, label in _TIMING_LABELS.items() if k in timing and k != "total_s"]
    rows += [(k.removesuffix("_s"), fmt_seconds(v)) for k, v in timing.items()
             if k.endswith("_s") and k not in _TIMING_LABELS and k != "scored_tokens_per_s"]  # e.g. per model
    if "scored_tokens_per_s" in timing:
        rows.append(("scored tokens per second", fmt(timing["scored_tokens_per_s"], ".1f")))
    if "units_computed" in timing:
        rows.append(("perplexity units computed / read from the store",
                     f"{timing['units_computed']:.0f} / {timing.get('units_reused', 0):.0f}"))
    if "total_s" in timing:
        rows.append(("total", fmt_seconds(timing["total_s"])))
    return rows


def length_label(n: int) -> str:
    """A token count as a column says it: 4096 → 4K, 1000 → 1000."""
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def html_table(table_id: str, headers: list[str], rows: list[list[str]], wrap: tuple[int, ...] = ()):
    """An HTML table; the columns in ``wrap`` (long text) wrap, the others stay on one line."""
    from IPython.display import HTML

    head = "".join(f'<th style="text-align:{"left" if i in wrap else "right"}">{html.escape(h)}</th>'
                   for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(
        f'<td style="white-space:{"normal;overflow-wrap:anywhere;text-align:left;min-width:14em" if i in wrap else "nowrap"}">{c}</td>'
        for i, c in enumerate(r)) + "</tr>" for r in rows)
    return HTML(f'<table id="{table_id}" style="font-size:12.5px"><thead><tr>{head}</tr></thead>'
                f'<tbody>{body}</tbody></table>')


def timing_table(timing: dict[str, float]):
    """The run's timings as a small table (id ``kvlib-timing``)."""
    from IPython.display import HTML

    body = "".join(f'<tr><th style="text-align:left;white-space:pre">{html.escape(k)}</th>'
                   f'<td class="value" style="text-align:right">{html.escape(v)}</td></tr>'
                   for k, v in timing_rows(timing))
    return HTML(f'<table id="kvlib-timing" style="font-size:13px"><thead><tr><th>Step</th><th>Time</th></tr></thead>'
                f'<tbody>{body}</tbody></table>')


# Where a label may go, in points from its marker: right, below right, left, above, further out.
_OFFSETS = [(6, 3), (6, -10), (-6, 3), (-6, -10), (6, 12), (6, -19), (-6, 12), (-6, -19), (14, 22), (14, -28)]


def place_labels(fig: Any, ax: Any, points: list[tuple[float, float, str, str]]) -> None:
    """Label each point at the first offset whose box overlaps no placed label and no other marker."""
    ax.autoscale_view()
    fig.canvas.draw()
    to_px = ax.transData.transform
    scale = fig.dpi / 72  # points to pixels
    marks = [to_px((x, y)) for x, y, _, _ in points]
    placed: list[tuple[float, float, float, float]] = []

    def clear(box):
        x0, y0, x1, y1 = box
        if any(x0 < b[2] and b[0] < x1 and y0 < b[3] and b[1] < y1 for b in placed):
            return False
        return not any(x0 - 3 < mx < x1 + 3 and y0 - 3 < my < y1 + 3 for mx, my in marks)

    for (x, y, name, color), (px, py) in sorted(zip(points, marks), key=lambda p: (p[1][0], -p[1][1])):
        w, h = 5.2 * len(name) * scale, 9 * scale
        for dx, dy in _OFFSETS:
            bx = px + dx * scale - (w if dx < 0 else 0)
            by = py + dy * scale
            box = (bx, by, bx + w, by + h)
            if clear(box):
                break
        placed.append(box)
        moved = (dx, dy) != _OFFSETS[0]
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=8, color=color,
                    ha="right" if dx < 0 else "left", va="bottom",
                    arrowprops=dict(arrowstyle="-", color=color, lw=0.6, shrinkA=1, shrinkB=4) if moved else None)

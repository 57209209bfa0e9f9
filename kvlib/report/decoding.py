"""What the retrieval and agreement sections of both reports show: the
depth × length accuracy heatmap per cache, the tables, and side-by-side
continuations with the divergence highlighted. Built from the ``retrieval``
and ``agreement`` dicts of a ValidationResult or SweepResult (or their JSON).
"""

from __future__ import annotations

import html
import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LinearSegmentedColormap

from kvlib.report.common import Figure, fmt, length_label

_CMAP = LinearSegmentedColormap.from_list("kvlib_retrieval", ["#cf222e", "#f2cc60", "#1a7f37"])


def _caches(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The exact cache first, then the schemes in the order they ran."""
    return [d["exact"], *d["schemes"]]


def _grid(s: dict[str, Any], lengths: list[int], depths: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """(found, total) per cell, rows = depths, columns = lengths."""
    found, total = np.zeros((len(depths), len(lengths))), np.zeros((len(depths), len(lengths)))
    for a in s["answers"]:
        i, j = depths.index(a["depth"]), lengths.index(a["length"])
        found[i, j] += bool(a["found"])
        total[i, j] += 1
    return found, total


def _title(s: dict[str, Any]) -> str:
    drop = f", {s['cells_dropped']} cell(s) below exact" if s.get("cells_dropped") else ""
    return f"{s['name']}: {s['found']}/{s['total']}{drop}"


def plot_retrieval(d: dict[str, Any], ncols: int = 4) -> Figure:
    """The standard chart: accuracy per (depth, length) cell, one panel per cache, exact first."""
    lengths, depths = d["lengths"], d["config"]["depths"]
    caches = _caches(d)
    ncols = min(ncols, len(caches))
    nrows = math.ceil(len(caches) / ncols)
    w = 1.0 + 0.62 * len(lengths)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols + 0.8, (0.9 + 0.36 * len(depths)) * nrows + 0.3),
                             squeeze=False, constrained_layout=True)
    for ax in axes.flat[len(caches):]:
        ax.set_visible(False)
    for ax, s in zip(axes.flat, caches):
        found, total = _grid(s, lengths, depths)
        acc = np.divide(found, total, out=np.full_like(found, np.nan), where=total > 0)
        ax.imshow(acc, cmap=_CMAP, vmin=0, vmax=1, aspect="auto")
        for i in range(len(depths)):
            for j in range(len(lengths)):
                ax.text(j, i, f"{found[i, j]:.0f}/{total[i, j]:.0f}", ha="center", va="center", fontsize=7.5,
                        color="white" if acc[i, j] < 0.3 or acc[i, j] > 0.7 else "black")
        ax.set_xticks(range(len(lengths)), [length_label(n) for n in lengths], fontsize=8)
        ax.set_yticks(range(len(depths)), [f"{x:.0%}" for x in depths], fontsize=8)
        ax.grid(False)
        ax.set_title(_title(s), fontsize=9, color="#1a7f37" if s["found"] == s["total"] else
                     ("#cf222e" if s.get("dropped") else "#24292f"))
    for ax in axes[:, 0]:
        ax.set_ylabel("key depth")
    for ax in axes[-1, :]:
        ax.set_xlabel("context length (tokens)")
    alt = ("Pass-key retrieval accuracy by key depth and context length, one panel per cache. Keys found: "
           + "; ".join(f"{s['name']} {s['found']}/{s['total']}" for s in caches))
    return Figure(fig, alt)


def retrieval_rows(d: dict[str, Any]) -> list[list[str]]:
    """Per cache: keys found, accuracy per length, haystacks and cells lost against the exact cache."""
    lengths = d["lengths"]
    rows = []
    for s in _caches(d):
        per_len = []
        for n in lengths:
            hits = [a["found"] for a in s["answers"] if a["length"] == n]
            per_len.append(f"{sum(hits)}/{len(hits)}")
        exact = s is d["exact"]
        rows.append([s["name"], f"{s['found']}/{s['total']}", fmt(100 * s["found"] / s["total"], ".0f") + " %",
                     *per_len, "–" if exact else str(s["dropped"]), "–" if exact else str(s["cells_dropped"])])
    return rows


def retrieval_table(d: dict[str, Any]):
    """The retrieval table as HTML (id ``kvlib-retrieval-table``)."""
    lengths = d["lengths"]
    headers = ["Cache", "Keys found", "Accuracy", *[f"{n} tokens" for n in lengths], "Haystacks lost vs exact",
               "Cells below exact"]
    return _html_table("kvlib-retrieval-table", headers, retrieval_rows(d))


def agreement_rows(d: dict[str, Any]) -> list[list[str]]:
    n = d["config"]["new_tokens"]
    return [[s["name"], fmt(s["agreement"], ".1f") + " %", f"{s['identical']}/{len(s['tokens'])}",
             f"{fmt(s['mean_divergence'], '.1f')} of {n}", f"{min(s['divergence'])}–{max(s['divergence'])}"]
            for s in d["schemes"]]


def agreement_table(d: dict[str, Any]):
    """The agreement table as HTML (id ``kvlib-agreement-table``)."""
    headers = ["Scheme", "Token agreement", "Identical continuations", "First divergence (mean)",
               "First divergence (range)"]
    return _html_table("kvlib-agreement-table", headers, agreement_rows(d))


def agreement_samples(d: dict[str, Any], names: list[str] | None = None):
    """Side by side, per scheme: the end of one prompt's context, then the exact and the
    compressed continuation; the shared part plain, everything from the first divergence marked."""
    from IPython.display import HTML

    esc = lambda t: html.escape(t).replace("\n", "↵<br>")  # noqa: E731
    blocks = []
    for s in d["schemes"]:
        if names is not None and s["name"] not in names:
            continue
        t, i = s["sample_text"], s["sample"]
        where = (f"diverges at token {s['divergence'][i]}" if s["divergence"][i] < d["config"]["new_tokens"]
                 else "never diverges")
        cell = lambda rest, color: (f'<td style="vertical-align:top;text-align:left;width:50%;font-family:monospace;'  # noqa: E731
                                    f'font-size:12px">{esc(t["common"])}<mark style="background:{color}">'
                                    f'{esc(rest)}</mark></td>')
        blocks.append(
            f'<div class="kvlib-sample" style="margin:10px 0"><div style="font-weight:600">{html.escape(s["name"])}'
            f' &middot; prompt {i + 1} {where}</div><div style="color:#57606a;font-family:monospace;font-size:12px">'
            f'…{esc(t["context"])}</div><table style="width:100%;table-layout:fixed"><thead><tr>'
            f'<th style="text-align:left">exact cache</th><th style="text-align:left">{html.escape(s["name"])}</th>'
            f'</tr></thead><tbody><tr>{cell(t["exact"], "#d1f0d9")}{cell(t["compressed"], "#ffd8d3")}</tr></tbody>'
            f'</table></div>')
    return HTML("".join(blocks))


def readings(*ds: dict[str, Any]):
    """The plain-language readings of the checks that ran, as a list (Markdown)."""
    from IPython.display import Markdown

    return Markdown("\n".join(f"- {d['summary']}" for d in ds if d) or "*Neither check ran.*")


def _html_table(table_id: str, headers: list[str], rows: list[list[str]]):
    from IPython.display import HTML

    head = "".join(f'<th style="text-align:{"left" if i == 0 else "right"}">{html.escape(h)}</th>'
                   for i, h in enumerate(headers))
    body = "".join("<tr>" + f'<th style="text-align:left">{html.escape(r[0])}</th>'
                   + "".join(f'<td style="text-align:right;white-space:nowrap">{html.escape(c)}</td>' for c in r[1:])
                   + "</tr>"
                   for r in rows)
    return HTML(f'<table id="{table_id}" style="font-size:12.5px;max-width:100%"><thead><tr>{head}</tr></thead>'
                f'<tbody>{body}</tbody></table>')

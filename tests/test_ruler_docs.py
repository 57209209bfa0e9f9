"""docs/ruler.md's measured tables say what the saved runs they cite hold: every accuracy, CI,
average and MB in a "Measured" section is recomputed from that section's docs/data/ruler JSONs
(merged as `make ruler RULER_JSON=...` merges them), and every perplexity-gate cell from the
perplexity run it cites, so a table edited by hand cannot drift."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from kvlib.checks.ruler.run import EXACT, RulerResult

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ruler.md"
PRESS_COLUMNS = {"StreamingLLM": "streaming_llm", "Knorm": "knorm", "SnapKV": "snapkv"}
CELL = re.compile(r"^(\*\*)?(\d+)(\*\*)?(?: \[(\d+), (\d+)\])?(?: each)?$")
GATE = re.compile(r"^(\*\*FAIL\*\*|pass, robust|pass, CI crosses) \(([+\u2212-]\d+(?:\.\d+)?)\)$")


def sections() -> list[tuple[str, int, list[Path], str]]:
    """(title, length in tokens, the RULER JSONs it cites, its text) per "Measured: ... at NK" section."""
    out = []
    for block in re.split(r"(?m)^## ", DOC.read_text())[1:]:
        title, _, body = block.partition("\n")
        m = re.match(r"Measured: .* at (\d+)K$", title)
        if not m:
            continue
        files = [ROOT / p for p in dict.fromkeys(re.findall(r"docs/data/ruler/[\w.+-]+\.json", body))]
        files = [f for f in files if "answers" in json.loads(f.read_text())]  # not a perplexity run
        out.append((title, int(m.group(1)) * 1024, files, body))
    return out


def gate_runs(body: str) -> dict[str, dict]:
    """The perplexity runs a section cites, the first one first: scheme -> its row in that run."""
    rows: dict[str, dict] = {}
    for p in dict.fromkeys(re.findall(r"docs/data/ruler/[\w.+-]+\.json", body)):
        d = json.loads((ROOT / p).read_text())
        if "answers" not in d:
            for s in d["schemes"]:  # the first run cited is the gate's; a later one is a comparison
                if not s.get("error"):
                    rows.setdefault(s["name"], s)
    return rows


def check_gate(cell: str, s: dict, where: str) -> list[str]:
    """A gate cell ('pass, robust (−0.003)', '**FAIL** (+179)') against the perplexity run's scheme row:
    its verdict, and its gated delta to the digits shown."""
    m = GATE.match(cell)
    if not m:
        return [f"{where}: cannot read gate cell {cell!r}"]
    verdict = "pass, robust" if s["robust"] else "pass, CI crosses" if s["passed"] else "**FAIL**"
    shown = m.group(2).replace("\u2212", "-")
    digits = len(shown.partition(".")[2])
    errors = [] if m.group(1) == verdict else [f"{where}: {cell!r}, the run says {verdict}"]
    if float(shown) != round(s["context_delta"], digits):
        errors.append(f"{where}: {cell!r}, the run's gated delta {s['context_delta']:+.4f}")
    return errors


def tables(body: str) -> list[list[list[str]]]:
    """Each markdown table of a section, as rows of stripped cells (header first, rule dropped)."""
    out, rows = [], []
    for line in body.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif rows:
            out.append(rows)
            rows = []
    return out


def names(cell: str) -> list[str]:
    """The caches a row's first cell names: `int4`, `rot4` -> [int4, rot4]; exact (16-bit) -> [exact]."""
    return [EXACT] if cell.startswith("exact") else re.findall(r"`([^`]+)`", cell)


def fmt(value: float) -> str:
    return f"{value:.0f}"


def check(cell: str, want: tuple[float, float, float], ref: float, where: str) -> list[str]:
    """A cell 'N [lo, hi]' (bold where the CI's upper bound is below ``ref``) against the run's value:
    what differs, in words."""
    m = CELL.match(cell)
    if not m:
        return [f"{where}: cannot read {cell!r}"]
    acc, lo, hi = want
    errors = []
    if m.group(2) != fmt(acc):
        errors.append(f"{where}: {cell!r}, the saved run says {acc:.2f}")
    if m.group(4) is not None and (m.group(4), m.group(5)) != (fmt(lo), fmt(hi)):
        errors.append(f"{where}: {cell!r}, the run's CI [{lo:.1f}, {hi:.1f}]")
    if m.group(4) is None and not lo == hi == acc:
        errors.append(f"{where}: {cell!r} drops a CI [{lo:.1f}, {hi:.1f}]")
    if not math.isnan(ref) and bool(m.group(1)) != (hi < ref):
        errors.append(f"{where}: {cell!r} bold must mean the CI's upper bound < {ref:.1f}")
    return errors


def check_table(rows: list[list[str]], r: RulerResult, n: int, where: str,
                gates: dict[str, dict] | None = None) -> tuple[int, list[str]]:
    """Every cell of one table that names a task, the average, a press, MB or (with ``gates``, the cited
    perplexity run) the perplexity gate: how many, and what differs."""
    head, done, errors = rows[0], 0, []
    tasks = set(r.tasks())
    exact = {t: r.cell(EXACT, t, n)[0] for t in tasks}
    exact_avg = r.average(EXACT, n, True)[0]
    for row in rows[1:]:
        caches = [c for c in names(row[0]) if c in r.schemes or c == EXACT]
        for col, cell in zip(head, row):
            if not cell or cell == "—" or not caches:
                continue
            at = f"{where}, row {row[0]}, column {col}"
            if col in tasks:
                for c in caches:
                    errors += check(cell, r.cell(c, col, n), exact[col] if c != EXACT else math.nan, at)
                    done += 1
            elif col == "average":
                for c in caches:
                    errors += check(cell, r.average(c, n, True), exact_avg if c != EXACT else math.nan, at)
                    done += 1
            elif col in PRESS_COLUMNS:
                press = [p for p, m in r.schemes.items() if m["kind"] == "evict" and p.startswith(PRESS_COLUMNS[col] + "@")
                         and caches[0] in [x.strip() for x in m["compared_to"].split(",")]]
                errors += check(cell, r.average(press[0], n, True), math.nan, at) if press else \
                    [f"{at}: no {col} press at the bytes of {caches[0]} in the saved runs"]
                done += 1
            elif col == "perplexity gate" and gates:
                for c in caches:
                    errors += check_gate(cell, gates[c], at) if c in gates else [f"{at}: {c} not in the cited perplexity run"]
                    done += 1
            elif col == "MB" and "press" not in head[0] and "bytes of" not in head[0]:
                for c in caches:
                    if cell != f"{r.megabytes(c, n):.1f}":
                        errors.append(f"{at}: {cell} MB, the run's {r.megabytes(c, n):.1f}")
                    done += 1
    return done, errors


@pytest.mark.parametrize("title,length,files,body", sections(), ids=[s[0] for s in sections()])
def test_measured_tables_are_the_saved_runs(title, length, files, body):
    assert files, f"{title}: cites no saved RULER run under docs/data/ruler"
    r = RulerResult.merge([RulerResult.from_dict(json.loads(f.read_text())) for f in files])
    checked = [check_table(t, r, length, title, gate_runs(body)) for t in tables(body)]
    errors = [e for _, err in checked for e in err]
    assert not errors, "\n".join(errors)
    assert sum(d for d, _ in checked) >= 5, f"{title}: too few cells checked against the saved runs"


def test_the_checker_catches_a_changed_cell():
    title, length, files, body = sections()[0]
    r = RulerResult.merge([RulerResult.from_dict(json.loads(f.read_text())) for f in files])
    table = next(t for t in tables(body) if any(names(row[0]) == [EXACT] for row in t[1:]))
    row = next(i for i, row in enumerate(table) if names(row[0]) == [EXACT])
    col = next(j for j, h in enumerate(table[0]) if h in r.tasks())
    bad = [list(x) for x in table]
    acc = int(CELL.match(bad[row][col]).group(2))
    bad[row][col] = bad[row][col].replace(str(acc), str(acc - 1), 1)
    assert check_table(table, r, length, title)[1] == []
    assert any("the saved run says" in e for e in check_table(bad, r, length, title)[1])


def test_the_checker_catches_a_changed_gate_verdict():
    title, length, files, body = next(s for s in sections() if gate_runs(s[3]))
    r = RulerResult.merge([RulerResult.from_dict(json.loads(f.read_text())) for f in files])
    gates = gate_runs(body)
    table = next(t for t in tables(body) if "perplexity gate" in t[0])
    col = table[0].index("perplexity gate")
    bad = [list(x) for x in table]
    row = next(i for i, x in enumerate(bad) if x[col].startswith("**FAIL**"))
    bad[row][col] = bad[row][col].replace("**FAIL**", "pass, robust")
    assert check_table(table, r, length, title, gates)[1] == []
    assert any("the run says **FAIL**" in e for e in check_table(bad, r, length, title, gates)[1])

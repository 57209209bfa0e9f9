"""Render the validation report as `make report` does (papermill, then
nbconvert without inputs) on a small run, and check the HTML a reader gets."""

from __future__ import annotations

import base64
import json
import os
import re
from html.parser import HTMLParser

import pytest

from conftest import REPO

NOTEBOOK = REPO / "notebooks" / "validate_perplexity.ipynb"


class _Page(HTMLParser):
    """Collects the banner, the summary table's rows and the embedded images."""

    def __init__(self) -> None:
        super().__init__()
        self.verdict = None
        self.banner_text: list[str] = []
        self.rows: dict[str, str] = {}
        self.tables: dict[str, dict[str, str]] = {}
        self.images: list[str] = []
        self.alts: list[str] = []
        self._in_banner = 0
        self._in_table = False
        self._cell: list[str] | None = None
        self._row: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and "kvlib-banner" in (a.get("class") or ""):
            self.verdict = a.get("data-verdict")
            self._in_banner = 1
        elif tag == "div" and self._in_banner:
            self._in_banner += 1
        if tag == "table" and a.get("id") in ("kvlib-summary", "kvlib-timing"):
            self._in_table = True
            self.rows = self.tables.setdefault(a["id"], {})
        if self._in_table and tag in ("th", "td"):
            self._cell = []
        if tag == "tr":
            self._row = []
        if tag == "img" and (a.get("src") or "").startswith("data:image/png;base64,"):
            self.images.append(a["src"].split(",", 1)[1])
            self.alts.append(a.get("alt") or "")

    def handle_endtag(self, tag):
        if tag == "div" and self._in_banner:
            self._in_banner -= 1
        if self._in_table and tag in ("th", "td") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        if self._in_table and tag == "tr" and len(self._row) >= 2:
            self.rows[self._row[0]] = self._row[1]
        if tag == "table":
            self._in_table = False

    def handle_data(self, data):
        if self._in_banner:
            self.banner_text.append(data)
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, cli, embedded):
    import nbformat
    import papermill
    from nbconvert import HTMLExporter

    out = tmp_path_factory.mktemp("report")
    os.environ["TQDM_DISABLE"] = "1"
    executed = out / "validate_perplexity.ipynb"
    papermill.execute_notebook(
        str(NOTEBOOK), str(executed), kernel_name="python3", progress_bar=False,
        # Two windows of 256 (one gated), two pass keys at 384, two prompts of 64: every cell, smallest inputs;
        # the embedded model as this run dequantized it (kvlib.models.gguf_cache: a second to load).
        parameters={"model": "embedded", "max_windows": 2, "context_length": 256, "stride": 128,
                    "output_dir": str(out), "name": "small", "retrieval_lengths": "384", "retrieval_depths": "0,1",
                    "generation_prompts": 2, "generation_context": 64, "generation_tokens": 4},
    )
    html, _ = HTMLExporter(exclude_input=True).from_notebook_node(nbformat.read(executed, as_version=4))
    page = _Page()
    page.feed(html)
    page.rows = page.tables["kvlib-summary"]
    return page, json.loads((out / "small.json").read_text()), html


def _close(shown: str, value: float, decimals: int) -> bool:
    number = float(re.sub(r"[^0-9eE.+-]", "", shown))
    return abs(number - value) <= 0.51 * 10**-decimals


def test_banner_states_the_verdict(rendered):
    page, data, _ = rendered
    assert page.verdict == ("PASS" if data["passed"] else "FAIL")
    text = " ".join(page.banner_text)
    assert f"{data['context_delta']:+.4f}" in text and f"threshold {data['threshold']:g}" in text


def test_table_numbers_equal_the_json(rendered):
    from kvlib.report.common import fmt

    page, data, _ = rendered
    rows = page.rows
    assert rows["Model"] == data["model"] and rows["Corpus"] == data["corpus"]
    assert int(rows["Windows"]) == data["windows"] == 2
    assert int(rows["Scored tokens"]) == data["scored_tokens"]
    for label, key, decimals in [
        ("Baseline perplexity", "baseline_perplexity", 4), ("Compressed perplexity", "compressed_perplexity", 4),
        ("Delta (all tokens)", "delta", 4), ("Delta (gated)", "context_delta", 4),
        ("Compression ratio", "compression_ratio", 3), ("RMSE", "rmse", 6), ("SNR", "snr_db", 2),
        ("Cosine similarity", "cosine_similarity", 6), ("Max error", "max_error", 4),
    ]:
        assert _close(rows[label], data[key], decimals), (label, rows[label], data[key])
    assert int(rows["Stored size"].split()[0].replace(",", "")) == data["compression"]["compressed_size_bytes"]
    assert rows["Quality level"] == data["quality_level"]
    assert rows["Scheme"] == data["scheme_name"] == "int4"
    assert rows["95% CI of the gated delta"] == f"{fmt(data['ci_low'], '+.4f')} to {fmt(data['ci_high'], '+.4f')}"
    assert rows["KL divergence (mean / median / p99)"].startswith(f"{data['kld_mean']:.5f} / ")
    assert rows["Top-1 agreement"] == f"{data['top1_agreement']:.2f} %"
    r, a = data["retrieval"]["schemes"][0], data["agreement"]["schemes"][0]
    assert r["name"] == a["name"] == "int4" and data["retrieval"]["exact"]["total"] == r["total"] == 2
    assert rows["Pass-key retrieval"] == f"{r['found']}/{r['total']}"
    assert rows["Generation agreement"] == f"{a['agreement']:.1f} %"


def test_every_plot_is_an_embedded_image(rendered):
    page, _, html = rendered
    # layer metrics, error histograms, head SNR heatmap, per-window perplexity, retrieval heatmap
    assert len(page.images) == 5
    assert all(len(alt) > 40 for alt in page.alts), page.alts  # every image says what it shows
    for img in page.images:
        png = base64.b64decode(img)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # Nothing on stderr (warnings, progress bars) and no traceback reaches the reader.
    assert 'data-mime-type="application/vnd.jupyter.stderr"' not in html and "Traceback" not in html


def test_run_log_timings_are_a_table(rendered):
    """The run log shows the timings as a table of steps, not a Python dict."""
    page, data, html = rendered
    from kvlib.report.common import fmt_seconds

    t, timing = page.tables["kvlib-timing"], data["timing"]
    assert t["model load"] == fmt_seconds(timing["model_load_s"]) and t["total"] == fmt_seconds(timing["total_s"])
    assert t["pass-key retrieval"] == fmt_seconds(timing["retrieval_s"])
    assert t["generation agreement"] == fmt_seconds(timing["agreement_s"])
    assert fmt_seconds(0.2134) == "213 ms" and fmt_seconds(14.84) == "14.8 s"
    assert t["scored tokens per second"] == f"{timing['scored_tokens_per_s']:.1f}"
    assert "{'total_s'" not in html and "'model_load_s'" not in html


@pytest.mark.parametrize("path", sorted((REPO / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_every_parameter_line_parses_as_papermill_reads_it(path):
    """papermill drops a parameter line it cannot parse from --help-notebook (a quote or '=' in
    the comment), and warns on every run that passes it."""
    from papermill.translators import PythonTranslator

    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    source = "".join(cell["source"])
    names = [line.split("=")[0].strip() for line in source.splitlines() if re.match(r"^[a-z_]+\s*=", line)]
    assert [p.name for p in PythonTranslator.inspect({"source": source})] == names

"""What the codec reports, and pooling it exactly: ``CompressionMetrics`` (the CLI's JSON) and
RMSE/SNR/cosine from raw sums, over windows, tensors and heads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from kvlib.codec.spec import codec_gates


def _num(v: Any) -> float:
    """JSON number or null (the CLI's encoding of an infinite SNR) as float."""
    return math.inf if v is None else float(v)


@dataclass
class CompressionMetrics:
    """Everything ``kv-compress`` reports: the design documents' fields, then the extras."""

    compression_ratio: float
    original_size_bytes: int
    compressed_size_bytes: int
    rmse: float
    snr_db: float
    cosine_similarity: float
    max_error: float
    quality_level: str
    processing_time_ms: float
    passed: bool
    violations: list[str] = field(default_factory=list)
    command: str = ""
    scheme: str = ""  # canonical spec
    scheme_name: str = ""  # preset name, or the spec
    stored_bytes: dict[str, int] = field(default_factory=dict)  # codes, scales, zeros, outliers, residual
    bits: int = 4
    group_size: int = 64
    sparsity: float = 0.0
    num_tensors: int = 0
    num_elements: int = 0
    source_size_bytes: int = 0
    compressed_file_bytes: int = 0
    bits_per_element: float = 0.0
    codec_time_ms: float = 0.0
    thresholds: dict[str, float] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)
    error_histogram_edges: list[float] = field(default_factory=list)
    tensors: list[dict[str, Any]] = field(default_factory=list)

    _REQUIRED = ("compression_ratio", "original_size_bytes", "compressed_size_bytes", "passed", "violations")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CompressionMetrics":
        """Build from the CLI's JSON; ValueError names any missing field."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        missing = [k for k in cls._REQUIRED if k not in d]
        if missing:
            raise ValueError(f"CLI JSON lacks field(s) {missing}")
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        for k in ("rmse", "snr_db", "cosine_similarity", "max_error"):
            kw[k] = math.nan if d.get("command") == "decompress" else _num(d.get(k))
        kw.setdefault("quality_level", "")
        kw.setdefault("processing_time_ms", 0.0)
        kw["thresholds"] = d.get("thresholds") or {}
        kw["sums"] = d.get("sums") or {}
        kw["tensors"] = [  # copies: the caller's dicts keep their JSON nulls
            dict(t, **{k: _num(t.get(k)) for k in ("rmse", "snr_db", "cosine_similarity", "max_error")},
                 head_snr_db=[_num(v) for v in t.get("head_snr_db", [])],
                 head_rmse=[_num(v) for v in t.get("head_rmse", [])])
            for t in d.get("tensors", [])
        ]
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _pooled(s: dict[str, float]) -> tuple[float, float, float]:
    """RMSE, SNR (dB) and cosine from raw sums, as the Go codec computes them."""
    n, x2, y2, xy, e2 = s["n"], s["sum_x2"], s["sum_y2"], s["sum_xy"], s["sum_e2"]
    rmse = math.sqrt(e2 / n) if n else 0.0
    snr = math.inf if e2 == 0 else 10 * math.log10(x2 / e2) if x2 > 0 else -math.inf
    if x2 == 0 and y2 == 0:
        cos = 1.0
    elif x2 == 0 or y2 == 0:
        cos = 0.0
    else:
        cos = xy / math.sqrt(x2 * y2)
    return rmse, snr, cos


def pooled_quality(s: dict[str, float]) -> dict[str, float]:
    """RMSE, SNR, cosine and max error of raw sums, as the CLI's JSON names them."""
    rmse, snr, cos = _pooled(s)
    return {"rmse": rmse, "snr_db": None if math.isinf(snr) else snr, "cosine_similarity": cos,
            "max_error": s["max_error"]}


def _add_sums(a: dict[str, float] | None, b: dict[str, float]) -> dict[str, float]:
    """Raw sums added; a sum the CLI wrote as null (not finite: an engine format's NaN or Inf in
    the reconstruction) is NaN, and stays NaN."""
    b = {k: math.nan if v is None else v for k, v in b.items()}
    if a is None:
        return b
    out = {k: a[k] + b[k] for k in ("n", "sum_x2", "sum_y2", "sum_xy", "sum_e2")}
    m = (a["max_error"], b["max_error"])
    out["max_error"] = math.nan if any(math.isnan(v) for v in m) else max(m)
    return out


def pool_tensors(tensors: list[dict[str, Any]], suffix: str) -> dict[str, float]:
    """RMSE, SNR and cosine pooled over the tensors whose name ends with ``suffix``
    ("_key", "_value"; "" for all), from the CLI's raw sums. Empty if none match."""
    sums = None
    for t in tensors:
        if t["name"].endswith(suffix):
            sums = _add_sums(sums, t["sums"])
    if sums is None:
        return {}
    rmse, snr, cos = _pooled(sums)
    return {"rmse": rmse, "snr_db": snr, "cosine_similarity": cos, "num_elements": int(sums["n"])}


def quality_level(rmse: float, snr_db: float) -> str:
    """The codec's grade of an RMSE and SNR, from its own table (``kv-compress gates``)."""
    for level in codec_gates()["levels"]:
        if rmse < level["max_rmse"] and snr_db > level["min_snr_db"]:
            return level["name"]
    return codec_gates()["levels"][-1]["name"]


def violations_of(rmse: float, snr: float, cos: float, th: dict[str, float]) -> list[str]:
    """The codec's quality gates ``th`` that pooled metrics fail, worded as the CLI words them."""
    out = []
    if not rmse < th["max_rmse"]:
        out.append(f"rmse {rmse:.6g} >= {th['max_rmse']:g}")
    if not snr > th["min_snr_db"]:
        out.append(f"snr_db {snr:.4g} <= {th['min_snr_db']:g}")
    if not cos > th["min_cosine_similarity"]:
        out.append(f"cosine_similarity {cos:.6g} <= {th['min_cosine_similarity']:g}")
    return out


def _sum_all(sums: list[dict[str, float]]) -> dict[str, float]:
    total = None
    for s in sums:
        total = _add_sums(total, s)
    return total


# An engine format's counts per tensor, which add up over runs: values a static scale clamped to the
# format's largest, and reconstructed values that are NaN or Inf.
COUNTS = ("saturated", "non_finite")


def _pool_tensor(group: list[dict[str, Any]]) -> dict[str, Any]:
    """One tensor's entry pooled over the runs that hold it (sums, per head, histogram)."""
    t0 = group[0]
    sums = _sum_all([t["sums"] for t in group])
    rmse, snr, cos = _pooled(sums)
    heads = [_sum_all([t["head_sums"][h] for t in group]) for h in range(len(t0["head_sums"]))]
    hist = [sum(t["error_histogram"][b] for t in group) for b in range(len(t0["error_histogram"]))]
    counts = {k: sum(t.get(k, 0) for t in group) for k in COUNTS if any(k in t for t in group)}
    return dict(t0, num_elements=int(sums["n"]), rmse=rmse, snr_db=snr, cosine_similarity=cos,
                max_error=sums["max_error"], quality_level=quality_level(rmse, snr), error_histogram=hist,
                sums=sums, head_sums=heads, head_rmse=[_pooled(h)[0] for h in heads],
                head_snr_db=[_pooled(h)[1] for h in heads], **counts)


def pool_metrics(runs: list[CompressionMetrics]) -> CompressionMetrics:
    """Pool several CLI runs (e.g. one per perplexity window) exactly, from their raw sums.

    Overall and per-tensor metrics, per-head SNR and error histograms all cover
    every element of every run; sizes and times add up.
    """
    if not runs:
        raise ValueError("no compression runs to pool")
    if len(runs) == 1:
        return runs[0]
    if any(not r.sums for r in runs):
        raise ValueError("a run has no raw sums (decompress output cannot be pooled)")
    first, total = runs[0], _sum_all([r.sums for r in runs])
    rmse, snr, cos = _pooled(total)
    tensors = []
    for i, t0 in enumerate(first.tensors):
        group = [r.tensors[i] for r in runs]
        if any(t["name"] != t0["name"] for t in group):
            raise ValueError(f"runs hold different tensors at position {i}")
        tensors.append(_pool_tensor(group))
    th = first.thresholds or codec_gates()["thresholds"]
    violations = violations_of(rmse, snr, cos, th)
    original = sum(r.original_size_bytes for r in runs)
    compressed = sum(r.compressed_size_bytes for r in runs)
    added = {k: sum(getattr(r, k) for r in runs) for k in ("processing_time_ms", "source_size_bytes",
                                                           "compressed_file_bytes", "codec_time_ms")}
    return CompressionMetrics(
        compression_ratio=original / compressed if compressed else 0.0, original_size_bytes=original,
        compressed_size_bytes=compressed, rmse=rmse, snr_db=snr, cosine_similarity=cos,
        max_error=total["max_error"], quality_level=quality_level(rmse, snr), passed=not violations,
        violations=violations, command=first.command, scheme=first.scheme, scheme_name=first.scheme_name,
        stored_bytes={k: sum(r.stored_bytes.get(k, 0) for r in runs) for k in first.stored_bytes},
        bits=first.bits, group_size=first.group_size, sparsity=first.sparsity, num_tensors=first.num_tensors,
        num_elements=int(total["n"]), bits_per_element=8 * compressed / total["n"] if total["n"] else 0.0,
        thresholds=th, sums=total, error_histogram_edges=first.error_histogram_edges, tensors=tensors, **added,
    )


def join_metrics(parts: list[CompressionMetrics]) -> CompressionMetrics:
    """One cache's metrics from its layers' (write mode sends each layer alone): the tensors side by
    side, sums and sizes added. Exact, as pool_metrics is over windows."""
    if len(parts) == 1:
        return parts[0]
    if not parts or any(not p.sums for p in parts):
        raise ValueError("no layer metrics to join, or a part without raw sums")
    first, total = parts[0], _sum_all([p.sums for p in parts])
    rmse, snr, cos = _pooled(total)
    th = first.thresholds or codec_gates()["thresholds"]
    violations = violations_of(rmse, snr, cos, th)
    original = sum(p.original_size_bytes for p in parts)
    compressed = sum(p.compressed_size_bytes for p in parts)
    added = {k: sum(getattr(p, k) for p in parts) for k in ("processing_time_ms", "source_size_bytes",
                                                            "compressed_file_bytes", "codec_time_ms", "num_tensors")}
    keys = dict.fromkeys(k for p in parts for k in p.stored_bytes)
    return CompressionMetrics(
        compression_ratio=original / compressed if compressed else 0.0, original_size_bytes=original,
        compressed_size_bytes=compressed, rmse=rmse, snr_db=snr, cosine_similarity=cos,
        max_error=total["max_error"], quality_level=quality_level(rmse, snr), passed=not violations,
        violations=violations, command=first.command, scheme=first.scheme, scheme_name=first.scheme_name,
        stored_bytes={k: sum(p.stored_bytes.get(k, 0) for p in parts) for k in keys},
        bits=first.bits, group_size=first.group_size, sparsity=first.sparsity,
        num_elements=int(total["n"]), bits_per_element=8 * compressed / total["n"] if total["n"] else 0.0,
        thresholds=th, sums=total, error_histogram_edges=first.error_histogram_edges,
        tensors=[t for p in parts for t in p.tensors], **added,
    )


def print_metrics_report(metrics: CompressionMetrics, title: str = "Compression Metrics") -> None:
    """Print the metrics as a small fixed-width report."""
    bar = "=" * 60
    print(bar)
    print(f"  {title}")
    print(bar)
    print(f"  Scheme:              {metrics.scheme_name} ({metrics.scheme})")
    print(f"  Compression ratio:   {metrics.compression_ratio:.3f}x (vs FP16, {metrics.bits_per_element:.3f} bits/element)")
    print(f"  Original (FP16):     {metrics.original_size_bytes:,} bytes")
    print(f"  Compressed:          {metrics.compressed_size_bytes:,} bytes")
    print(f"  RMSE:                {metrics.rmse:.6f}")
    print(f"  SNR:                 {metrics.snr_db:.2f} dB")
    print(f"  Cosine similarity:   {metrics.cosine_similarity:.6f}")
    print(f"  Max error:           {metrics.max_error:.6f}")
    print(f"  Quality level:       {metrics.quality_level}")
    print(f"  Processing time:     {metrics.processing_time_ms:.1f} ms")
    print(f"  Quality gates:       {'PASSED' if metrics.passed else 'FAILED'}")
    for v in metrics.violations:
        print(f"    - {v}")
    print(bar)

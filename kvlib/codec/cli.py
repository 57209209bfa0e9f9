"""Step 2: the bridge to the Go codec. Runs ``kv-compress`` on safetensors
files (no shell, argument lists only) and parses the JSON it prints.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kvlib.cache import cache_layers, load_kv_cache, save_kv_cache
from kvlib.layout import cache_like
from kvlib.codec import CodecConfig, resolve_codec

CLI_NAME = "kv-compress"
BUILD_HINT = "build it with `make build-compress` (or `make setup`), or set KV_COMPRESS_PATH"
_REPO_ROOT = Path(__file__).resolve().parent.parent


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


def find_cli_binary() -> str:
    """Locate kv-compress: $KV_COMPRESS_PATH, the repo's bin/, ./bin/, then PATH."""
    env = os.environ.get("KV_COMPRESS_PATH")
    if env:
        if Path(env).is_file() and os.access(env, os.X_OK):
            return env
        raise FileNotFoundError(f"KV_COMPRESS_PATH={env} is not an executable file; {BUILD_HINT}")
    for candidate in (_REPO_ROOT / "bin" / CLI_NAME, Path.cwd() / "bin" / CLI_NAME):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(CLI_NAME)
    if found:
        return found
    raise FileNotFoundError(f"Go CLI {CLI_NAME} not found; {BUILD_HINT}")


def check_cli_available() -> bool:
    """True when kv-compress is found and executable."""
    try:
        find_cli_binary()
    except FileNotFoundError:
        return False
    return True


class KVCompressError(subprocess.CalledProcessError):
    """kv-compress exited with an error; the message is the CLI's own line
    (it names the file and the problem)."""

    def __str__(self) -> str:
        lines = (self.stderr or "").strip().splitlines()
        return lines[-1] if lines else f"kv-compress exited with status {self.returncode}"


# The bridge waits this long for the CLI, plus a second per this many input
# bytes: generous (the codec runs at ~1 GB/s), but a hung CLI cannot hang a
# validation for ever.
TIMEOUT_BASE_S = 60.0
TIMEOUT_BYTES_PER_S = 5e6


def cli_timeout(input_path: str | os.PathLike) -> float:
    """How long to wait for kv-compress on input_path (scaled to its size)."""
    try:
        size = Path(input_path).stat().st_size
    except OSError:
        size = 0
    return TIMEOUT_BASE_S + size / TIMEOUT_BYTES_PER_S


def _run(command: str, args: list[str], verbose: bool) -> CompressionMetrics:
    """Run one kv-compress command; exit 0 and 1 (quality gates failed) both return metrics."""
    argv = [find_cli_binary(), command, *args] + (["-verbose"] if verbose else [])
    timeout = cli_timeout(args[args.index("-input") + 1]) if "-input" in args else TIMEOUT_BASE_S
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"kv-compress {command} did not finish within {timeout:.0f} s: {' '.join(argv)}") from None
    if verbose and proc.stderr:
        print(proc.stderr, end="")
    if proc.returncode not in (0, 1):
        raise KVCompressError(proc.returncode, argv, output=proc.stdout, stderr=proc.stderr)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise ValueError(f"Invalid JSON from CLI ({' '.join(argv)}): {e}; output began {proc.stdout[:200]!r}") from e
    return CompressionMetrics.from_dict(data)


def _codec(codec: "CodecConfig | str | None", bits: int, group_size: int, sparsity: float) -> CodecConfig:
    """The codec to use: ``codec`` when given, else the design documents' sym
    scheme from bits, group_size and sparsity."""
    if codec is not None:
        return resolve_codec(codec)
    return resolve_codec("sym4", bits=bits, group_size=group_size, sparsity=sparsity)


def _encode(command: str, input_path, output_path, codec: CodecConfig, verbose: bool) -> CompressionMetrics:
    """compress or roundtrip: the two commands that quantize input_path into output_path."""
    return _run(command, ["-input", str(input_path), "-output", str(output_path), *codec.cli_args()], verbose)


def compress_kv_cache(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    group_size: int = 64,
    sparsity: float = 0.0,
    verbose: bool = False,
    bits: int = 4,
    codec: CodecConfig | str | None = None,
) -> CompressionMetrics:
    """Compress a cache file to the packed kvq layout; return the quality metrics.

    ``codec`` (a CodecConfig, preset name or spec) chooses the scheme; without
    it, sym ``bits``-bit groups of ``group_size`` as in the design documents."""
    return _encode("compress", input_path, output_path, _codec(codec, bits, group_size, sparsity), verbose)


def decompress_kv_cache(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    verbose: bool = False,
) -> CompressionMetrics:
    """Restore a kvq file to a plain cache file (sizes and timing; no quality fields)."""
    return _run("decompress", ["-input", str(input_path), "-output", str(output_path)], verbose)


def roundtrip_kv_cache(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    group_size: int = 64,
    sparsity: float = 0.0,
    verbose: bool = False,
    bits: int = 4,
    codec: CodecConfig | str | None = None,
) -> CompressionMetrics:
    """Compress and restore in one CLI call; output_path is the reconstructed cache."""
    return _encode("roundtrip", input_path, output_path, _codec(codec, bits, group_size, sparsity), verbose)


def get_compression_metrics(
    input_path: str | os.PathLike,
    group_size: int = 64,
    verbose: bool = False,
    bits: int = 4,
    sparsity: float = 0.0,
    codec: CodecConfig | str | None = None,
) -> CompressionMetrics:
    """Quality metrics of compressing input_path, writing no file."""
    return _run("metrics", ["-input", str(input_path), *_codec(codec, bits, group_size, sparsity).cli_args()], verbose)


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
    if a is None:
        return dict(b)
    out = {k: a[k] + b[k] for k in ("n", "sum_x2", "sum_y2", "sum_xy", "sum_e2")}
    out["max_error"] = max(a["max_error"], b["max_error"])
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
    """The codec's grading table (same thresholds as the Go CLI)."""
    if rmse < 0.01 and snr_db > 40:
        return "EXCELLENT"
    if rmse < 0.05 and snr_db > 30:
        return "GOOD"
    if rmse < 0.10 and snr_db > 18:
        return "ACCEPTABLE"
    return "POOR"


def pool_metrics(runs: list[CompressionMetrics]) -> CompressionMetrics:
    """Pool several CLI runs (e.g. one per perplexity window) exactly, from their raw sums.

    Overall and per-tensor metrics, per-head SNR and error histograms all cover
    every element of every run; sizes and times add up.
    """
    if not runs:
        raise ValueError("no compression runs to pool")
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    total = None
    for r in runs:
        if not r.sums:
            raise ValueError("a run has no raw sums (decompress output cannot be pooled)")
        total = _add_sums(total, r.sums)
    rmse, snr, cos = _pooled(total)
    tensors = []
    for i, t0 in enumerate(first.tensors):
        group = [r.tensors[i] for r in runs]
        if any(t["name"] != t0["name"] for t in group):
            raise ValueError(f"runs hold different tensors at position {i}")
        sums = None
        for t in group:
            sums = _add_sums(sums, t["sums"])
        t_rmse, t_snr, t_cos = _pooled(sums)
        heads = []
        for h in range(len(t0["head_sums"])):
            hs = None
            for t in group:
                hs = _add_sums(hs, t["head_sums"][h])
            heads.append(hs)
        hist = [sum(t["error_histogram"][b] for t in group) for b in range(len(t0["error_histogram"]))]
        tensors.append(
            dict(
                t0,
                num_elements=int(sums["n"]),
                rmse=t_rmse,
                snr_db=t_snr,
                cosine_similarity=t_cos,
                max_error=sums["max_error"],
                quality_level=quality_level(t_rmse, t_snr),
                error_histogram=hist,
                sums=sums,
                head_sums=heads,
                head_rmse=[_pooled(h)[0] for h in heads],
                head_snr_db=[_pooled(h)[1] for h in heads],
            )
        )
    th = first.thresholds or {"max_rmse": 0.10, "min_snr_db": 18.0, "min_cosine_similarity": 0.99}
    violations = []
    if not rmse < th["max_rmse"]:
        violations.append(f"rmse {rmse:.6g} >= {th['max_rmse']:g}")
    if not snr > th["min_snr_db"]:
        violations.append(f"snr_db {snr:.4g} <= {th['min_snr_db']:g}")
    if not cos > th["min_cosine_similarity"]:
        violations.append(f"cosine_similarity {cos:.6g} <= {th['min_cosine_similarity']:g}")
    original = sum(r.original_size_bytes for r in runs)
    compressed = sum(r.compressed_size_bytes for r in runs)
    return CompressionMetrics(
        compression_ratio=original / compressed if compressed else 0.0,
        original_size_bytes=original,
        compressed_size_bytes=compressed,
        rmse=rmse,
        snr_db=snr,
        cosine_similarity=cos,
        max_error=total["max_error"],
        quality_level=quality_level(rmse, snr),
        processing_time_ms=sum(r.processing_time_ms for r in runs),
        passed=not violations,
        violations=violations,
        command=first.command,
        scheme=first.scheme,
        scheme_name=first.scheme_name,
        stored_bytes={k: sum(r.stored_bytes.get(k, 0) for r in runs) for k in first.stored_bytes},
        bits=first.bits,
        group_size=first.group_size,
        sparsity=first.sparsity,
        num_tensors=first.num_tensors,
        num_elements=int(total["n"]),
        source_size_bytes=sum(r.source_size_bytes for r in runs),
        compressed_file_bytes=sum(r.compressed_file_bytes for r in runs),
        bits_per_element=8 * compressed / total["n"] if total["n"] else 0.0,
        codec_time_ms=sum(r.codec_time_ms for r in runs),
        thresholds=th,
        sums=total,
        error_histogram_edges=first.error_histogram_edges,
        tensors=tensors,
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


class ContextFile:
    """Where context caches are saved: each once, however many codecs read it.

    Keeps the last ``slots`` caches on disk (one per window when scoring
    perplexity; one per haystack or prompt of a decoding batch), each in its
    own file beside ``path``."""

    def __init__(self, path: str | os.PathLike, model_name: str = "unknown", slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"slots {slots} must be at least 1")
        self.path, self.model_name, self.slots = Path(path), model_name, slots
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._saved: list[tuple[Any, Path]] = []  # (cache, its file), oldest first
        self.writes = 0

    def _slot_path(self, i: int) -> Path:
        return self.path if i == 0 else self.path.with_name(f"{self.path.stem}.{i}{self.path.suffix}")

    def path_for(self, cache: Any) -> Path:
        """The file holding ``cache``, written now unless it is one of the last ``slots`` written."""
        for saved, path in self._saved:
            if saved is cache:
                return path
        if len(self._saved) == self.slots:
            _, path = self._saved.pop(0)
        else:
            used = {p for _, p in self._saved}
            path = next(self._slot_path(i) for i in range(self.slots) if self._slot_path(i) not in used)
        save_kv_cache(cache, path, model_name=self.model_name)
        self._saved.append((cache, path))
        self.writes += 1
        return path


class CLICacheRoundtrip:
    """A cache transform through the real codec: save as safetensors, run
    ``kv-compress roundtrip``, load the reconstruction as a new DynamicCache.

    Callable as ``transform(cache) -> (cache, CompressionMetrics)``; keeps the
    time spent in each part (save, CLI, load) so a benchmark can report it.
    Transforms that share a ``context`` file save each window's cache once.
    """

    def __init__(self, workdir: str | os.PathLike, codec: CodecConfig | str | None = None,
                 model_name: str = "unknown", context: ContextFile | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.codec, self.model_name = resolve_codec(codec), model_name
        self.context = context or ContextFile(self.workdir / "context.safetensors", model_name)
        self.seconds = {"save": 0.0, "cli": 0.0, "load": 0.0}
        self.calls = 0
        find_cli_binary()  # a missing CLI is an error now, not after the first window

    def __call__(self, cache: Any) -> tuple[Any, CompressionMetrics]:
        dst = self.workdir / "context.restored.safetensors"
        k0 = cache_layers(cache)[0][0]
        t0 = time.perf_counter()
        src = self.context.path_for(cache)
        t1 = time.perf_counter()
        metrics = roundtrip_kv_cache(src, dst, codec=self.codec)
        t2 = time.perf_counter()
        restored, _ = load_kv_cache(dst, device=str(k0.device))
        # In the context's own layout (sliding-window layers included); bfloat16 travels as float32.
        restored = cache_like(cache, [(k.to(k0.dtype), v.to(k0.dtype)) for k, v in cache_layers(restored)])
        t3 = time.perf_counter()
        self.seconds["save"] += t1 - t0
        self.seconds["cli"] += t2 - t1
        self.seconds["load"] += t3 - t2
        self.calls += 1
        return restored, metrics

"""The codec as a program: runs ``kv-compress`` on safetensors files (no shell, argument lists
only) and parses the JSON it prints."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from kvlib.codec.binary import find_cli_binary
from kvlib.codec.metrics import CompressionMetrics
from kvlib.codec.spec import CodecConfig, resolve_codec


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

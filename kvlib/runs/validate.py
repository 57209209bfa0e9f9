"""Step 4: the whole validation. Load a model, take and check its KV cache,
send it through kv-compress, and compare perplexity with the exact cache
against perplexity with the compressed one. Pass when the delta < threshold.

The gate uses the delta over the windows whose targets attended to a
compressed context: window 0 has none and would only dilute the delta.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvlib.cache import io as cache
from kvlib.cache.layout import cache_layers, make_cache
from kvlib.checks.decoding import DecodingChecks, run_decoding_checks
from kvlib.codec.binary import BUILD_HINT, check_cli_available
from kvlib.codec.cli import compress_kv_cache, decompress_kv_cache
from kvlib.codec.metrics import pool_tensors, print_metrics_report
from kvlib.codec.spec import CodecConfig, resolve_codec
from kvlib.gates import CI_LEVEL, MIN_CI_UNITS, PPL_DELTA_THRESHOLD
from kvlib.models import corpus
from kvlib.models.zoo import EMBEDDED
from kvlib.runs.setup import RunParams, RunSetup, prepare_run
from kvlib.runs.sweep import check_engine_modes, check_mode, executor_for, model_geometry, score_schemes, write_json
from kvlib.scoring.store import unit_key

KVQUANT_THRESHOLD = PPL_DELTA_THRESHOLD  # the design documents' name


@dataclass
class ValidationResult:
    """Outcome of one validation: the design documents' fields, then provenance and detail."""

    baseline_perplexity: float
    compressed_perplexity: float
    delta: float  # compressed - baseline, over all scored tokens
    delta_percent: float
    compression_ratio: float
    rmse: float
    snr_db: float
    cosine_similarity: float
    passed: bool
    threshold: float = KVQUANT_THRESHOLD
    model: str = ""
    corpus: str = ""
    device: str = ""
    scheme: str = ""  # canonical codec spec
    scheme_name: str = ""  # its preset name, or the spec
    stride: int = 512
    context_length: int = 0
    windows: int = 0
    scored_tokens: int = 0
    context_windows: int = 0
    context_scored_tokens: int = 0
    context_baseline_perplexity: float = math.nan
    context_compressed_perplexity: float = math.nan
    context_delta: float = math.nan  # the gated delta: windows with a compressed context
    mode: str = "prefix"  # what it measures: a compressed prefix, or every K/V as written (MODES)
    ci_low: float = math.nan  # confidence interval of the gated delta (kvlib.gates.CI_METHOD)
    ci_high: float = math.nan
    robust: bool = False  # passed, and the CI's upper bound is below the threshold too
    kld_mean: float = math.nan  # KL(exact || compressed) per token after a compressed context, nats
    kld_median: float = math.nan
    kld_p99: float = math.nan
    top1_agreement: float = math.nan  # % of those tokens whose argmax prediction is unchanged
    dtype: str = ""
    max_error: float = math.nan
    quality_level: str = ""
    quality_passed: bool = False  # the CLI's RMSE/SNR/cosine gates (informational)
    violations: list[str] = field(default_factory=list)
    keys: dict[str, float] = field(default_factory=dict)  # RMSE, SNR, cosine of all key tensors pooled
    values: dict[str, float] = field(default_factory=dict)  # the same for value tensors
    kv_geometry: dict[str, Any] = field(default_factory=dict)
    window_nlls: list[dict[str, Any]] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)
    compression: dict[str, Any] = field(default_factory=dict)  # pooled CLI metrics, per tensor included
    verdict: str = ""
    retrieval: dict[str, Any] = field(default_factory=dict)  # RetrievalResult.to_dict(), empty when not run
    agreement: dict[str, Any] = field(default_factory=dict)  # AgreementResult.to_dict(), empty when not run

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, path: str | os.PathLike) -> None:
        """Write the result as JSON (NaN/Inf as null), atomically."""
        write_json(self.to_dict(), path)


def _say(verbose: bool, *args: Any) -> None:
    if verbose:
        print(*args, flush=True)


def check_sample_roundtrip(run: RunSetup, codec: CodecConfig, workdir: Path, verbose: bool) -> dict[str, Any]:
    """Steps 2-4: a 256-token cache of the corpus, checked against the model's geometry, compressed
    to a file, decompressed and loaded back, checked again. A unit of the results store like the
    others (what it printed is kept), so a finished validation loads no model."""
    key = {**run.identity.geometry(), "kind": "sample_roundtrip", "scheme": codec.spec}
    unit = run.store.get(unit_key(key)) if run.store is not None else None
    if unit is None:
        unit = _sample_roundtrip(run.load(), run.tokenizer, run.ids, codec, workdir, run.name, run.device)
        if run.store is not None:
            run.store.put(key, unit)
    _say(verbose, "[2/6] Generating KV cache...")
    _say(verbose, f"    Generated: {unit['num_layers']} layers, {unit['seq_len']} tokens, {unit['total_mb']:.2f} MB "
                  f"({unit['dtype']}); shape matches the config")
    _say(verbose, "[3/6] Compressing KV cache with kv-compress...")
    _say(verbose, f"    Sample ({unit['seq_len']} tokens): ratio {unit['ratio']:.2f}x, RMSE {unit['rmse']:.6f}, "
                  f"SNR {unit['snr_db']:.2f} dB")
    _say(verbose, "[4/6] Loading reconstructed KV cache...\n    Reconstructed cache loaded; shape matches")
    return unit


def _sample_roundtrip(lm: Any, tok: Any, ids: torch.Tensor, codec: CodecConfig, workdir: Path, name: str,
                      device: str) -> dict[str, Any]:
    geometry = cache.expected_geometry(lm.config)
    kv, meta = cache.extract_kv_cache(lm, tok, tok.decode(ids[0, :256]), max_length=256, device=device)
    ok, problems = cache.validate_kv_cache_shape(kv, **geometry)
    if not ok:
        raise RuntimeError("KV cache does not match the model config: " + "; ".join(problems))
    stats = cache.compute_kv_cache_stats(kv)
    sample, packed, back = workdir / "sample.safetensors", workdir / "sample.kvq.safetensors", workdir / "sample.restored.safetensors"
    cache.save_kv_cache(kv, sample, model_name=name)
    m = compress_kv_cache(sample, packed, codec=codec)
    decompress_kv_cache(packed, back)
    restored, _ = cache.load_kv_cache(back, device=device)
    ok, problems = cache.validate_kv_cache_shape(restored, **geometry)
    if not ok:
        raise RuntimeError("reconstructed cache has the wrong shape: " + "; ".join(problems))
    return {"num_layers": meta.num_layers, "seq_len": meta.seq_len, "total_mb": stats["total_mb"], "dtype": meta.dtype,
            "ratio": m.compression_ratio, "rmse": m.rmse, "snr_db": m.snr_db}


def _validation_result(ppl: Any, scheme: Any, codec: CodecConfig, threshold: float, model: str, corpus_name: str,
                       device: str, dtype: str, stride: int, context_length: int,
                       geometry: dict[str, Any]) -> ValidationResult:
    """The ValidationResult of one scheme's windows (timing is filled in by the caller)."""
    comp = ppl.compression
    passed = scheme.passed
    verdict = (f"{'PASSED' if passed else 'FAILED'}: delta {ppl.context_delta:+.4f} "
               f"{'<' if passed else '>='} {threshold} threshold ({ci_text(scheme.ci_low, scheme.ci_high)}"
               f"{'' if scheme.robust or not passed or math.isnan(scheme.ci_high) else ': crosses the threshold'})")
    return ValidationResult(
        baseline_perplexity=ppl.baseline_perplexity, compressed_perplexity=ppl.compressed_perplexity,
        delta=ppl.delta, delta_percent=ppl.delta_percent,
        compression_ratio=comp.compression_ratio if comp else math.nan,
        rmse=comp.rmse if comp else math.nan, snr_db=comp.snr_db if comp else math.nan,
        cosine_similarity=comp.cosine_similarity if comp else math.nan,
        passed=passed, threshold=threshold, model=model, corpus=corpus_name, device=device,
        scheme=codec.spec, scheme_name=codec.name, stride=stride, context_length=context_length, mode=scheme.mode,
        windows=ppl.num_windows, scored_tokens=ppl.scored_tokens,
        context_windows=sum(1 for w in ppl.windows if w.compressed), context_scored_tokens=ppl.context_scored_tokens,
        context_baseline_perplexity=ppl.context_baseline_perplexity,
        context_compressed_perplexity=ppl.context_compressed_perplexity, context_delta=ppl.context_delta,
        ci_low=scheme.ci_low, ci_high=scheme.ci_high, robust=scheme.robust, kld_mean=scheme.kld_mean,
        kld_median=scheme.kld_median, kld_p99=scheme.kld_p99, top1_agreement=scheme.top1_agreement, dtype=dtype,
        max_error=comp.max_error if comp else math.nan, quality_level=comp.quality_level if comp else "",
        quality_passed=comp.passed if comp else False, violations=list(comp.violations) if comp else [],
        keys=scheme.keys, values=scheme.values,
        kv_geometry=geometry,
        window_nlls=[
            {"index": w.index, "begin": w.begin, "end": w.end, "targets": w.num_targets,
             "context_tokens": w.context_tokens, "compressed": w.compressed,
             "baseline_nll": w.baseline_nll, "compressed_nll": w.compressed_nll,
             "baseline_ppl": w.baseline_ppl, "compressed_ppl": w.compressed_ppl}
            for w in ppl.windows
        ],
        compression=comp.to_dict() if comp else {}, verdict=verdict,
    )


def ci_text(lo: float, hi: float, label: bool = True) -> str:
    """The CI as the verdict words it, or why there is none."""
    if math.isnan(hi):
        return f"no CI: fewer than {MIN_CI_UNITS} windows with a compressed context"
    return (f"{CI_LEVEL:.0%} CI " if label else "") + f"{lo:+.4f} to {hi:+.4f}"


def run_full_validation(
    device: str | None = None,
    threshold: float = KVQUANT_THRESHOLD,
    verbose: bool = True,
    model: str = EMBEDDED,
    corpus_name: str = corpus.EMBEDDED,
    codec: CodecConfig | str | None = None,
    stride: int = 512,
    max_windows: int | None = None,
    context_length: int | None = None,
    workdir: str | os.PathLike | None = None,
    progress: bool | None = None,
    dtype: str | None = None,
    checks: DecodingChecks = DecodingChecks(),
    results: str | os.PathLike | None | bool = None,
    fresh: bool = False,
    ray: bool | str = False,
    mode: str = "prefix",
) -> ValidationResult:
    """Run the six steps and return the result (see the module docstring for the gate).

    ``codec`` is a CodecConfig, preset name or spec (default int4); ``checks``
    adds pass-key retrieval and generation agreement against the exact cache. Finished units
    are read from the results store (a finished validation loads no model); ``ray`` computes
    the missing windows on Ray, as in a sweep."""
    bar = "=" * 60
    t_start = time.perf_counter()
    if not check_cli_available():
        raise RuntimeError(f"Go CLI not found. {BUILD_HINT}")
    codec = resolve_codec(codec)  # a bad scheme fails before anything loads
    check_mode(mode)
    check_engine_modes([codec], mode)
    _say(verbose, bar, "\n  KV Cache Compression Validation\n" + bar)
    run = prepare_run(RunParams(model, corpus_name, device, dtype, threshold, stride, max_windows, context_length,
                                results, fresh), verbose)
    _say(verbose, f"[1/6] {run.name}")
    geometry = model_geometry(run)  # a cache kvlib cannot compress fails here, before any window
    _say(verbose, f"    Device {run.device}\n    Config: {geometry['num_layers']} layers "
                  f"({geometry['layers']}), {geometry['num_kv_heads']} KV heads "
                  f"({geometry['num_query_heads']} query heads), head_dim {geometry['head_dim']}")
    progress = verbose if progress is None else progress
    L, lazy = run.context_length, run.lazy()
    with tempfile.TemporaryDirectory(prefix="kvlib-") as tmp:
        work = Path(workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        check_sample_roundtrip(run, codec, work, verbose)
        checks.check_inputs(lazy, run.tokenizer, run.ids.shape[1], run.text.name)
        _say(verbose, f"[5/6] Computing baseline and compressed perplexity on {run.text.name} "
                      f"({run.ids.shape[1]} tokens, window {L}, stride {stride}"
                      + (f", at most {max_windows} windows" if max_windows else "") + ")...")
        executor, job = executor_for(run, [codec], False, ray, mode)
        (scheme,), ppl, bridge_timing = score_schemes(
            run.load, run.ids, L, stride, [codec], work / "windows", run.name, threshold, peers=False,
            max_windows=max_windows, progress=progress, store=run.store, identity=run.identity,
            executor=executor, job=job, mode=mode, architecture=getattr(run.config, "model_type", None))
        _say(verbose, f"    Units: {bridge_timing['units_computed']:.0f} computed, "
                      f"{bridge_timing['units_reused']:.0f} read from the store")
        retrieval, agreement = run_decoding_checks(lazy, run.tokenizer, run.ids, [codec], checks, work, run.name,
                                                   run.text.name, progress=progress, store=run.store,
                                                   identity=run.identity)
    result = _validation_result(ppl, scheme, codec, threshold, run.name, run.text.name, run.device,
                                run.dtype_name, stride, L, geometry)
    result.timing = {"total_s": time.perf_counter() - t_start, "model_load_s": run.model_load_s,
                     "perplexity_s": ppl.seconds, "bridge_s": ppl.transform_seconds, **bridge_timing,
                     "scored_tokens_per_s": ppl.scored_tokens / ppl.seconds if ppl.seconds else math.nan,
                     **({"retrieval_s": retrieval.timing["total_s"]} if retrieval else {}),
                     **({"agreement_s": agreement.timing["total_s"]} if agreement else {})}
    result.retrieval = retrieval.to_dict() if retrieval else {}
    result.agreement = agreement.to_dict() if agreement else {}
    if verbose:
        print_result(result)
    return result


def print_result(r: ValidationResult) -> None:
    """The design documents' RESULTS block."""
    bar, thin = "=" * 60, "-" * 60
    print(bar + "\n  RESULTS\n" + bar)
    print(f"  Model:                 {r.model}")
    print(f"  Corpus:                {r.corpus}")
    print(f"  Windows:               {r.windows} ({r.context_windows} with a compressed context), "
          f"{r.scored_tokens} scored tokens")
    print(f"  Baseline Perplexity:   {r.baseline_perplexity:.4f}")
    print(f"  Compressed Perplexity: {r.compressed_perplexity:.4f}")
    print(f"  Delta (all tokens):    {r.delta:+.4f} ({r.delta_percent:+.2f}%)")
    what = "with a compressed context" if r.mode == "prefix" else "every K/V quantized as written (write mode)"
    print(f"  Delta (gated):         {r.context_delta:+.4f} over {r.context_scored_tokens} tokens "
          f"{what} ({r.context_baseline_perplexity:.4f} -> {r.context_compressed_perplexity:.4f})")
    print(f"  {CI_LEVEL:.0%} CI (gated):        {ci_text(r.ci_low, r.ci_high, label=False)}"
          f"{'' if r.robust or not r.passed or math.isnan(r.ci_high) else ' (crosses the threshold)'}")
    print(f"  KL divergence:         mean {r.kld_mean:.5f}, median {r.kld_median:.5f}, p99 {r.kld_p99:.4f} nats; "
          f"top-1 agreement {r.top1_agreement:.2f}%")
    print(f"  Compression Ratio:     {r.compression_ratio:.2f}x ({r.scheme_name}: {r.scheme})")
    print(thin)
    print(f"  RMSE:                  {r.rmse:.6f}")
    print(f"  SNR:                   {r.snr_db:.2f} dB")
    print(f"  Cosine Similarity:     {r.cosine_similarity:.6f}")
    if r.keys and r.values:
        print(f"  Keys / values:         SNR {r.keys['snr_db']:.2f} / {r.values['snr_db']:.2f} dB, "
              f"RMSE {r.keys['rmse']:.4f} / {r.values['rmse']:.4f}, "
              f"cosine {r.keys['cosine_similarity']:.5f} / {r.values['cosine_similarity']:.5f}")
    print(f"  Quality level:         {r.quality_level}" + ("" if r.quality_passed else
          f" (codec gates failed: {'; '.join(r.violations)})"))
    for d in (r.retrieval, r.agreement):
        if d:
            print(f"  {d['summary']}")
    print(bar)
    print(f"  [{'OK' if r.passed else 'FAIL'}] {r.verdict}")
    print(bar)


def synthetic_cache(num_layers: int = cache.TINYLLAMA_NUM_LAYERS, num_kv_heads: int = cache.TINYLLAMA_NUM_KV_HEADS,
                    seq_len: int = 128, head_dim: int = cache.TINYLLAMA_HEAD_DIM, std: float = 0.5,
                    seed: int = 0) -> Any:
    """A random N(0, std^2) cache of the given geometry (TinyLlama's by default)."""
    g = torch.Generator().manual_seed(seed)
    shape = (1, num_kv_heads, seq_len, head_dim)
    return make_cache([(torch.randn(shape, generator=g) * std, torch.randn(shape, generator=g) * std)
                             for _ in range(num_layers)])


def run_quick_test(verbose: bool = True, codec: CodecConfig | str | None = None,
                   workdir: str | os.PathLike | None = None) -> ValidationResult:
    """Pipeline check with no model: a synthetic TinyLlama-geometry cache through
    save -> kv-compress compress -> decompress -> load, checked against the CLI's quality gates."""
    if not check_cli_available():
        raise RuntimeError(f"Go CLI not found. {BUILD_HINT}")
    codec = resolve_codec(codec)
    kv = synthetic_cache()
    with tempfile.TemporaryDirectory(prefix="kvlib-quick-") as tmp:
        d = Path(workdir or tmp)
        t0 = time.perf_counter()
        meta = cache.save_kv_cache(kv, d / "synthetic.safetensors", model_name="synthetic (TinyLlama geometry)")
        m = compress_kv_cache(d / "synthetic.safetensors", d / "synthetic.kvq.safetensors",
                                     codec=codec)
        decompress_kv_cache(d / "synthetic.kvq.safetensors", d / "synthetic.restored.safetensors")
        restored, _ = cache.load_kv_cache(d / "synthetic.restored.safetensors")
        seconds = time.perf_counter() - t0
    ok, problems = cache.validate_kv_cache_shape(restored)
    # Independent check of the CLI's numbers from the restored tensors.
    orig = torch.cat([t.reshape(-1) for kv_ in cache_layers(kv) for t in kv_]).double()
    back = torch.cat([t.reshape(-1) for kv_ in cache_layers(restored) for t in kv_]).double()
    rmse = float((back - orig).pow(2).mean().sqrt())
    agree = math.isclose(rmse, m.rmse, rel_tol=1e-6)
    passed = m.passed and ok and agree
    problems = problems + ([] if agree else [f"CLI RMSE {m.rmse} != recomputed {rmse}"])
    verdict = ("PASSED" if passed else "FAILED") + f": quality {m.quality_level}" + (
        "" if not (m.violations or problems) else " (" + "; ".join(m.violations + problems) + ")")
    result = ValidationResult(
        baseline_perplexity=math.nan, compressed_perplexity=math.nan, delta=math.nan, delta_percent=math.nan,
        compression_ratio=m.compression_ratio, rmse=m.rmse, snr_db=m.snr_db,
        cosine_similarity=m.cosine_similarity, passed=passed, model="none (synthetic N(0, 0.5^2) cache)",
        corpus="none", scheme=codec.spec, scheme_name=codec.name, max_error=m.max_error, quality_level=m.quality_level,
        quality_passed=m.passed, violations=m.violations + problems,
        keys=pool_tensors(m.tensors, "_key"), values=pool_tensors(m.tensors, "_value"),
        kv_geometry={"num_layers": meta.num_layers, "num_kv_heads": meta.num_kv_heads, "head_dim": meta.head_dim,
                     "seq_len": meta.seq_len},
        timing={"total_s": seconds}, compression=m.to_dict(), verdict=verdict,
    )
    if verbose:
        print_metrics_report(m, f"Quick test: synthetic cache {meta.num_layers} layers x "
                                       f"{meta.num_kv_heads} KV heads x {meta.seq_len} tokens x {meta.head_dim}")
        print(f"  [{'OK' if passed else 'FAIL'}] {verdict}")
    return result

"""The transfer view: a finished prefix's cache sent to another node (disaggregated prefill, KV
offload), so what counts is the bytes on the wire per context token against the quality after it.

The schemes: the KV-sharing systems' serdes (LMCache's menu) and kvlib's presets with and without
the wire stage, all in prefix mode (the cache compressed once, new tokens exact: the transfer
case). Bytes are the kvq file's (codes, scales, tables and header: everything needed to restore),
per token of the compressed contexts; the answer is the fewest bytes that pass robustly.
"""

from __future__ import annotations

from typing import Any

from kvlib.codec.spec import WIRE_SUFFIX, resolve_codec

# kvlib's presets in the view, each also with +wire: the 2- to 8-bit codes people would send
TRANSFER_PRESETS = ("lm2rot", "kivi2", "rot3", "lm3rot", "rot4", "int4", "kivi4", "q8_0")
TRANSFER_ENGINE = "lmcache"  # whose serdes the view holds (kv-compress schemes -engine lmcache)


def transfer_schemes(serdes: list[str]) -> list[str]:
    """The view's schemes: ``serdes`` (the KV-sharing systems'), then each preset and its +wire."""
    return list(serdes) + [s for p in TRANSFER_PRESETS for s in (p, p + WIRE_SUFFIX)]


def _bytes(comp: dict[str, Any]) -> tuple[int, int]:
    """(bytes to restore the cache, its FP16 bytes) summed over the windows: the kvq file where
    the codec wrote one, else the stored tensors (a peer's)."""
    sent = comp.get("compressed_file_bytes") or comp.get("compressed_size_bytes") or 0
    return int(sent), int(comp.get("original_size_bytes") or 0)


def transfer_table(schemes: list[Any], context_tokens: int) -> dict[str, Any]:
    """Each scheme's bytes per context token, times smaller than FP16, quality and codec speed,
    fewest bytes first, and the fewest that pass robustly."""
    rows = []
    for s in schemes:
        comp = s.compression or {}
        sent, fp16 = _bytes(comp)
        if s.error or not sent or not context_tokens:
            continue
        ms = float(comp.get("codec_time_ms") or 0.0)
        rows.append({
            "scheme": s.name, "spec": s.spec, "kind": s.kind,
            "wire": resolve_codec(s.spec).wire if s.kind != "peer" else False,
            "bytes_per_token": sent / context_tokens, "fp16_bytes_per_token": fp16 / context_tokens,
            "times_smaller": fp16 / sent, "bits_per_element": s.bits_per_element,
            "context_delta": s.context_delta, "ci_low": s.ci_low, "ci_high": s.ci_high, "kld_mean": s.kld_mean,
            "top1_agreement": s.top1_agreement, "robust": s.robust, "verdict": s.verdict_text,
            # compress and restore in one call, per restored FP16 byte (make bench splits them)
            "codec_mb_s": fp16 / 1e6 / (ms / 1e3) if ms > 0 else None})
    rows.sort(key=lambda r: (r["bytes_per_token"], r["context_delta"]))
    best = next((r for r in rows if r["robust"]), None)
    return {"context_tokens": context_tokens, "rows": rows, "fewest": best["scheme"] if best else None}


def print_transfer(t: dict[str, Any]) -> None:
    """The view as the CLI prints it."""
    if not t.get("rows"):
        return
    w = max(len(r["scheme"]) for r in t["rows"])
    print(f"  TRANSFER  bytes on the wire per context token ({t['context_tokens']} context tokens compressed), "
          f"FP16: {t['rows'][0]['fp16_bytes_per_token']:.0f} bytes/token")
    print(f"  {'scheme':{w}s}  bytes/tok  x FP16   delta gated              95% CI  KLD mean  top-1  codec MB/s  verdict")
    for r in t["rows"]:
        speed = f"{r['codec_mb_s']:10.0f}" if r["codec_mb_s"] else f"{'-':>10s}"
        print(f"  {r['scheme']:{w}s}  {r['bytes_per_token']:9.1f}  {r['times_smaller']:5.2f}x  {r['context_delta']:+10.4f} "
              f"[{r['ci_low']:+8.4f}, {r['ci_high']:+8.4f}]  {r['kld_mean']:8.5f} {r['top1_agreement']:5.1f}%  "
              f"{speed}  {r['verdict']}")
    best = next((r for r in t["rows"] if r["scheme"] == t["fewest"]), None)
    print("  fewest bytes that pass robustly: " + (
        f"{best['scheme']} ({best['bytes_per_token']:.1f} bytes/token, {best['times_smaller']:.2f}x smaller than FP16, "
        f"delta {best['context_delta']:+.4f})" if best else "none"))

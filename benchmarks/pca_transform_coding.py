"""A measurement, not a codec: would KVTC's layout (one PCA basis per layer and role over the KV
heads joined, fitted on calibration windows) reach issue 32's byte goals on the embedded model?

Each evaluated window's context cache goes through, per layer and role: centre by the calibration
mean, rotate into the calibration basis, quantize every component with one uniform step (the MSE-
optimal allocation at high rate: the entropy coder gives the high-variance components their bits,
the low ones near none), rotate back. The step is ``c`` times the root mean variance of that
layer and role on the calibration windows. The bits per element are **estimated**: each
component's empirical entropy of its integer codes over the window (what a static coder with a
table per component approaches) plus a 12-bit table entry per distinct code; the basis and mean
(FP16) are left out, as a per-model basis amortised over the caches it serves would be. Then the
window's suffix is scored as prefix mode scores it (kvlib.scoring.perplexity), with the gate's
bootstrap CI. No stream is written: kv-compress has no such stage yet, so these are estimates of
what one would reach, to decide whether to build it.

``python benchmarks/pca_transform_coding.py --steps 1.0,0.7 [--max-windows 21]``.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from kvlib.cache.layout import cache_layers, make_cache, new_cache
from kvlib.gates import PPL_DELTA_THRESHOLD
from kvlib.models import sources
from kvlib.models.corpus import load_corpus, tokenize
from kvlib.scoring.perplexity import score_windows
from kvlib.scoring.stats import bootstrap_delta_ci

TABLE_BITS = 12  # per distinct code of a component: the static coder's table entry


def fit(model, ids: torch.Tensor, starts: list[int], length: int) -> list[list[tuple[torch.Tensor, torch.Tensor, float]]]:
    """Per layer and role: (mean [H*D], basis [H*D, H*D], root mean variance) over the context caches
    of the calibration windows, heads joined per token."""
    rows: list[list[list[torch.Tensor]]] = []
    with torch.no_grad():
        for s in starts:
            c = model(input_ids=ids[:, s: s + length], past_key_values=new_cache(model), use_cache=True).past_key_values
            for i, kv in enumerate(cache_layers(c)):
                if len(rows) <= i:
                    rows.append([[], []])
                for r, x in enumerate(kv):
                    rows[i][r].append(joined(x).double())
    out = []
    for per_role in rows:
        fits = []
        for xs in per_role:
            x = torch.cat(xs)
            mu = x.mean(0)
            _, u = torch.linalg.eigh(torch.cov((x - mu).T))
            fits.append((mu, u, float((x - mu).var(0).mean().sqrt())))
        out.append(fits)
    return out


def joined(x: torch.Tensor) -> torch.Tensor:
    """[1, H, T, D] -> [T, H*D]: a token's heads side by side."""
    return x[0].permute(1, 0, 2).reshape(x.shape[2], -1)


def entropy_bits(q: torch.Tensor) -> float:
    """Summed over components (columns): empirical entropy of the codes times their count, plus a
    table entry per distinct code."""
    total = 0.0
    for col in q.T:
        _, counts = torch.unique(col, return_counts=True)
        p = counts.double() / counts.sum()
        total += float(-(p * p.log2()).sum()) * col.numel() + TABLE_BITS * counts.numel()
    return total


class PcaCoder:
    """The transform the windows' context caches go through (a kvlib prefix-mode CacheTransform:
    cache -> (cache, metrics)); its estimated bits are summed in ``bits`` and ``elements``."""

    def __init__(self, fits, step: float) -> None:
        self.fits, self.step, self.bits, self.elements = fits, step, 0.0, 0

    def __call__(self, cache):
        layers = []
        for (k, v), fits in zip(cache_layers(cache), self.fits):
            out = []
            for x, (mu, u, rms) in zip((k, v), fits):
                y = (joined(x).double() - mu) @ u
                q = torch.round(y / (self.step * rms))
                self.bits += entropy_bits(q.to(torch.int64))
                self.elements += q.numel()
                back = (q * (self.step * rms)) @ u.T + mu
                out.append(back.reshape(x.shape[2], x.shape[1], x.shape[3]).permute(1, 0, 2)[None].to(x.dtype).contiguous())
            layers.append(tuple(out))
        return make_cache(layers), None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--corpus", default="wikitext-2-valid")
    p.add_argument("--steps", default="1.0,0.7", help="quantization steps, in root mean variances of the layer and role")
    p.add_argument("--max-windows", type=int, default=21)
    p.add_argument("--calibration-start", type=int, default=200_000,
                   help="first token of the two calibration windows: past every evaluated window")
    a = p.parse_args()
    model, tok = sources.load_model_and_tokenizer(a.model, device="cpu")
    ids = tokenize(tok, load_corpus(a.corpus))
    length, stride = 2048, 512
    if a.calibration_start < a.max_windows * stride + length:
        raise SystemExit("pca_transform_coding: the calibration windows overlap the evaluated ones")
    fits = fit(model, ids, [a.calibration_start, a.calibration_start + length], length - stride)
    coders = {f"pca@{float(s):g}": PcaCoder(fits, float(s)) for s in a.steps.split(",")}
    res = score_windows(model, ids, length, stride, coders, max_windows=a.max_windows, progress=False)
    print(f"{a.model}, {a.corpus}: {a.max_windows} windows of {length}, stride {stride}; bits estimated (see the docstring)")
    print("| step | bits/element (estimated) | x FP16 | gated delta | 95 % CI | verdict |")
    print("|---|---|---|---|---|---|")
    for name, r in res.items():
        ctx = [w for w in r.windows if w.compressed]
        lo, hi = bootstrap_delta_ci([w.baseline_nll for w in ctx], [w.compressed_nll for w in ctx],
                                    [w.num_targets for w in ctx])
        c = coders[name]
        bits = c.bits / c.elements
        ok = r.context_delta < PPL_DELTA_THRESHOLD
        verdict = ("pass (robust)" if hi < PPL_DELTA_THRESHOLD else "pass (CI crosses the gate)") if ok else "FAIL"
        print(f"| {name} | {bits:.3f} | {16 / bits:.2f}x | {r.context_delta:+.4f} | {lo:+.3f} to {hi:+.3f} | "
              f"{verdict} |" if not math.isnan(hi) else f"| {name} | {bits:.3f} | {16 / bits:.2f}x | {r.context_delta:+.4f} | | |")


if __name__ == "__main__":
    main()

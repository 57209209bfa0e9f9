"""What decorrelation before quantization could buy the wire codec (issue 32): the rate a
Gaussian transform coder saves at equal MSE, per layer and role, for three bases fitted on
calibration windows and evaluated on a later window's context cache:

- ``channel``: the model's own channels, each at its own variance (what per-channel scales and
  the wire stage's (head, channel) contexts can exploit without a transform);
- ``pca/head``: a PCA per KV head (head_dim components), KVTC's per-head idea;
- ``pca/layer``: one PCA over a layer's KV heads joined (heads x head_dim components).

The baseline is a Hadamard-rotated code, whose channels all carry the mean variance. At rate R
bits per element, reverse water-filling over the evaluated components' variances gives the
distortion a transform coder reaches; the saving is R minus the rate the baseline needs for that
distortion. It is an upper bound of the MSE gain (Gaussian components, ideal entropy coding and
allocation; the basis itself not counted), not a perplexity: a measurement of the headroom, as
the transfer docs quote it. ``python benchmarks/decorrelation_gain.py [--model embedded]``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from kvlib.cache.layout import cache_layers, new_cache
from kvlib.models import sources
from kvlib.models.corpus import load_corpus, tokenize


def water_fill(var: np.ndarray, rate: float) -> float:
    """Mean distortion of independent Gaussians of variances ``var`` coded at ``rate`` bits a
    component on average (reverse water-filling, bisection on the water level)."""
    lo, hi = 1e-30, float(var.max())
    for _ in range(200):
        theta = (lo * hi) ** 0.5
        r = np.maximum(0.0, 0.5 * np.log2(var / theta)).mean()
        lo, hi = (theta, hi) if r > rate else (lo, theta)
    return float(np.minimum(var, hi).mean())


def saving(var: np.ndarray, rate: float) -> float:
    """Bits per element a coder of these component variances saves against equal variances (the
    Hadamard baseline: each component at the mean) at the baseline's distortion for ``rate``."""
    d = float(var.mean()) * 2.0 ** (-2 * rate)
    lo, hi = 0.0, rate
    for _ in range(60):  # the rate at which water-filling reaches d
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if water_fill(var, mid) <= d else (mid, hi)
    return rate - hi


def component_variances(cal: np.ndarray, ev: np.ndarray, basis: str) -> np.ndarray:
    """Variances of the evaluated rows ``ev`` [T, D] in the basis fitted on ``cal`` [T, D]."""
    mu = cal.mean(0)
    if basis == "channel":
        return np.maximum((ev - mu).var(0), 1e-30)
    _, u = np.linalg.eigh(np.cov((cal - mu).T))
    return np.maximum(((ev - mu) @ u).var(0), 1e-30)


def caches(model, ids: torch.Tensor, starts: list[int], length: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Each window's context cache: per layer (K, V) as float64 [heads, tokens, head_dim]."""
    out = []
    with torch.no_grad():
        for s in starts:
            c = model(input_ids=ids[:, s: s + length], past_key_values=new_cache(model), use_cache=True).past_key_values
            out.append([(k[0].double().numpy(), v[0].double().numpy()) for k, v in cache_layers(c)])
    return out


def rows(x: np.ndarray, joined: bool) -> list[np.ndarray]:
    """[heads, T, D] as per-head [T, D] matrices, or one [T, heads * D]."""
    return [x.transpose(1, 0, 2).reshape(x.shape[1], -1)] if joined else list(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--corpus", default="wikitext-2-valid")
    p.add_argument("--context", type=int, default=1536, help="tokens of each context cache")
    p.add_argument("--calibration", default="0,1", help="calibration windows (stride 512)")
    p.add_argument("--evaluate", default="20", help="evaluated windows, never calibration ones")
    p.add_argument("--rates", default="2,2.667", help="bits per element")
    a = p.parse_args()
    torch.set_num_threads(1)
    model, tok = sources.load_model_and_tokenizer(a.model, device="cpu")
    ids = tokenize(tok, load_corpus(a.corpus))
    cal_w, ev_w = [int(w) for w in a.calibration.split(",")], [int(w) for w in a.evaluate.split(",")]
    if set(cal_w) & set(ev_w):
        raise SystemExit("decorrelation_gain: calibration and evaluated windows overlap")
    cal, ev = caches(model, ids, [512 * w for w in cal_w], a.context), caches(model, ids, [512 * w for w in ev_w], a.context)
    rates = [float(r) for r in a.rates.split(",")]
    print(f"{a.model}: calibration windows {cal_w}, evaluated {ev_w}, {a.context}-token contexts; bits per element "
          "saved against a Hadamard-rotated code at equal MSE (upper bound: Gaussian, ideal coding, basis not counted)")
    print("| role | basis | " + " | ".join(f"at {r:g} bits" for r in rates) + " |")
    print("|---|---|" + "---|" * len(rates))
    for role in (0, 1):
        for basis, joined in (("channel", False), ("pca/head", False), ("pca/layer", True)):
            got = {r: [] for r in rates}
            for layer in range(len(ev[0])):
                c = np.concatenate([rows(w[layer][role], joined) for w in cal], axis=1)
                for e in (rows(w[layer][role], joined) for w in ev):
                    for ci, ei in zip(c, e):
                        var = component_variances(ci, ei, basis)
                        for r in rates:
                            got[r].append(saving(var, r))
            print(f"| {'key' if role == 0 else 'value'} | {basis} | " + " | ".join(f"{np.mean(got[r]):.3f}" for r in rates) + " |")


if __name__ == "__main__":
    main()

"""The sweep on a GPU: where its time goes with the file CLI, with the codec server, and with
the server overlapped with the model (``make bench-gpu``, on a CUDA machine).

Every configuration scores the same windows with the same schemes and must give the same
numbers to the bit (checked here); they differ only in time:

- ``model only``: each scheme's transform is a clone of the exact context (no codec), so this
  is the model's whole share: the baseline forwards, every suffix forward and the scoring;
- ``codec``: the Go codec's own compute, summed over schemes and windows (``codec_time_ms``);
- file CLI / server sequential / server overlapped (pinned memory, the CUDA default) /
  server overlapped with pageable buffers.

With the codec overlapped, scoring should approach max(model only, codec) rather than their
sum. The model is a real one (``--model``) or, for timing on a machine without the weights,
random weights of a given config (``--config``); token ids come from a corpus and tokenizer
or from a saved tensor (``--ids``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import torch

from kvlib.codec import server as codec_server
from kvlib.cache.layout import cache_layers
from kvlib.codec.spec import resolve_codec
from kvlib.cache.layout import cache_like
from kvlib.scoring.perplexity import score_windows
from kvlib.transforms.codec import cache_transforms

from kvlib.dtypes import BY_NAME as DTYPES  # noqa: E402


def load(args):
    """The model on the device and the token ids."""
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = DTYPES[args.dtype]
    if args.config:
        torch.manual_seed(0)
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.config), dtype=dtype)
        name = f"random weights, {Path(args.config).name}"
    else:
        from kvlib.models.sources import load_model_and_tokenizer
        lm, _ = load_model_and_tokenizer(args.model, device="cpu", dtype=dtype)
        name = args.model
    lm = lm.to(args.device).eval()
    if args.ids:
        ids = torch.load(args.ids)
    else:
        from kvlib.models.corpus import load_corpus, tokenize
        from kvlib.models.sources import load_model_and_tokenizer
        _, tok = load_model_and_tokenizer(args.model, device="cpu")
        ids = tokenize(tok, load_corpus(args.corpus))
    return lm, ids.reshape(1, -1), name


def exact_clones(names):
    """Transforms with no codec: the context cache, cloned (the suffix forward extends it)."""
    def clone(cache):
        return cache_like(cache, [(k.clone(), v.clone()) for k, v in cache_layers(cache)]), None
    return {n: clone for n in names}


def numbers(res):
    return {k: [(w.baseline_nll, w.compressed_nll, w.kld, w.top1_agree) for w in r.windows] for k, r in res.items()}


def run(lm, ids, args, backend, overlap, schemes, tmp):
    """One configuration: scoring seconds, bridge seconds, codec seconds and the numbers."""
    if backend == "model":
        ts = exact_clones(schemes)
    else:
        os.environ["KVLIB_CODEC"] = "cli" if backend == "cli" else "server"
        ts, _ = cache_transforms([resolve_codec(s) for s in schemes], Path(tmp) / f"{backend}-{overlap}", "bench")
    torch.cuda.synchronize() if args.device == "cuda" else None
    res = score_windows(lm, ids, args.context, 512, ts, args.windows, progress=False, overlap=overlap)
    bridge = {k: sum(getattr(t, "seconds", {}).get(k, 0.0) for t in ts.values()) for k in ("save", "cli", "load")}
    codec = sum(m.codec_time_ms for r in res.values() for m in r.window_metrics) / 1000
    return {"scoring_s": next(iter(res.values())).seconds, "bridge_s": bridge, "codec_s": codec}, numbers(res)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--config", help="random weights of this config.json (timing only)")
    p.add_argument("--ids", help="a saved [N] or [1, N] tensor of token ids")
    p.add_argument("--corpus", default="embedded")
    p.add_argument("--dtype", default="float16", choices=DTYPES)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--schemes", default="int4,kivi4,q8_0,q4_0")
    p.add_argument("--windows", type=int, default=21)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    schemes = args.schemes.split(",")
    lm, ids, name = load(args)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"== Sweep on {gpu}: {name}, {args.dtype}, {args.windows} windows of {args.context}, "
          f"schemes {', '.join(schemes)}; best of {args.rounds} rounds", flush=True)
    configs = [("model", True, schemes), ("cli", False, schemes), ("server", False, schemes),
               ("server", True, schemes), ("server-pageable", True, schemes), ("server", True, schemes[:1]),
               ("model", True, schemes[:1])]
    best: dict[str, dict] = {}
    ref: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        run(lm, ids, argparse.Namespace(**{**vars(args), "windows": 2}), "server", True, schemes, tmp)  # warm-up
        for _ in range(args.rounds):
            for backend, overlap, names in configs:
                key = f"{backend}{'-overlap' if overlap else ''}-{len(names)}"
                pin = codec_server.pin
                if backend == "server-pageable":
                    codec_server.pin = lambda buf: None
                try:
                    fig, nums = run(lm, ids, args, backend.split("-")[0], overlap, names, tmp)
                finally:
                    codec_server.pin = pin
                if backend != "model":
                    same = json.dumps(ref.setdefault(len(names), nums)) == json.dumps(nums)
                    if not same:
                        print(f"NUMBERS DIFFER: {key}", flush=True)
                    fig["identical"] = same
                if fig["scoring_s"] < best.get(key, {"scoring_s": math.inf})["scoring_s"]:
                    best[key] = fig
    n = len(schemes)
    model, codec = best[f"model-overlap-{n}"]["scoring_s"], best[f"server-overlap-{n}"]["codec_s"]
    rows = [("file CLI, sequential", f"cli-{n}"), ("server, sequential", f"server-{n}"),
            ("server, overlapped, pinned", f"server-overlap-{n}"),
            ("server, overlapped, pageable", f"server-pageable-overlap-{n}")]
    print(f"  model only (no codec): {model:.2f} s;  codec compute: {codec:.2f} s;  "
          f"max {max(model, codec):.2f} s, sum {model + codec:.2f} s")
    print(f"  {'configuration':<30} {'scoring':>8} {'bridge':>8} {'share':>6} {'save':>6} {'codec call':>10} "
          f"{'load':>6} {'/ max':>6}  identical")
    for label, key in rows:
        f = best[key]
        b = sum(f["bridge_s"].values())
        print(f"  {label:<30} {f['scoring_s']:7.2f}s {b:7.2f}s {100 * b / f['scoring_s']:5.1f}% "
              f"{f['bridge_s']['save']:5.2f}s {f['bridge_s']['cli']:9.2f}s {f['bridge_s']['load']:5.2f}s "
              f"{f['scoring_s'] / max(model, codec):6.2f}  {f.get('identical')}")
    one, many = best["server-overlap-1"], best[f"server-overlap-{n}"]
    extra = (many["scoring_s"] - one["scoring_s"]) / (n - 1)
    extra_model = (model - best["model-overlap-1"]["scoring_s"]) / (n - 1)
    extra_codec = (many["codec_s"] - one["codec_s"]) / (n - 1)
    print(f"  an extra scheme (overlapped): {extra:.2f} s; its codec {extra_codec:.2f} s + its suffix forwards and "
          f"scoring {extra_model:.2f} s = {extra_codec + extra_model:.2f} s (ratio "
          f"{extra / (extra_codec + extra_model):.2f}; with the codec hidden, "
          f"{extra / max(extra_model, 1e-9):.2f} of the model's part)")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": gpu, "model": name, "dtype": args.dtype,
                                               "windows": args.windows, "schemes": schemes, "best": best}, indent=1))
    return 0 if all(f.get("identical", True) for f in best.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

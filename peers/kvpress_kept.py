#!/usr/bin/env python3
"""Dump the token indices that NVIDIA kvpress 0.5.5 keeps per (layer, kv_head).

kvlib's independent check of its eviction presses (kvlib/transforms/evict.py): `make peer-kvpress`
builds the side venv from peers/requirements-kvpress.txt and `python -m kvlib.runs.kvpress_check`
runs this script on the token ids kvlib prefilled. Run with the side venv (kvpress 0.5.5 needs
transformers < 5.3):

    /work/sidevenv-kvpress/bin/python /work/notes/kvpress_kept.py \
        --model /path/to/SmolLM2-135M-Instruct.Q4_1.gguf \
        --prompt prompt.txt --press snapkv --ratio 0.5 --out kept.json

--model is either a HF model directory or a .gguf file (loaded with
transformers' from_pretrained(dir, gguf_file=name); needs the `gguf` package,
weights are dequantized to float32).

What is run is exactly what KVPressTextGenerationPipeline._forward does for the
context (kvpress/pipeline.py:210-221):

    with press(model):
        model.model(input_ids=context_ids, past_key_values=DynamicCache())

The press' own hooks compress the cache. This script only observes: it wraps
the press instance's `score` to capture the score tensor, recomputes
`scores.topk(compute_n_kept(k_len, ratio), dim=-1).indices` (the very call of
ScorerPress.compress, scorer_press.py:94-96) and checks that gathering the
uncompressed keys with those indices reproduces the compressed cache bit for bit.

Output JSON:
  layers[l][h] = sorted list of kept token positions (0-based, in context_ids)
  topk_order[l][h] (with --topk-order) = same indices in cache order (topk order)
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TQDM_DISABLE", "1")  # silence the GGUF de-quantization progress bar

import torch


def build_press(name, ratio, args):
    from kvpress import KnormPress, SnapKVPress, StreamingLLMPress

    if name == "streaming_llm":
        return StreamingLLMPress(compression_ratio=ratio, n_sink=args.n_sink)
    if name == "knorm":
        return KnormPress(compression_ratio=ratio)
    if name == "snapkv":
        return SnapKVPress(compression_ratio=ratio, window_size=args.window_size, kernel_size=args.kernel_size)
    raise SystemExit(f"unknown press {name!r} (streaming_llm, knorm, snapkv)")


def load_model(path, attn_impl):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = dict(dtype=torch.float32, attn_implementation=attn_impl)
    if path.endswith(".gguf"):
        d, f = os.path.split(os.path.abspath(path))
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, **kw)
    else:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **kw)
    model.eval()
    return tok, model


def context_ids_for(tok, text, mode):
    """raw: tokens of the text as-is (add_special_tokens=False).
    bos: tokenizer's default special tokens.
    pipeline: the context part exactly as KVPressTextGenerationPipeline.preprocess
    builds it (pipeline.py:139-159): chat template with a '#' separator, keep the
    part before the separator; or bos+text when the tokenizer has no template."""
    if mode == "raw":
        return tok.encode(text, return_tensors="pt", add_special_tokens=False)
    if mode == "bos":
        return tok.encode(text, return_tensors="pt")
    if tok.chat_template is None:
        context = (getattr(tok, "bos_token", "") or "") + text
    else:
        sep = "#" * (len(text) + 10)
        context = tok.apply_chat_template(
            [{"role": "user", "content": text + sep}], add_generation_prompt=True, tokenize=False,
            enable_thinking=False,
        )
        context = context.split(sep)[0]
    return tok.encode(context, return_tensors="pt", add_special_tokens=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF model dir or .gguf file")
    ap.add_argument("--prompt", help="text file with the context")
    ap.add_argument("--token-ids", help="JSON file with the context's token ids (instead of --prompt): the very "
                    "ids kvlib prefilled")
    ap.add_argument("--press", required=True, choices=["streaming_llm", "knorm", "snapkv"])
    ap.add_argument("--ratio", type=float, required=True, help="compression_ratio (fraction removed)")
    ap.add_argument("--tokenize", default="raw", choices=["raw", "bos", "pipeline"])
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"],
                    help="sdpa: SnapKV recomputes window attention itself (attentions is None); "
                         "eager: SnapKV uses the model's own attention weights")
    ap.add_argument("--n-sink", type=int, default=4)
    ap.add_argument("--window-size", type=int, default=64)
    ap.add_argument("--kernel-size", type=int, default=5)
    ap.add_argument("--topk-order", action="store_true", help="also dump indices in cache (topk) order")
    ap.add_argument("--dump-scores", action="store_true", help="also dump the float scores")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="-", help="output JSON path ('-' = stdout)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    import kvpress
    from kvpress.utils import compute_n_kept
    from transformers import DynamicCache

    tok, model = load_model(args.model, args.attn)
    if args.token_ids:
        ids = torch.tensor([json.load(open(args.token_ids))], dtype=torch.long)
    else:
        text = open(args.prompt, encoding="utf-8").read()
        ids = context_ids_for(tok, text, args.tokenize)
    k_len = ids.shape[1]

    press = build_press(args.press, args.ratio, args)
    captured = {}  # layer_idx -> dict
    orig_score = press.score

    def score_wrapper(module, hidden_states, keys, values, attentions, kwargs):
        s = orig_score(module, hidden_states, keys, values, attentions, kwargs)
        captured[module.layer_idx] = {
            "scores": s.detach().clone(),
            "keys": keys.detach().clone(),
            "values": values.detach().clone(),
            "attentions_given": attentions is not None,
        }
        return s

    press.score = score_wrapper  # instance attribute shadows the dataclass method

    cache = DynamicCache()
    with torch.inference_mode():
        with press(model):
            model.model(input_ids=ids, past_key_values=cache)

    n_kept = compute_n_kept(k_len, args.ratio) if args.ratio > 0 else k_len
    layers, order, scores_out = [], [], []
    mismatches = 0
    n_layers = len(cache.layers)
    for li in range(n_layers):
        ck, cv = cache.layers[li].keys, cache.layers[li].values
        if li not in captured:  # ratio == 0: compress() returns before score()
            assert ck.shape[2] == k_len
            per_head = [list(range(k_len)) for _ in range(ck.shape[1])]
            layers.append(per_head)
            order.append(per_head)
            continue
        c = captured[li]
        idx = c["scores"].topk(n_kept, dim=-1).indices  # same call as scorer_press.py:96
        g = idx.unsqueeze(-1).expand(-1, -1, -1, c["keys"].shape[-1])
        if not (torch.equal(c["keys"].gather(2, g), ck) and torch.equal(c["values"].gather(2, g), cv)):
            mismatches += 1
        layers.append([sorted(h.tolist()) for h in idx[0]])
        order.append([h.tolist() for h in idx[0]])
        if args.dump_scores:
            scores_out.append(c["scores"][0].float().tolist())

    res = {
        "kvpress_version": getattr(kvpress, "__version__", None) or _dist_version("kvpress"),
        "model": args.model,
        "model_class": type(model).__name__,
        "attn_implementation": model.config._attn_implementation,
        "press": repr(press),
        "press_name": args.press,
        "compression_ratio": args.ratio,
        "tokenize": args.tokenize,
        "context_len": k_len,
        "n_kept": n_kept,
        "num_layers": n_layers,
        "num_kv_heads": model.config.num_key_value_heads,
        "num_attention_heads": model.config.num_attention_heads,
        "head_dim": getattr(model.config, "head_dim", None),
        "snapkv_used_model_attentions": any(c["attentions_given"] for c in captured.values()) if captured else None,
        "cache_matches_recomputed_indices": mismatches == 0,
        "token_ids": ids[0].tolist(),
        "layers": layers,
    }
    if args.topk_order:
        res["topk_order"] = order
    if args.dump_scores:
        res["scores"] = scores_out
    s = json.dumps(res)
    if args.out == "-":
        sys.stdout.write(s + "\n")
    else:
        with open(args.out, "w") as f:
            f.write(s)
        print(f"wrote {args.out}: context_len={k_len} n_kept={n_kept} layers={n_layers} "
              f"kv_heads={res['num_kv_heads']} cache_match={mismatches == 0}", file=sys.stderr)
    return 0 if mismatches == 0 else 1


def _dist_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())

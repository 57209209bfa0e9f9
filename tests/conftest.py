"""Shared fixtures: a tiny random Llama with TinyLlama's KV geometry, a tiny
real tokenizer, the embedded model (loaded once for the whole run, also when a run
loads it by name), and the built CLI."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # for kvq_reference

from kvlib.codec import binary as bridge  # noqa: E402
from kvlib.cache.io import TINYLLAMA_HEAD_DIM, TINYLLAMA_NUM_KV_HEADS, TINYLLAMA_NUM_LAYERS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext-2-valid.txt"
TINY_WORDS = "the a of and to in is was it for on that with as by at from his her an be this are which".split()


@pytest.fixture(scope="session", autouse=True)
def session_results_store(tmp_path_factory):
    """Module- and session-scoped fixtures run before any test's own store is set: they get an empty
    store of the run's own, never the user's (~/.cache/kvlib/results), whose finished units would
    stand in for the computation they test."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVLIB_RESULTS", str(tmp_path_factory.mktemp("session-results")))
        for name in ("KVLIB_FRESH", "KVLIB_RAY", "RAY_ADDRESS"):
            mp.delenv(name, raising=False)
        yield


@pytest.fixture(autouse=True)
def own_results_store(tmp_path, monkeypatch):
    """Each test starts from an empty results store of its own (runs write units by default)."""
    monkeypatch.setenv("KVLIB_RESULTS", str(tmp_path / "kvlib-results"))
    monkeypatch.delenv("KVLIB_FRESH", raising=False)
    monkeypatch.delenv("KVLIB_RAY", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.fixture(scope="session")
def cli() -> str:
    """Path of the built kv-compress (make setup builds it)."""
    return bridge.find_cli_binary()


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A real fast tokenizer over a small word vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(TINY_WORDS)}}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="session")
def tiny_llama():
    """A randomly initialised Llama with TinyLlama's KV geometry: 22 layers, 4 KV heads, head_dim 64."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=TINYLLAMA_NUM_LAYERS,
        num_attention_heads=8, num_key_value_heads=TINYLLAMA_NUM_KV_HEADS, head_dim=TINYLLAMA_HEAD_DIM,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tiny_llama, tiny_tokenizer):
    """The tiny Llama and tokenizer saved as a Hugging Face directory, and a corpus file of its words."""
    import random

    d = tmp_path_factory.mktemp("tiny")
    tiny_llama.save_pretrained(d / "model")
    tiny_tokenizer.save_pretrained(d / "model")
    rng = random.Random(0)
    (d / "corpus.txt").write_text(" ".join(rng.choice(TINY_WORDS) for _ in range(1400)))
    return d


@pytest.fixture(scope="session", autouse=True)
def embedded_loads_once():
    """The embedded SmolLM2-135M (its GGUF dequantized: 10 to 20 s a load) loads once per test run:
    ``load_model_and_tokenizer`` of the embedded model (by any of its names) on one device and dtype
    returns the model loaded the first time. Runs still call it (a test that forbids loading by
    monkeypatching it sees every call); other models load as they would. Nothing in kvlib changes
    a loaded model's weights, so sharing it changes no number."""
    import inspect

    from kvlib.env import default_device
    from kvlib.models import sources, zoo

    real = sources.load_model_and_tokenizer
    signature = inspect.signature(real)
    loaded: dict[tuple, tuple] = {}

    def load_once(*args, **kwargs):
        a = signature.bind(*args, **kwargs)
        a.apply_defaults()
        model, device, dtype = a.arguments["model"], a.arguments["device"], a.arguments["dtype"]
        try:
            src = sources.resolve_model(model)
        except Exception:  # noqa: BLE001 - the real loader says what is wrong
            return real(*args, **kwargs)
        if (src.kind, src.gguf_file) != ("zoo", zoo.EMBEDDED_GGUF):
            return real(*args, **kwargs)
        device = device or default_device()
        dtype = dtype or (torch.float16 if device.startswith("cuda") else torch.float32)
        key = (src.path, device, dtype)
        if key not in loaded:
            loaded[key] = real(model, device=device, dtype=dtype)
        return loaded[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sources, "load_model_and_tokenizer", load_once)
        yield loaded


@pytest.fixture(scope="session")
def embedded(embedded_loads_once):
    """The embedded SmolLM2-135M model and tokenizer (loaded once for the whole run)."""
    from kvlib.models import sources

    return sources.load_model_and_tokenizer("embedded", device="cpu")

"""Choose and tokenize the evaluation text: the embedded default (Python's own documentation,
``pydoc_data.topics``, on every machine), WikiText-2's validation split shipped with kvlib
(``wikitext-2-valid``, offline), WikiText-2 through ``datasets`` when it can be reached, or any
local text file.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

EMBEDDED = "embedded"
WIKITEXT = "wikitext-2-raw-v1"
EMBEDDED_NAME = "Python documentation topics (pydoc_data.topics)"
# Shipped with kvlib (see data/README.md): WikiText-2's validation split, word-level, offline.
BUNDLED = {"wikitext-2-valid": ("data/wikitext-2-valid.txt.gz", "WikiText-2 validation (word-level, bundled)")}


@dataclass
class Corpus:
    """Text to score, and where it came from."""

    name: str
    text: str


def embedded_text() -> str:
    """The bundled Python documentation topics, in a fixed (sorted) order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def load_corpus(
    corpus: str = EMBEDDED,
    dataset_name: str = "wikitext",
    split: str = "test",
) -> Corpus:
    """Load ``corpus``: "embedded", a dataset config such as "wikitext-2-raw-v1", or a text file path.

    A local file is used whole and unmodified; a ``datasets`` split is joined
    with "\\n\\n" as in the Hugging Face perplexity guide.
    """
    if corpus == EMBEDDED:
        return Corpus(EMBEDDED_NAME, embedded_text())
    if corpus in BUNDLED:
        file, name = BUNDLED[corpus]
        return Corpus(name, gzip.decompress((Path(__file__).parent / file).read_bytes()).decode("utf-8"))
    path = Path(corpus)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: corpus is not UTF-8 text (byte {e.start}: {e.reason})") from None
        if "\x00" in text:
            raise ValueError(f"{path}: corpus holds NUL bytes: a binary file, not text")
        if not text.strip():
            raise ValueError(f"{path}: corpus file is empty")
        return Corpus(str(path), text)
    if corpus.startswith(("wikitext-", "wikitext_")) or corpus == dataset_name:
        return _load_dataset(dataset_name, corpus if corpus != dataset_name else WIKITEXT, split)
    raise FileNotFoundError(
        f"corpus {corpus!r} is neither 'embedded', {', '.join(repr(b) for b in BUNDLED)}, a dataset config like "
        f"'{WIKITEXT}', nor an existing text file"
    )


def _load_dataset(name: str, config: str, split: str) -> Corpus:
    try:
        from datasets import load_dataset

        ds = load_dataset(name, config, split=split)
    except Exception as e:  # offline: ConnectionError, DatasetNotFoundError, OSError...
        raise RuntimeError(
            f"cannot load {name}/{config} ({split}) through `datasets`: {type(e).__name__}: {str(e)[:300]}\n"
            f"Offline alternatives: corpus='{EMBEDDED}' (Python docs, always available) or a local text file, "
            f"e.g. the WikiText-2 validation text."
        ) from None
    return Corpus(f"{name}/{config} ({split})", "\n\n".join(ds["text"]))


def tokenize(tokenizer: Any, corpus: Corpus) -> torch.Tensor:
    """Token ids [1, N] of the whole text, with the tokenizer's default added special tokens (BOS).
    The text is text: a special token's spelling in it (WikiText-2's literal ``<unk>``, 11,718 times
    in the validation split) is tokenized as characters, as llama-perplexity does (parse_special
    false), not mapped to the control token a model never saw in training (Gemma-3's ``<unk>`` id
    costs it 14 to 41 nats each)."""
    ids = tokenizer(corpus.text, return_tensors="pt", split_special_tokens=True).input_ids
    if ids.shape[1] < 2:
        raise ValueError(f"corpus {corpus.name!r} tokenizes to {ids.shape[1]} token(s): nothing to score")
    return ids

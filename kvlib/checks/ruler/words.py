"""The raw material of RULER's synthetic prompts: its noise sentence, the wonderwords 2.2.0 lists
it draws keys and common words from (shipped, data/README.md), random values and a sentence
splitter for text haystacks.
"""

from __future__ import annotations

import functools
import gzip
import random
import re
import string
import uuid
from importlib import resources

import numpy as np

# RULER scripts/data/synthetic/niah.py (commit c3f5e3b), the noise haystack's unit, verbatim.
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
# niah.py's DEPTHS: np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int).
DEPTHS = tuple(int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)))
FIXED_SEED = 42  # RULER's random.Random(42).shuffle calls: a permutation that depends only on length


@functools.cache
def wordlist(kind: str) -> tuple[str, ...]:
    """wonderwords 2.2.0's ``{kind}list.txt`` lines (noun, adjective, verb), as its
    ``_get_words_from_text_file`` reads them (stripped, blank lines dropped)."""
    raw = resources.files("kvlib.checks.ruler").joinpath(f"data/{kind}list.txt.gz").read_bytes()
    return tuple(w.strip() for w in gzip.decompress(raw).decode().splitlines() if w.strip())


@functools.cache
def key_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(adjectives, nouns), each sorted and unique: RULER's keys are ``adj-noun`` drawn uniformly
    from the sorted set of all pairs; drawing each part uniformly gives the same distribution
    without building its 6.2 million strings."""
    return tuple(sorted(set(wordlist("adjective")))), tuple(sorted(set(wordlist("noun"))))


@functools.cache
def common_words() -> tuple[str, ...]:
    """RULER's cwe pool: nouns + adjectives + verbs, unique and sorted, then shuffled with
    ``random.Random(42)`` (common_words_extraction.py lines 72-83)."""
    words = sorted(set(wordlist("noun") + wordlist("adjective") + wordlist("verb")))
    random.Random(FIXED_SEED).shuffle(words)
    return tuple(words)


def random_value(rng: random.Random, kind: str) -> str:
    """A needle's key or value as niah.py draws it: a 7-digit number, an adj-noun word or a uuid4."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        adjs, nouns = key_words()
        return f"{rng.choice(adjs)}-{rng.choice(nouns)}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"needle type {kind!r}: numbers, words or uuids")


def random_letters(rng: random.Random, k: int, alphabet: str = string.ascii_uppercase) -> str:
    return "".join(rng.choices(alphabet, k=k))


# Sentence ends of a text haystack. RULER splits Paul Graham's essays with NLTK's Punkt model,
# which is downloaded at run time; offline, a sentence ends at . ! or ? followed by space and a
# capital (or a quote or bracket), which is what Punkt decides on plain prose.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z])")


def sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


def essay_words(text: str) -> list[str]:
    """niah.py's essay haystack: ``re.sub(r'\\s+', " ", essay).split(" ")``."""
    return re.sub(r"\s+", " ", text).split(" ")

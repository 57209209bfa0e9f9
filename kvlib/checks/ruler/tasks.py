"""RULER's synthetic tasks, generated offline from a seed.

Followed: NVIDIA/RULER at commit c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a —
``scripts/synthetic.yaml`` (each task's arguments), ``scripts/data/synthetic/constants.py`` (templates,
answer prefixes, tokens to generate), ``niah.py``, ``variable_tracking.py``,
``common_words_extraction.py``, ``freq_words_extraction.py``, ``qa.py``, and
``scripts/eval/synthetic/constants.py`` (the metrics); docs/ruler.md gives the line-level notes.

What differs from RULER, and why: each sample is drawn from its own seed (``sample_seed``), so
samples are independent units that a killed run recomputes alone (RULER draws all samples from
one stream, which the length search also consumes); a text haystack is a corpus kvlib ships or
the user gives (Paul Graham's essays cannot be shipped) split into sentences by a rule, not
NLTK's downloaded Punkt model; the singular rewrite of single-answer NIAH prompts touches the task
text, not the chat template around it; the prompt's length counts the tokens the model is fed
(special tokens included) plus the tokens to generate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import random
import socket
from dataclasses import dataclass
from typing import Any, Callable, ClassVar
from urllib.parse import urlparse

import numpy as np

from kvlib.checks.ruler.words import (DEPTHS, FIXED_SEED, NOISE, common_words, essay_words, random_letters,
                                      random_value, sentences)

TASKS: dict[str, "Task"] = {}


def register(task: "Task") -> "Task":
    if task.name in TASKS:
        raise ValueError(f"RULER task {task.name!r} registered twice")
    TASKS[task.name] = task
    return task


@dataclass(frozen=True)
class Sample:
    """One prompt: ``context`` is prefilled (and compressed), ``question`` appended after it (the
    rest of the prompt, the chat template's turn end and the answer prefix), then up to
    ``max_new_tokens`` are decoded and scored against ``references``."""

    task: str
    length: int
    index: int
    context: tuple[int, ...]
    question: tuple[int, ...]
    references: tuple[str, ...]
    max_new_tokens: int
    metric: str

    @property
    def tokens(self) -> int:
        return len(self.context) + len(self.question)


def sample_seed(seed: int, task: str, length: int, index: int) -> int:
    """The seed of one sample: a function of the run's seed and the sample's place only."""
    h = hashlib.sha256(f"{seed}/{task}/{length}/{index}".encode()).digest()
    return int.from_bytes(h[:8], "little")


def wrap(tokenizer: Any, task_text: str) -> str:
    """The task text as the model is prompted: in its chat template's user turn, ready for the
    assistant's answer, when it has one; the text itself otherwise (RULER's 'base')."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": task_text}], tokenize=False,
                                             add_generation_prompt=True)
    return task_text


@dataclass(frozen=True)
class Drawn:
    """A sample's text before tokenizing: the whole prompt (answer prefix included), the context
    whose end splits it, and the references."""

    prompt: str
    context: str
    references: tuple[str, ...]


class Task:
    """A RULER task: its template, answer prefix and metric, and ``draw``, the prompt of one
    sample at ``size`` haystack units. ``sample`` searches the largest size that fits a length."""

    name: str  # a dataclass field of each task (its RULER name)
    family: ClassVar[str] = ""
    template: ClassVar[str] = ""
    answer_prefix: ClassVar[str] = ""
    tokens_to_generate: ClassVar[int] = 0
    metric: ClassVar[str] = "string_match_all"
    step: ClassVar[int] = 1  # haystack units the length search first measures the cost of one unit over

    def draw(self, rng: random.Random, size: int, tokenizer: Any, env: "Environment", length: int,
             index: int) -> Drawn:
        """The prompt of sample ``index`` of ``length`` with ``size`` haystack units."""
        raise NotImplementedError

    def min_size(self) -> int:
        """The fewest haystack units a prompt can have."""
        return 1

    def unavailable(self, env: "Environment") -> str | None:
        """Why this task cannot run here (a dataset that cannot be loaded), or None."""
        return None

    def encode(self, tokenizer: Any, d: Drawn) -> tuple[list[int], list[int]]:
        at = d.prompt.rfind(d.context) + len(d.context)
        head = tokenizer(d.prompt[:at]).input_ids  # with the tokenizer's own BOS, as it is fed
        tail = tokenizer(d.prompt[at:], add_special_tokens=False).input_ids
        return head, tail

    def sample(self, tokenizer: Any, length: int, seed: int, index: int, env: "Environment") -> Sample:
        """The sample ``index`` of ``length``: the most haystack units whose prompt and answer fit
        ``length`` tokens (each size drawn afresh from the sample's seed: the sample depends on
        nothing else). ValueError when not even the smallest fits."""
        s, budget = sample_seed(seed, self.name, length, index), length - self.tokens_to_generate
        seen: dict[int, tuple[int, Drawn, list[int], list[int]]] = {}

        def probe(size: int) -> tuple[int, Drawn, list[int], list[int]]:
            if size not in seen:
                d = self.draw(random.Random(s), size, tokenizer, env, length, index)
                head, tail = self.encode(tokenizer, d)
                seen[size] = (len(head) + len(tail), d, head, tail)
            return seen[size]

        lo = self.min_size()
        if probe(lo)[0] > budget:
            raise ValueError(f"RULER {self.name}: length {length} is too short (the smallest prompt takes "
                             f"{probe(lo)[0]} tokens and the answer {self.tokens_to_generate})")
        per_unit = max((probe(lo + self.step)[0] - probe(lo)[0]) / self.step, 1e-3)
        hi = max(lo + int((budget - probe(lo)[0]) / per_unit), lo + 1)
        while probe(hi)[0] <= budget:  # grow until it does not fit
            lo, hi = hi, hi + max(hi // 4 // self.step, 1) * self.step
        while hi - lo > 1:  # lo fits, hi does not: the largest size that fits, unit by unit as RULER's
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if probe(mid)[0] <= budget else (lo, mid)
        _, d, head, tail = probe(lo)
        return Sample(self.name, length, index, tuple(head), tuple(tail), d.references, self.tokens_to_generate,
                      self.metric)


@dataclass(frozen=True)
class Environment:
    """What tasks draw on besides the tokenizer: the text haystack (a corpus's text)."""

    haystack_text: str = ""
    haystack_name: str = ""


# --- NIAH (niah.py) -----------------------------------------------------------------------------

NIAH_TEMPLATE = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize "
                 "it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special "
                 "magic {type_needle_v} for {query} mentioned in the provided text?")
NIAH_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."


def singular(text: str) -> str:
    """niah.py's rewrite when one answer is asked (lines 191-198)."""
    return text.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")


@dataclass(frozen=True)
class Niah(Task):
    """Needles "One of the special magic numbers for KEY is: VALUE." in a haystack of noise
    sentences, text or other needles; the question asks the values of some keys."""

    name: str
    haystack: str  # noise, essay or needle
    type_k: str
    type_v: str
    num_k: int = 1
    num_v: int = 1
    num_q: int = 1
    depth: float | None = None  # the one needle's place (0 the haystack's start, 1 its end); None: seeded
    family: ClassVar[str] = "niah"
    tokens_to_generate: ClassVar[int] = 128

    @property
    def step(self) -> int:  # type: ignore[override]
        return 25 if self.haystack != "essay" else 100

    def min_size(self) -> int:
        return max(self.num_k, self.num_q) * self.num_v  # each needle needs a line to go before

    def unavailable(self, env: Environment) -> str | None:
        if self.haystack == "essay" and not env.haystack_text:
            return f"{self.name} needs a text haystack (a corpus)"
        return None

    def draw(self, rng, size, tokenizer, env, length, index):
        num_k = max(self.num_k, self.num_q)  # niah.py line 77
        keys, values, needles = [], [], []
        for _ in range(num_k):
            keys.append(random_value(rng, self.type_k))
            values.append([random_value(rng, self.type_v) for _ in range(self.num_v)])
            needles += [NEEDLE.format(type_needle_v=self.type_v, key=keys[-1], value=v) for v in values[-1]]
        random.Random(FIXED_SEED).shuffle(needles)
        if self.haystack == "essay":
            words = essay_words(env.haystack_text)
            text = " ".join((words * math.ceil(size / len(words)))[:size])
            sents = sentences(text)
            at = ([round(len(sents) * self.depth)] if self.depth is not None else
                  [int(len(sents) * d / 100) for d in rng.sample(DEPTHS, len(needles))])
            cuts = [0] + sorted(at) + [len(sents)]
            parts = []
            for i in range(len(cuts) - 1):
                parts += sents[cuts[i]:cuts[i + 1]]
                if i < len(needles):
                    parts.append(needles[i])
            context = " ".join(parts)
        else:
            if self.haystack == "noise":
                lines = [NOISE] * size
            else:  # distractor needles, key then value per unit
                lines = []
                for _ in range(size):
                    k = random_value(rng, self.type_k)
                    lines.append(NEEDLE.format(type_needle_v=self.type_v, key=k, value=random_value(rng, self.type_v)))
            spots = [round(self.depth * size)] if self.depth is not None else rng.sample(range(size), len(needles))
            for at, needle in zip(sorted(spots, reverse=True), needles):
                lines.insert(at, needle)
            context = "\n".join(lines)
        asked = rng.sample(range(num_k), self.num_q)
        queries = [keys[i] for i in asked]
        answers = tuple(a for i in asked for a in values[i])
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
        template, prefix, type_v = NIAH_TEMPLATE, NIAH_PREFIX, self.type_v
        if self.num_q * self.num_v == 1:
            template, prefix, type_v = singular(template), singular(prefix), type_v[:-1]
        task_text = template.format(type_needle_v=type_v, context=context, query=query)
        return Drawn(wrap(tokenizer, task_text) + prefix.format(type_needle_v=type_v, query=query), context, answers)


for _args in (("niah_single_1", "noise", "words", "numbers"), ("niah_single_2", "essay", "words", "numbers"),
              ("niah_single_3", "essay", "words", "uuids"), ("niah_multikey_1", "essay", "words", "numbers", 4),
              ("niah_multikey_2", "needle", "words", "numbers"), ("niah_multikey_3", "needle", "uuids", "uuids"),
              ("niah_multivalue", "essay", "words", "numbers", 1, 4),
              ("niah_multiquery", "essay", "words", "numbers", 1, 1, 4)):
    register(Niah(*_args))  # scripts/synthetic.yaml


def at_depth(name: str, depth: float) -> Niah:
    """The NIAH task ``name`` with its one needle at ``depth`` of the haystack (0 before its first
    line, 1 after its last) instead of a seeded place: the pass-key grid of the decoding checks."""
    task = TASKS.get(name)
    if not isinstance(task, Niah) or max(task.num_k, task.num_q) * task.num_v != 1:
        raise ValueError(f"RULER task {name!r} has no single needle to place at a depth")
    if not 0 <= depth <= 1:
        raise ValueError(f"needle depth {depth} must be in [0, 1]")
    return dataclasses.replace(task, depth=float(depth))


# --- Variable tracking (variable_tracking.py) ---------------------------------------------------

VT_TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
               "Question: Find all variables that are assigned the value {query} in the text above.")
VT_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
             "assigned the value {query}, they are: ")
VT_ICL_TOKENS = 500  # the one-shot example's length (variable_tracking.py line 303)


@dataclass(frozen=True)
class VariableTracking(Task):
    """Chains "VAR B = VAR A" from "VAR A = 12345" hidden among noise lines; the answer is every
    variable of the chain. A one-shot example (3-letter names) comes first."""

    name: str
    num_chains: int = 1
    num_hops: int = 4
    family: ClassVar[str] = "variable_tracking"
    tokens_to_generate: ClassVar[int] = 30
    step: ClassVar[int] = 10

    def min_size(self) -> int:
        return (self.num_hops + 1) * self.num_chains

    def chains(self, rng: random.Random, np_rng: np.random.RandomState, icl: bool) -> tuple[list[list[str]], list[list[str]]]:
        k, hops = (3, min(10, self.num_hops)) if icl else (5, self.num_hops)
        names: list[str] = []
        while len(set(names)) < (hops + 1) * self.num_chains:
            names = [random_letters(rng, k) for _ in range((hops + 1) * self.num_chains)]
        chains, variables = [], []
        for i in range(0, len(names), hops + 1):
            v = names[i:i + hops + 1]
            value = 12345 if icl else int(np_rng.randint(10000, 99999))
            chains.append([f"VAR {v[0]} = {value}"] + [f"VAR {v[j + 1]} = VAR {v[j]} " for j in range(hops)])
            variables.append(v)
        return chains, variables

    def body(self, rng, np_rng, noises: int, icl: bool) -> tuple[str, str, list[str]]:
        chains, variables = self.chains(rng, np_rng, icl)
        value = chains[0][0].split("=")[-1].strip()
        lines = [NOISE] * noises
        for chain in chains:
            for j, at in enumerate(sorted(rng.sample(range(len(lines)), len(chain)))):
                lines.insert(at + j, chain[j])
        context = "\n".join(lines).replace(". \n", ".\n")
        text = VT_TEMPLATE.format(context=context, query=value)
        return text, context, variables[0]

    def draw(self, rng, size, tokenizer, env, length, index):
        np_rng = np.random.RandomState(rng.getrandbits(32))
        icl_text, _, icl_vars = self.body(rng, np_rng, icl_noise_lines(self, tokenizer), icl=True)
        icl = icl_text + VT_PREFIX.format(num_v=self.num_hops + 1, query="12345") + " " + " ".join(icl_vars) + "\n"
        for name in icl_vars:  # randomize_icl: fresh names and value each sample
            icl = icl.replace(name, random_letters(rng, len(name)))
        icl = icl.replace("12345", str(np_rng.randint(10000, 99999)))
        text, context, answer = self.body(rng, np_rng, size, icl=False)
        query = text.rsplit("the value ", 1)[1].split(" ")[0]
        prompt = wrap(tokenizer, icl + "\n" + text) + VT_PREFIX.format(num_v=self.num_hops + 1, query=query)
        return Drawn(prompt, context, tuple(answer))


_ICL_LINES: dict[tuple[int, int], int] = {}


def icl_noise_lines(task: VariableTracking, tokenizer: Any) -> int:
    """Noise lines of the one-shot example: the most whose prompt fits VT_ICL_TOKENS (found once per
    tokenizer, with a fixed seed)."""
    key = (id(tokenizer), task.num_hops)
    if key not in _ICL_LINES:
        n = 5
        while True:
            text, _, _ = task.body(random.Random(FIXED_SEED), np.random.RandomState(FIXED_SEED), n + 5, icl=True)
            full = text + VT_PREFIX.format(num_v=task.num_hops + 1, query="12345")
            if len(tokenizer(full, add_special_tokens=False).input_ids) > VT_ICL_TOKENS:
                break
            n += 5
        _ICL_LINES[key] = n
    return _ICL_LINES[key]


register(VariableTracking("vt"))


# --- Common words extraction (common_words_extraction.py) --------------------------------------

CWE_TEMPLATE = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize "
                "the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the "
                "above list?")
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"


@dataclass(frozen=True)
class CommonWords(Task):
    """A numbered list where 10 words appear 30 times and the others 3 times; the answer is the
    10 common words. One solved example comes first."""

    name: str
    freq_cw: int = 30
    freq_ucw: int = 3
    num_cw: int = 10
    family: ClassVar[str] = "common_words_extraction"
    tokens_to_generate: ClassVar[int] = 120
    step: ClassVar[int] = 10

    @staticmethod
    def example(rng: random.Random, num_words: int, common_repeats: int, uncommon_repeats: int,
                common_nums: int) -> tuple[str, list[str]]:
        pool = common_words()
        full = rng.sample(pool, min(num_words, len(pool)))
        common, uncommon = full[:common_nums], full[common_nums:]
        words = common * common_repeats + uncommon * uncommon_repeats
        random.Random(FIXED_SEED).shuffle(words)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words)), common

    def draw(self, rng, size, tokenizer, env, length, index):
        size = min(size, len(common_words()))  # RULER falls back to a larger list RULER cannot ship
        small = length < 4096
        ex_ctx, ex_common = self.example(rng, 20, 3, 1, 10) if small else self.example(rng, 40, 10, 3, 10)
        shot = (wrap(tokenizer, CWE_TEMPLATE.format(context=ex_ctx)) + CWE_PREFIX + " "
                + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ex_common)))
        context, common = self.example(rng, size, *((6, 1, 10) if small else (self.freq_cw, self.freq_ucw, self.num_cw)))
        prompt = shot + "\n" + wrap(tokenizer, CWE_TEMPLATE.format(context=context)) + CWE_PREFIX
        return Drawn(prompt, context, tuple(common))


register(CommonWords("cwe"))


# --- Frequent words extraction (freq_words_extraction.py) --------------------------------------

FWE_TEMPLATE = ("Read the following coded text and track the frequency of each coded word. Find the three most "
                "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please "
                "ignore the dots '....'. What are the three most frequently appeared words in the above coded text?")
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
ZETA_2 = math.pi ** 2 / 6  # scipy.special.zeta(2.0), the Zipf normaliser at alpha 2


@dataclass(frozen=True)
class FrequentWords(Task):
    """Random 6-letter coded words with Zipf frequencies (alpha 2), the most frequent being '...';
    the answer is the words ranked 2 to 4."""

    name: str
    alpha: float = 2.0
    word_length: int = 6
    family: ClassVar[str] = "freq_words_extraction"
    tokens_to_generate: ClassVar[int] = 50
    step: ClassVar[int] = 32

    def draw(self, rng, size, tokenizer, env, length, index):
        vocab_size = max((length - self.tokens_to_generate) // 50, 4)
        vocab = [random_letters(rng, self.word_length, "abcdefghijklmnopqrstuvwxyz") for _ in range(vocab_size)]
        while len(set(vocab)) < vocab_size:
            vocab.append(random_letters(rng, self.word_length, "abcdefghijklmnopqrstuvwxyz"))
        vocab = sorted(set(vocab))
        random.Random(FIXED_SEED).shuffle(vocab)
        vocab[0] = "..."
        counts = (size * np.arange(1, len(vocab) + 1, dtype=np.float64) ** -self.alpha / ZETA_2).astype(int)
        words = [w for w, c in zip(vocab, counts.tolist()) for _ in range(c)]
        random.Random(FIXED_SEED).shuffle(words)
        context = " ".join(words)
        return Drawn(wrap(tokenizer, FWE_TEMPLATE.format(context=context)) + FWE_PREFIX, context, tuple(vocab[1:4]))


register(FrequentWords("fwe"))


# --- QA (qa.py): real datasets, through `datasets` when it can reach them ------------------------

QA_TEMPLATE = ("Answer the question based on the given documents. Only give me the answer and do not output any "
               "other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the "
               "given documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}")
QA_PREFIX = " Answer:"
DOCUMENT = "Document {i}:\n{document}"


@dataclass(frozen=True)
class QA(Task):
    """A question over documents (the gold ones among distractors); any reference answer counts."""

    name: str
    dataset: str  # squad or hotpotqa
    family: ClassVar[str] = "qa"
    tokens_to_generate: ClassVar[int] = 32
    metric: ClassVar[str] = "string_match_part"
    step: ClassVar[int] = 10

    def unavailable(self, env: Environment) -> str | None:
        host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
        try:  # offline, datasets retries for half a minute: ask the network once first
            socket.create_connection((host, 443), timeout=3).close()
        except OSError as e:
            return f"{self.name} ({self.dataset}) skipped: its dataset needs the Hub and {host} cannot be reached " \
                   f"({e.strerror or type(e).__name__})"
        try:
            qa_data(self.dataset)
        except Exception as e:  # offline, or datasets missing: the one line the report shows
            return f"{self.name} ({self.dataset}) skipped: its dataset cannot be loaded here ({type(e).__name__}: " \
                   f"{str(e).splitlines()[0][:120] if str(e) else 'no detail'})"
        return None

    def draw(self, rng, size, tokenizer, env, length, index):
        docs, questions = qa_data(self.dataset)
        q = questions[index % len(questions)]
        gold, more = list(q["context"]), list(q.get("more_context", []))
        if size < len(docs):
            if size - len(gold) > len(more):
                rest = [i for i in range(len(docs)) if i not in set(gold + more)]
                chosen = gold + more + rng.sample(rest, size - len(gold) - len(more))
            else:
                chosen = gold + rng.sample(more, max(size - len(gold), 0))
        else:
            chosen = (list(range(len(docs))) * math.ceil(size / len(docs)))[:size]
        random.Random(FIXED_SEED).shuffle(chosen)
        context = "\n\n".join(DOCUMENT.format(i=i + 1, document=docs[d]) for i, d in enumerate(chosen))
        prompt = wrap(tokenizer, QA_TEMPLATE.format(context=context, query=q["query"])) + QA_PREFIX
        return Drawn(prompt, context, tuple(q["outputs"]))


_QA_LOADERS: dict[str, Callable[[], Any]] = {}


def qa_data(dataset: str) -> tuple[list[str], list[dict[str, Any]]]:
    """(documents, questions) as qa.py reads SQuAD v2 dev (answerable questions) or HotpotQA dev
    (distractor), in file order, through ``datasets``."""
    if dataset not in _QA_LOADERS:
        from datasets import load_dataset  # an optional dependency (kvlib[hub])

        if dataset == "squad":
            rows = load_dataset("rajpurkar/squad_v2", split="validation")
            docs = sorted({r["context"] for r in rows})
            at = {d: i for i, d in enumerate(docs)}
            by_title: dict[str, set[int]] = {}
            for r in rows:
                by_title.setdefault(r["title"], set()).add(at[r["context"]])
            qs = [{"query": r["question"], "outputs": list(r["answers"]["text"]), "context": [at[r["context"]]],
                   "more_context": sorted(by_title[r["title"]] - {at[r["context"]]})}
                  for r in rows if r["answers"]["text"]]
        else:
            rows = load_dataset("hotpotqa/hotpot_qa", "distractor", split="validation")
            texts = [[f"{t}\n{''.join(s)}" for t, s in zip(r["context"]["title"], r["context"]["sentences"])]
                     for r in rows]
            docs = sorted({d for ds in texts for d in ds})
            at = {d: i for i, d in enumerate(docs)}
            qs = [{"query": r["question"], "outputs": [r["answer"]], "context": [at[d] for d in ds]}
                  for r, ds in zip(rows, texts)]
        _QA_LOADERS[dataset] = lambda d=docs, q=qs: (d, q)
    return _QA_LOADERS[dataset]()


register(QA("qa_1", "squad"))
register(QA("qa_2", "hotpotqa"))

"""kvlib beside llama.cpp: the same GGUF, the same token ids and the same chunks through
``llama-perplexity`` (built from the llama-cpp-python sdist: ``make peer-llamacpp``) with its
``-ctk``/``-ctv`` cache types, rotation on (the default) and off (``LLAMA_ATTN_ROT_DISABLE=1``),
and through kvlib's write mode with the same types; each side's delta is against its own f16
cache on the same chunks, and the difference of the two deltas gets a paired bootstrap CI over
chunks. llama.cpp runs its own quantized weights and kernels, so the two cannot agree to the bit;
what is part of the engine's cache arithmetic is emulated (see docs/engines.md). With
``--engine-weights f32`` llama.cpp runs the GGUF dequantized to F32 by its own ``llama-quantize``:
the weights kvlib runs, so that what remains between the two sides is the cache's arithmetic.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader

from kvlib.codec.server import SharedContext, shared_server
from kvlib.codec.spec import resolve_codec
from kvlib.env import stop_on_sigterm
from kvlib.gates import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, CI_LEVEL
from kvlib.models.corpus import load_corpus, tokenize
from kvlib.models.sources import load_model_and_tokenizer, resolve_model
from kvlib.scoring.perplexity import plan_chunks, score_windows
from kvlib.transforms.codec import CLICacheRoundtrip, ServerCacheRoundtrip
from kvlib.transforms.engine import engine_write

PEER_SCRIPT = Path(__file__).resolve().parents[2] / "peers" / "build_llamacpp.sh"
TYPES = ("f16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
# The agreement goal: kvlib's write-mode delta within the larger of 15 % and 0.02 of llama.cpp's.
AGREE_REL, AGREE_ABS = 0.15, 0.02


class LlamaCppError(RuntimeError):
    """llama-perplexity could not be built or run (one line naming what and why)."""


@dataclass(frozen=True)
class CacheTypes:
    """One llama.cpp cache setting: -ctk, -ctv and the rotation (on unless LLAMA_ATTN_ROT_DISABLE)."""

    k: str
    v: str
    rotation: bool = True

    @property
    def label(self) -> str:
        kv = self.k if self.k == self.v else f"K {self.k}, V {self.v}"
        return kv + ("" if self.k == "f16" and self.v == "f16" else ", rotation " + ("on" if self.rotation else "off"))

    @property
    def flags(self) -> str:
        env = "" if self.rotation else "LLAMA_ATTN_ROT_DISABLE=1 "
        return f"{env}llama-perplexity -ctk {self.k} -ctv {self.v}"


@dataclass
class ChunkRun:
    """One side's run of one setting: each chunk's summed target NLL, and the perplexity."""

    nll: list[float]
    targets_per_chunk: int
    seconds: float = 0.0

    @property
    def perplexity(self) -> float:
        return math.exp(sum(self.nll) / (len(self.nll) * self.targets_per_chunk))


def build_peer() -> Path:
    """The llama-perplexity binary (built once under build/llamacpp by peers/build_llamacpp.sh)."""
    proc = subprocess.run(["bash", str(PEER_SCRIPT)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LlamaCppError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "the build failed")
    return Path(proc.stdout.strip().splitlines()[-1])


_ROW = re.compile(r"^\s*(\d+)\s+([0-9.]+)\s+(-?[0-9.]+)\s+(-?[0-9.eE+-]+)\s*$")


def parse_chunks(stdout: str, n_ctx: int) -> list[float]:
    """Each chunk's summed NLL from ``--ppl-output-type 1`` rows ("start ppl mean_nll std"): the
    running mean over k chunks, times k chunks' targets, minus the previous sum."""
    means = [float(m.group(3)) for line in stdout.splitlines() if (m := _ROW.match(line))]
    per = n_ctx - n_ctx // 2 - 1
    sums = [mean * per * (i + 1) for i, mean in enumerate(means)]
    return [s - (sums[i - 1] if i else 0.0) for i, s in enumerate(sums)]


def run_llama_perplexity(binary: Path, gguf: Path, text: Path, n_ctx: int, chunks: int, types: CacheTypes,
                         threads: int | None = None, timeout: float = 3600) -> ChunkRun:
    """llama-perplexity on ``text`` with the cache types; its process group is killed on a timeout."""
    argv = [str(binary), "-m", str(gguf), "-f", str(text), "-c", str(n_ctx), "-b", str(n_ctx), "--chunks", str(chunks),
            "-ctk", types.k, "-ctv", types.v, "-fa", "on", "--ppl-output-type", "1", "-t", str(threads or os.cpu_count())]
    env = dict(os.environ)
    env.pop("LLAMA_ATTN_ROT_DISABLE", None)
    if not types.rotation:
        env["LLAMA_ATTN_ROT_DISABLE"] = "1"
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise LlamaCppError(f"llama-perplexity ({types.label}) did not finish within {timeout:.0f} s") from None
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    if proc.returncode != 0:
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise LlamaCppError(f"llama-perplexity ({types.label}) exited {proc.returncode}: {last}")
    nll = parse_chunks(out + err, n_ctx)
    if len(nll) != chunks:
        raise LlamaCppError(f"llama-perplexity ({types.label}) printed {len(nll)} chunks, expected {chunks}")
    return ChunkRun(nll, n_ctx - n_ctx // 2 - 1, time.perf_counter() - t0)


def llama_token_ids(binary: Path, gguf: Path, text: Path, timeout: float = 600) -> list[int]:
    """The ids llama-perplexity scores: ``llama-tokenize`` (built beside it) with special tokens not
    parsed, as perplexity.cpp's common_tokenize(ctx, prompt, true) leaves parse_special false
    (tools/perplexity/perplexity.cpp:473, common/common.h:1119); the tokenizer's BOS first when it
    adds one."""
    tool = binary.parent / "llama-tokenize"
    argv = [str(tool), "-m", str(gguf), "-f", str(text), "--ids", "--log-disable", "--no-parse-special"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlamaCppError(f"llama-tokenize exited {proc.returncode}: {last}")
    return [int(t) for t in json.loads(proc.stdout.strip().splitlines()[-1])]


def gguf_bos(path: Path) -> int | None:
    """The GGUF's BOS id (None: it names none). Whether llama.cpp adds it is what llama-tokenize's
    first id says (llama.cpp can force it whatever ``add_bos_token`` says: llama-vocab.cpp)."""
    f = GGUFReader(str(path)).fields.get("tokenizer.ggml.bos_token_id")
    return None if f is None else int(f.parts[f.data[0]][0])


def chunk_ids(ids: list[int], n_ctx: int, chunks: int, bos: int | None) -> torch.Tensor:
    """llama-perplexity's input: each chunk's first token replaced by BOS when the tokenizer adds one,
    i.e. when ``ids`` start with it (perplexity.cpp:567-568, ``tokens[seq_start] =
    llama_vocab_bos(vocab)`` for j == 0, under add_bos)."""
    x = torch.tensor([ids], dtype=torch.long)
    if bos is not None and ids and ids[0] == bos:
        for i in range(min(chunks, len(ids) // n_ctx)):
            x[0, i * n_ctx] = bos
    return x


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token sequences differ (None: equal)."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return i if i is not None or len(a) == len(b) else min(len(a), len(b))


def delta(run: ChunkRun, base: ChunkRun, idx: np.ndarray | None = None) -> float:
    """Perplexity delta of ``run`` against ``base`` on the chunks ``idx`` (default all)."""
    a, b = np.asarray(run.nll), np.asarray(base.nll)
    if idx is not None:
        a, b = a[idx], b[idx]
    n = len(a) * run.targets_per_chunk
    return math.exp(a.sum() / n) - math.exp(b.sum() / n)


def _bootstrap(stat: Any, n: int, samples: int, seed: int) -> tuple[float, float]:
    """Percentile bootstrap CI of ``stat(idx)`` over ``n`` chunks (the chunks are the unit: their
    tokens share a cache)."""
    rng = np.random.default_rng(seed)
    values = [stat(rng.integers(0, n, n)) for _ in range(samples)]
    alpha = (1 - CI_LEVEL) / 2
    return float(np.quantile(values, alpha, method="lower")), float(np.quantile(values, 1 - alpha, method="higher"))


def paired_ci(engine: ChunkRun, engine_base: ChunkRun, ours: ChunkRun, ours_base: ChunkRun,
              samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """CI of (kvlib's delta - llama.cpp's delta), the same chunks resampled for both sides."""
    return _bootstrap(lambda idx: delta(ours, ours_base, idx) - delta(engine, engine_base, idx),
                      len(engine.nll), samples, seed)


def delta_ci(run: ChunkRun, base: ChunkRun, samples: int = BOOTSTRAP_SAMPLES,
             seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """CI of one side's delta against its own f16 run, chunks resampled."""
    return _bootstrap(lambda idx: delta(run, base, idx), len(run.nll), samples, seed)


@dataclass
class Comparison:
    """One setting on both sides."""

    setting: CacheTypes
    kvlib_spec: str
    engine_delta: float
    kvlib_delta: float
    diff_ci: tuple[float, float]
    engine_ppl: float
    kvlib_ppl: float
    engine_nll: list[float] = field(default_factory=list)  # each chunk's summed NLL, for per-chunk study
    kvlib_nll: list[float] = field(default_factory=list)
    engine_ci: tuple[float, float] = (math.nan, math.nan)  # each side's delta, chunks resampled
    kvlib_ci: tuple[float, float] = (math.nan, math.nan)

    @property
    def agrees(self) -> bool:
        return abs(self.kvlib_delta - self.engine_delta) <= max(AGREE_REL * abs(self.engine_delta), AGREE_ABS)

    def to_dict(self) -> dict:
        return {**asdict(self), "setting": asdict(self.setting), "label": self.setting.label,
                "flags": self.setting.flags, "agrees": self.agrees}


@dataclass
class SideBySide:
    model: str
    text: str
    n_ctx: int
    chunks: int
    engine_base_ppl: float
    kvlib_base_ppl: float
    engine_base_nll: list[float] = field(default_factory=list)
    kvlib_base_nll: list[float] = field(default_factory=list)
    rows: list[Comparison] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    # both sides score llama-tokenize's ids; where kvlib's own tokenizer first differs (None: nowhere)
    tokens: dict[str, Any] = field(default_factory=dict)
    engine_weights: str = "gguf"  # the GGUF's own weights and kernels, or "f32": dequantized by llama-quantize
    kvlib_from: str = ""  # the run kvlib's side was taken from (it does not depend on llama.cpp's weights)

    @property
    def targets_per_chunk(self) -> int:
        return self.n_ctx - self.n_ctx // 2 - 1

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"}, "rows": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, d: dict) -> "SideBySide":
        """A run back from its JSON (each side's CI recomputed from the chunks' NLLs when absent)."""
        r = cls(**{k: d[k] for k in ("model", "text", "n_ctx", "chunks", "engine_base_ppl", "kvlib_base_ppl",
                                     "engine_base_nll", "kvlib_base_nll", "seconds")}, tokens=d.get("tokens", {}),
                engine_weights=d.get("engine_weights", "gguf"), kvlib_from=d.get("kvlib_from", ""))
        per = r.targets_per_chunk
        for row in d["rows"]:
            c = Comparison(CacheTypes(**row["setting"]), row["kvlib_spec"], row["engine_delta"], row["kvlib_delta"],
                           tuple(row["diff_ci"]), row["engine_ppl"], row["kvlib_ppl"], row["engine_nll"],
                           row["kvlib_nll"])
            c.engine_ci = tuple(row.get("engine_ci") or delta_ci(ChunkRun(c.engine_nll, per),
                                                                 ChunkRun(r.engine_base_nll, per)))
            c.kvlib_ci = tuple(row.get("kvlib_ci") or delta_ci(ChunkRun(c.kvlib_nll, per),
                                                               ChunkRun(r.kvlib_base_nll, per)))
            r.rows.append(c)
        return r


def kvlib_spec(types: CacheTypes) -> str:
    """The kv-compress spec of a llama.cpp setting (f16 is never rotated)."""
    def one(t: str) -> str:
        return f"llama.cpp:{t}" + ("" if types.rotation or t == "f16" else "/norot")
    return one(types.k) if types.k == types.v else f"k={one(types.k)},v={one(types.v)}"


def gguf_architecture(path: Path) -> str:
    """general.architecture of a GGUF file."""
    f = GGUFReader(str(path)).fields["general.architecture"]
    return bytes(f.parts[f.data[0]]).decode()


def run_kvlib(model: Any, ids: Any, n_ctx: int, chunks: int, settings: list[CacheTypes], architecture: str,
              workdir: Path) -> dict[CacheTypes, ChunkRun]:
    """Each setting in kvlib's write mode on llama.cpp's chunks, with llama.cpp's write path (channel
    order, query conversion), through the codec server (or the file CLI)."""

    server = shared_server()

    def make(codec: Any, sub: str = "") -> Any:
        if server is not None:
            return ServerCacheRoundtrip(server, codec, "kvlib", context=SharedContext("kvlib"))
        return CLICacheRoundtrip(workdir / (sub or codec.spec.replace("/", "_")), codec, "kvlib")

    windows = plan_chunks(ids.shape[1], n_ctx, chunks)
    out = {}
    for s in settings:
        t = engine_write(make(resolve_codec(kvlib_spec(s))), make, architecture)
        t0 = time.perf_counter()
        r = score_windows(model, ids, n_ctx, n_ctx, {"x": t}, progress=False, mode="write", windows=windows)["x"]
        out[s] = ChunkRun([w.compressed_nll for w in r.windows], windows[0].num_targets, time.perf_counter() - t0)
    return out


def dequantized_gguf(quantize: Path, gguf: Path, out_dir: Path, timeout: float = 1800) -> Path:
    """``gguf`` with every tensor dequantized to F32 by llama.cpp's own ``llama-quantize --allow-requantize
    ... F32`` (cached in ``out_dir``, written under a temporary name first): the values transformers
    loads from the GGUF, for llama.cpp to run with its F32 kernels."""
    out = out_dir / f"{gguf.stem}-{gguf.stat().st_size}-f32.gguf"
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    proc = subprocess.run([str(quantize), "--allow-requantize", str(gguf), str(tmp), "F32"], capture_output=True,
                          text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlamaCppError(f"llama-quantize could not dequantize {gguf.name} to F32: {last}")
    tmp.replace(out)
    return out


def reused_kvlib_side(path: Path, gguf: Path, n_ctx: int, chunks: int, tokens: dict[str, Any],
                      settings: list[CacheTypes]) -> dict[CacheTypes, ChunkRun]:
    """kvlib's side of an earlier run (``--kvlib-from``) on the same GGUF, token ids and chunks: its
    per-chunk NLLs do not depend on which weights llama.cpp ran. ValueError names what does not match."""
    old = SideBySide.from_dict(json.loads(path.read_text()))
    want = (gguf.name, n_ctx, chunks, tokens.get("count"), tokens.get("bos_each_chunk"))
    have = (old.model, old.n_ctx, old.chunks, old.tokens.get("count"), old.tokens.get("bos_each_chunk"))
    if want != have:
        raise ValueError(f"{path}: kvlib's side was run on {have} (GGUF, n_ctx, chunks, tokens, BOS), not {want}")
    per = old.targets_per_chunk
    rows = {c.setting: c for c in old.rows}
    if missing := [s.label for s in settings[1:] if s not in rows]:
        raise ValueError(f"{path}: no kvlib run of {', '.join(missing)}")
    return {settings[0]: ChunkRun(old.kvlib_base_nll, per), **{s: ChunkRun(rows[s].kvlib_nll, per) for s in settings[1:]}}


def token_plan(binary: Path, gguf: Path, text: Path, tok: Any) -> tuple[list[int], dict[str, Any]]:
    """llama-tokenize's ids of ``text`` and what the result records about them."""
    theirs, bos = llama_token_ids(binary, gguf, text), gguf_bos(gguf)
    return theirs, {"source": "llama-tokenize --no-parse-special", "count": len(theirs),
                    "bos_each_chunk": bos if theirs and theirs[0] == bos else None,
                    "kvlib_tokenizer_differs_at": first_difference(tokenize(tok, load_corpus(str(text)))[0].tolist(), theirs)}


def side_by_side(gguf: Path, text: Path, settings: list[CacheTypes], n_ctx: int = 2048, chunks: int = 8,
                 threads: int | None = None, say: Any = print, corpus: str | None = None, engine_weights: str = "gguf",
                 kvlib_from: Path | None = None) -> SideBySide:
    """Both sides on every setting (f16 first: each side's baseline), compared; ``corpus`` names the
    text in the result (default: its path); ``engine_weights`` "f32" runs llama.cpp on the dequantized
    GGUF; ``kvlib_from`` takes kvlib's side from an earlier run's JSON."""

    base = CacheTypes("f16", "f16", True)
    settings = [base] + [s for s in settings if s != base]
    binary = build_peer()
    engine_gguf = gguf if engine_weights == "gguf" else dequantized_gguf(
        binary.with_name("llama-quantize"), gguf, binary.parent.parent / "models")
    engine, t0 = {}, time.perf_counter()
    for s in settings:
        say(f"llama-perplexity: {s.label}{'' if engine_weights == 'gguf' else ', F32 weights'}...")
        engine[s] = run_llama_perplexity(binary, engine_gguf, text, n_ctx, chunks, s, threads)
    t1 = time.perf_counter()
    model, tok = load_model_and_tokenizer(str(gguf), device="cpu")
    theirs, tokens = token_plan(binary, gguf, text, tok)
    if kvlib_from is not None:
        ours = reused_kvlib_side(kvlib_from, gguf, n_ctx, chunks, tokens, settings)
    else:
        ids = chunk_ids(theirs, n_ctx, chunks, gguf_bos(gguf))  # BOS each chunk when llama-tokenize puts one first
        with tempfile.TemporaryDirectory(prefix="kvlib-llamacpp-") as tmp:
            say("kvlib write mode on the same chunks...")
            ours = run_kvlib(model, ids, n_ctx, chunks, settings, gguf_architecture(gguf), Path(tmp))
    result = SideBySide(str(gguf.name), corpus or str(text), n_ctx, chunks, engine[base].perplexity, ours[base].perplexity,
                        engine[base].nll, ours[base].nll, tokens=tokens, engine_weights=engine_weights,
                        kvlib_from=str(kvlib_from or ""),
                        seconds={"llama.cpp_s": t1 - t0, **({} if kvlib_from else {"kvlib_s": time.perf_counter() - t1})})
    for s in settings[1:]:
        result.rows.append(Comparison(s, kvlib_spec(s), delta(engine[s], engine[base]), delta(ours[s], ours[base]),
                                      paired_ci(engine[s], engine[base], ours[s], ours[base]),
                                      engine[s].perplexity, ours[s].perplexity, engine[s].nll, ours[s].nll,
                                      delta_ci(engine[s], engine[base]), delta_ci(ours[s], ours[base])))
    return result


def weights_label(r: SideBySide) -> str:
    """Which weights llama.cpp ran, in words."""
    return ("the GGUF dequantized to F32 (llama-quantize), the weights kvlib runs" if r.engine_weights == "f32"
            else "the GGUF's own weights and kernels")


def print_side_by_side(r: SideBySide) -> None:
    print(f"{r.model} on {r.text}: {r.chunks} chunks of {r.n_ctx}; llama.cpp on {weights_label(r)}; f16 perplexity "
          f"llama.cpp {r.engine_base_ppl:.4f}, kvlib {r.kvlib_base_ppl:.4f}")
    print(f"  {'setting':30s} {'llama.cpp d (95% CI)':>30s} {'kvlib d (95% CI)':>30s} "
          f"{'kvlib - llama.cpp (95% CI)':>30s}  agree")
    for c in r.rows:
        cells = [(c.engine_delta, c.engine_ci), (c.kvlib_delta, c.kvlib_ci), (c.kvlib_delta - c.engine_delta, c.diff_ci)]
        print(f"  {c.setting.label:30s} " + " ".join(f"{v:+10.4f} [{lo:+8.4f}, {hi:+8.4f}]" for v, (lo, hi) in cells)
              + f"  {'yes' if c.agrees else 'no'}")


def parse_types(text: str) -> list[tuple[str, str]]:
    """--types: cache types, each TYPE (-ctk and -ctv both) or K/V (q4_0/f16: -ctk q4_0 -ctv f16, the
    K-only setting)."""
    pairs = []
    for t in (t for t in text.split(",") if t):
        k, _, v = t.partition("/")
        v = v or k
        bad = [x for x in (k, v) if x not in TYPES]
        if bad:
            raise ValueError(f"--types {t}: {', '.join(bad)} is not a llama.cpp cache type ({', '.join(TYPES)})")
        pairs.append((k, v))
    return pairs


def main(argv: list[str] | None = None) -> int:
    """make peer-llamacpp: build llama-perplexity, run both sides, print the table, write the JSON."""
    stop_on_sigterm()  # a killed run kills llama-perplexity's group and removes its temporary files

    ap = argparse.ArgumentParser(prog="python -m kvlib.runs.llamacpp", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded", help="a GGUF model (zoo name, 'embedded' or a .gguf path)")
    ap.add_argument("--corpus", default="wikitext-2-valid", help="'wikitext-2-valid' (shipped) or a text file")
    ap.add_argument("--types", default="q8_0,q4_0", help=f"cache types, of {', '.join(TYPES)}; K/V for K and V apart "
                    "(q4_0/f16: K only)")
    ap.add_argument("--rotation", default="on,off", help="on, off or on,off")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--json", default=None)
    ap.add_argument("--engine-weights", choices=("gguf", "f32"), default="gguf",
                    help="llama.cpp runs the GGUF's own weights (gguf), or the GGUF dequantized to F32 by its "
                         "llama-quantize (f32): the weights kvlib runs, so only the cache's arithmetic differs")
    ap.add_argument("--kvlib-from", default=None, metavar="JSON",
                    help="take kvlib's side from an earlier run on the same GGUF, text and chunks (its NLLs do not "
                         "depend on llama.cpp's weights)")
    a = ap.parse_args(argv)
    try:
        src = resolve_model(a.model)
        if not src.gguf_file:
            raise ValueError(f"{a.model}: llama.cpp needs a GGUF model")
        pairs = parse_types(a.types)
        rot = {"on": [True], "off": [False], "on,off": [True, False], "off,on": [False, True]}[a.rotation]
        settings = [CacheTypes(k, v, r) for k, v in pairs for r in rot if (k, v) != ("f16", "f16")]
        with tempfile.TemporaryDirectory(prefix="kvlib-llamacpp-") as tmp:
            text = Path(a.corpus)
            if not text.is_file():  # a named corpus, written out for llama-perplexity's -f
                text = Path(tmp) / "corpus.txt"
                text.write_text(load_corpus(a.corpus).text)
            r = side_by_side(Path(src.path) / src.gguf_file, text, settings, a.n_ctx, a.chunks, corpus=a.corpus,
                             engine_weights=a.engine_weights, kvlib_from=Path(a.kvlib_from) if a.kvlib_from else None)
    except (LlamaCppError, ValueError, KeyError, FileNotFoundError) as e:
        print(f"peer-llamacpp: error: {e}", file=sys.stderr)
        return 2
    print_side_by_side(r)
    if a.json:
        Path(a.json).write_text(json.dumps(r.to_dict(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

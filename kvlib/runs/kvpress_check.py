"""kvlib's eviction presses beside NVIDIA kvpress 0.5.5's own, on the same token ids: kvpress needs
transformers < 5.3, so it runs in a side venv (``make peer-kvpress`` builds it) through
``peers/kvpress_kept.py``, and the kept positions of every (layer, KV head) are compared.

    python -m kvlib.runs.kvpress_check --tasks niah_single_2,vt --length 2048 --bits 4.25
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvlib.checks.ruler.run import RulerConfig
from kvlib.checks.ruler.tasks import TASKS, Environment
from kvlib.env import stop_on_sigterm
from kvlib.models.corpus import load_corpus
from kvlib.models.sources import load_model_and_tokenizer, resolve_model
from kvlib.scoring.generate import prefill_observed
from kvlib.transforms.evict import PRESSES, SnapKV, make_press, ratio_at_bits

ROOT = Path(__file__).resolve().parents[2]
SIDE_PYTHON = ROOT / "build" / "kvpress-venv" / "bin" / "python"
PEER_SCRIPT = ROOT / "peers" / "kvpress_kept.py"


def kvpress_kept(python: Path, gguf: Path, ids: list[int], press: str, ratio: float, tmp: Path) -> dict[str, Any]:
    """kvpress's kept positions per (layer, KV head) on ``ids`` (its own process, one thread)."""
    (tmp / "ids.json").write_text(json.dumps(ids))
    out = tmp / f"{press}.json"
    p = subprocess.run([str(python), str(PEER_SCRIPT), "--model", str(gguf), "--token-ids", str(tmp / "ids.json"),
                        "--press", press, "--ratio", repr(ratio), "--out", str(out)], capture_output=True, text=True)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{PEER_SCRIPT.name} ({press}) failed: {last}")
    return json.loads(out.read_text())


def compare(ours: list[list[list[int]]], theirs: list[list[list[int]]]) -> dict[str, Any]:
    """How many (layer, head) kept sets are identical, and the fewest shared positions elsewhere."""
    pairs = [(set(a), set(b)) for la, lb in zip(ours, theirs) for a, b in zip(la, lb)]
    same = sum(a == b for a, b in pairs)
    worst = min((len(a & b) / len(a | b) for a, b in pairs if a != b), default=1.0)
    return {"sets": len(pairs), "identical": same, "worst_jaccard": worst}


def main(argv: list[str] | None = None) -> int:
    stop_on_sigterm()
    ap = argparse.ArgumentParser(prog="python -m kvlib.runs.kvpress_check", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded", help="a GGUF model (zoo name, 'embedded' or a .gguf path)")
    ap.add_argument("--tasks", default="niah_single_2,vt", help="RULER tasks whose sample 0 gives the context")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--bits", type=float, default=4.25, help="the bytes to match: ratio 1 - bits/16")
    ap.add_argument("--presses", default=",".join(PRESSES))
    ap.add_argument("--haystack", default="embedded")
    ap.add_argument("--python", default=str(SIDE_PYTHON), help="the side venv's python (make peer-kvpress)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        if not Path(a.python).is_file():
            raise FileNotFoundError(f"{a.python}: no kvpress side venv (make peer-kvpress builds it)")
        src = resolve_model(a.model)
        if not src.gguf_file:
            raise ValueError(f"{a.model}: the check loads the same GGUF on both sides")
        config = RulerConfig.parse(a.tasks, str(a.length), 1, a.presses, a.haystack)
        ratio = ratio_at_bits(a.bits)
        lm, tok = load_model_and_tokenizer(a.model, device="cpu")
        env = Environment(load_corpus(a.haystack).text, a.haystack)
        rows = []
        with tempfile.TemporaryDirectory(prefix="kvlib-kvpress-") as tmp:
            for task in config.tasks:
                ids = list(TASKS[task].sample(tok, a.length, config.seed, 0, env).context)
                cache, queries = prefill_observed(lm, ids, SnapKV.window)
                for press in config.presses:
                    theirs = kvpress_kept(Path(a.python), Path(src.path) / src.gguf_file, ids, press, ratio, Path(tmp))
                    if theirs["token_ids"] != ids:
                        raise RuntimeError(f"{task}: kvpress prefilled other token ids")
                    ours = [k[0].tolist() for k in make_press(press, ratio).kept(cache, queries)]
                    row = {"task": task, "tokens": len(ids), "press": press, "ratio": ratio,
                           "kept": theirs["n_kept"], **compare(ours, theirs["layers"])}
                    rows.append(row)
                    print(f"{task:16s} {len(ids):6d} tokens {press:14s} keep {theirs['n_kept']:5d}: "
                          f"{row['identical']}/{row['sets']} (layer, head) sets identical"
                          + (f", worst Jaccard {row['worst_jaccard']:.3f}" if row["identical"] < row["sets"] else ""),
                          flush=True)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"kvpress-check: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["identical"] == r["sets"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""``kv-validate --ruler``: the RULER-style suite for a model and its schemes, units in the results
store, printed as a task × length table per scheme with RULER's average, and written as JSON."""

from __future__ import annotations

import functools
import math
import os
import resource
import sys
import tempfile
import time
from typing import Any

from kvlib.checks.ruler.remote import RayRunner, ruler_job
from kvlib.checks.ruler.run import RulerConfig, RulerResult, run_ruler
from kvlib.codec.spec import CodecConfig
from kvlib.env import flag
from kvlib.runs.setup import RunParams, prepare_run
from kvlib.scoring.units import CheckUnits


def run_ruler_suite(codecs: list[CodecConfig], config: RulerConfig, model: str = "embedded", device: str | None = None,
                    dtype: str | None = None, results: Any = None, fresh: bool = False,
                    verbose: bool = True, ray: bool | str = False) -> RulerResult:
    """The suite on ``model``: its text haystack is ``config.haystack`` (a corpus name or file); the
    model loads only when a unit is missing from the store. On Ray when ``ray`` (True or an
    address), RAY_ADDRESS or KVLIB_RAY=1 asks for it, as a sweep."""
    t0 = time.perf_counter()
    run = prepare_run(RunParams(model=model, corpus=config.haystack, device=device, dtype=dtype, results=results,
                                fresh=fresh), verbose)
    with tempfile.TemporaryDirectory(prefix="kvlib-ruler-") as tmp:
        executor = None
        if ray or os.environ.get("RAY_ADDRESS") or flag("KVLIB_RAY"):
            job = ruler_job(model, run.device, run.dtype_name, codecs, run.name)
            executor = functools.partial(RayRunner, job=job, address=ray if isinstance(ray, str) else None)
        r = run_ruler(run.lazy(), run.tokenizer, codecs, tmp, config, run.text.text, run.name, progress=verbose,
                      units=CheckUnits(run.store, run.identity, "ruler"), executor=executor)
    r.timing.update(total_s=time.perf_counter() - t0, model_load_s=run.model_load_s, peak_rss_gb=peak_rss_gb())
    r.config["model"] = run.name
    return r


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (what a long prefill must fit in)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
    return peak / (2**30 if sys.platform == "darwin" else 2**20)


def _cell(acc: float, lo: float, hi: float, floor: bool) -> str:
    if math.isnan(acc):
        return "–"
    ci = f" [{lo:.0f},{hi:.0f}]" if not math.isnan(lo) else ""
    return f"{acc:.0f}{ci}" + ("*" if floor else "")


def print_ruler(r: RulerResult) -> None:
    """Per length: a task × scheme table (accuracy % and CI; * marks a floor: the exact cache
    scores below the qualifying accuracy there), RULER's average and the cache's MB."""
    tasks = r.tasks()
    for n in r.lengths:
        print(f"\nRULER at {n} tokens (up to {r.config['samples']} samples a task; * = floor: the exact cache is "
              f"below the qualifying accuracy, the schemes not compared there)")
        w = max(len(s) for s in r.schemes)
        print(f"  {'scheme':{w}s} {'MB':>7s} " + " ".join(f"{t:>18s}" for t in tasks) + f" {'avg qualifying':>18s}")
        for name in r.schemes:
            cells = [_cell(*r.cell(name, t, n), not r.qualifies(t, n)) for t in tasks]
            avg = _cell(*r.average(name, n, qualifying_only=True), False)
            print(f"  {name:{w}s} {r.megabytes(name, n):7.1f} " + " ".join(f"{c:>18s}" for c in cells)
                  + f" {avg:>18s}")
    for note in r.notes:
        print(f"  note: {note}")
    q = [(t, n) for n in r.lengths for t in tasks if r.qualifies(t, n)]
    print(f"  {len(q)} of {len(tasks) * len(r.lengths)} task-length cells qualify (exact cache ≥ floor); "
          f"{r.timing.get('total_s', 0):.0f} s" + (f", peak memory {r.timing['peak_rss_gb']:.1f} GB"
                                                    if "peak_rss_gb" in r.timing else ""))

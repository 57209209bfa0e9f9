"""The mixes of saved ``kv-validate --budget`` runs on fresh windows: each ``mix@B`` spec scored again
on the windows past those the plan and its first scoring saw (docs/mixed-precision.md, a budget of
bytes sent), the same check the knob search applies to its answer.

``python benchmarks/confirm_budget_mixes.py RUN.json [RUN.json ...] --first-window 21 --windows 21
--json OUT.json`` (the corpus of the runs: wikitext-2-valid by default).
"""

from __future__ import annotations

import argparse
import json

from kvlib.checks.decoding import DecodingChecks
from kvlib.runs.sweep import run_sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--corpus", default="wikitext-2-valid")
    ap.add_argument("--first-window", type=int, default=21)
    ap.add_argument("--windows", type=int, default=21)
    ap.add_argument("--results", default=None, help="a results store (units resume)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    specs: dict[str, str] = {}
    for path in args.runs:
        with open(path) as f:
            specs.update({s["spec"]: s["name"] for s in json.load(f)["schemes"] if s["name"].startswith("mix@")})
    res = run_sweep(list(specs), corpus_name=args.corpus, max_windows=args.windows, first_window=args.first_window,
                    peers=False, checks=DecodingChecks(), results=args.results, verbose=False)
    rows = []
    for s in res.schemes:
        name = specs.get(s.spec, s.name)
        rows.append({"name": name, "spec": s.spec, "bits_per_element": s.bits_per_element,
                     "context_delta": s.context_delta, "ci_low": s.ci_low, "ci_high": s.ci_high,
                     "kld_mean": s.kld_mean, "top1_agreement": s.top1_agreement, "robust": s.robust})
        print(f"{name} {s.bits_per_element:.4f} bits ({16 / s.bits_per_element:.3f}x) delta {s.context_delta:+.4f} "
              f"[{s.ci_low:+.4f}, {s.ci_high:+.4f}] {'robust' if s.robust else 'not robust'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"first_window": res.first_window, "windows": res.windows, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

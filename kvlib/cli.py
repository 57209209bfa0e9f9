"""``kv-validate`` (also ``python -m kvlib``): run the validation from a shell.

One scheme: exit 0 passed, 1 failed. Several (``--scheme A --scheme B`` or
``--schemes all``): a sweep; exit 0 when it recommends a scheme, 1 when none
passes with confidence. Exit 2 on any error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any
from pathlib import Path

from kvlib.env import stop_on_sigterm
from kvlib.models import corpus, zoo
from kvlib.models.sources import TINYLLAMA
from kvlib.checks.agreement import AgreementConfig
from kvlib.budget.plan import calibration_tokens, parse_budgets, similar_presets
from kvlib.codec.spec import resolve_codec
from kvlib.checks.decoding import DecodingChecks
from kvlib.checks.retrieval import RetrievalConfig
from kvlib.budget.sensitivity import CalibrationConfig
from kvlib.runs.setup import RunParams, check_parameters, prepare_run
from kvlib.scoring.perplexity import MODES, plan_windows
from kvlib.gates import CONFIRM_WINDOWS, MIN_CI_UNITS
from kvlib.runs.engines import confirm_cheapest, print_engine_tables
from kvlib.runs.sweep import engine_mode, engine_schemes, run_sweep, scheme_list, write_json
from kvlib.runs.transfer import TRANSFER_ENGINE, transfer_schemes
from kvlib.runs.knobs import (boundary_check, cheapest_setting, first_fresh_window, format_sensitivity,
                              make_knob, print_boundary_check, print_search)
from kvlib.runs.ruler import print_ruler, run_ruler_suite
from kvlib.checks.ruler.run import ALL_TASKS, RulerConfig
from kvlib.runs.validate import KVQUANT_THRESHOLD, run_full_validation, run_quick_test
from kvlib.transforms.base import peer_transforms


_R, _A, _U = RetrievalConfig(), AgreementConfig(), RulerConfig()  # the defaults the help text states


def _csv(xs: tuple) -> str:
    return ",".join(x if isinstance(x, str) else f"{x:g}" for x in xs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kv-validate", description="Does INT4 KV-cache compression keep the model's quality?")
    p.add_argument("--quick-test", action="store_true", help="synthetic cache through kv-compress, no model")
    p.add_argument("--cpu", action="store_true", help="force CPU even when CUDA is available")
    p.add_argument("--threshold", type=float, default=KVQUANT_THRESHOLD, help="maximum perplexity delta (default 0.5)")
    p.add_argument("--quiet", action="store_true", help="print only the verdict")
    p.add_argument("--model", default=zoo.EMBEDDED,
                   help=f"'{zoo.EMBEDDED}' (SmolLM2-135M, offline), a zoo model (--list-models), a .gguf file, "
                   f"a Hugging Face directory, or an HF id, e.g. {TINYLLAMA}")
    p.add_argument("--list-models", action="store_true", help="list the offline model zoo and exit")
    p.add_argument("--corpus", default=corpus.EMBEDDED, help=f"'{corpus.EMBEDDED}' (Python docs), 'wikitext-2-valid' (WikiText-2 validation, shipped), "
                   f"'{corpus.WIKITEXT}' (datasets), or a text file")
    p.add_argument("--scheme", action="append", default=None,
                   help="codec preset or spec, e.g. int4 (default), kivi4, q4_0, k=asym4/g64/channel,v=asym4/g64 "
                   "(kv-compress schemes lists the presets); repeat it to compare schemes in one pass")
    p.add_argument("--schemes", default=None, help="presets and specs to compare in one pass, or 'all': commas between schemes (k=...,v=... stays one), or ';' between specs")
    p.add_argument("--engine", default=None, metavar="ENGINE",
                   help="sweep every KV-cache format of an engine (llama.cpp, vllm, sglang, trtllm, exllamav2, exllamav3, ocp, lmcache, or all; kv-compress schemes -engine "
                   "lists them) in write mode, as a serving engine writes its cache (LMCache's serdes: prefix mode, a stored "
                   "prefix): the cheapest option that passes")
    p.add_argument("--knobs", action="store_true",
                   help="with --engine: validate the settings of the engine's own knobs (llama.cpp: every -ctk/-ctv "
                   "pair; vllm: the layers --kv-cache-dtype-skip-layers skips under --knob-format) in write mode, "
                   "fewest bits first, and print the flags of the cheapest that passes robustly")
    p.add_argument("--knob-format", default=None, metavar="FORMAT",
                   help="with --engine vllm --knobs: the --kv-cache-dtype (fp8, nvfp4, int4_per_token_head, "
                   "turboquant_3bit_nc...; kv-compress schemes -engine vllm) whose fewest skipped layers are searched, "
                   "the layers ranked by their measured sensitivity (--calibration sets its windows)")
    p.add_argument("--max-bits", type=float, default=None, metavar="BITS",
                   help="with --knobs: leave out settings that store more bits per element (a search that has found "
                   "nothing by then stops there; e.g. 8.5, q8_0's cost)")
    p.add_argument("--confirm-windows", type=int, default=CONFIRM_WINDOWS, metavar="N",
                   help=f"with --knobs, or --engine: a robust pass is the answer only if it passes robustly again on N "
                   f"fresh windows past those the search scored (default {CONFIRM_WINDOWS}; 0: no confirmation)")
    p.add_argument("--boundary-check", action="store_true",
                   help="with --knob-format TURBOQUANT_PRESET: also check the preset's fixed rule (the first and last "
                   "two layers skipped) against the measured ranking of every layer")
    p.add_argument("--calibrated-scales", action="store_true",
                   help="validate each static-scale engine format (vllm:fp8...) also with scales calibrated per layer on "
                   "the calibration windows (SCHEME@calibrated), beside scale 1 (on with --engine)")
    p.add_argument("--mode", default=None, choices=MODES,
                   help="prefix: the context compressed once, the scored tokens attend to their window exactly (the "
                   "KVQuant-style gate, default); write: every K and V quantized as written, inside the forward, as "
                   "engines do (llama.cpp, vLLM)")
    p.add_argument("--transfer", action="store_true",
                   help="the transfer view: LMCache's serdes and kvlib's presets with and without +wire (and any "
                   "--scheme), as bytes on the wire per context token against quality, in prefix mode; the fewest "
                   "bytes that pass")
    p.add_argument("--lossless", action="store_true", help="add kv-compress's lossless stage (smaller files, same results)")
    p.add_argument("--no-peers", action="store_true", help="in a sweep, leave out transformers' QuantizedCache peer")
    p.add_argument("--peers", metavar="NAME[,NAME]", default=None,
                   help="which of transformers' QuantizedCache peers run beside the schemes: families (hf-quanto, hf-hqq) or "
                   "rows (hf-hqq-int4), comma-separated (default hf-quanto; hf-hqq, HQQ's backend, is opt-in: slower, "
                   "and it refuses caches of some shapes); with one --scheme, it and the peers run as a sweep")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="model precision (auto: float32 on CPU, float16 on CUDA)")
    p.add_argument("--bits", type=int, default=None, help="code width, 2-8 (overrides the scheme's, both roles)")
    p.add_argument("--group-size", type=int, default=None, help="elements per quantization group (overrides the scheme's)")
    p.add_argument("--sparsity", type=float, default=None, help="fraction of smallest-magnitude elements zeroed")
    p.add_argument("--stride", type=int, default=512, help="sliding-window stride")
    p.add_argument("--max-windows", type=int, default=None, help="limit the number of windows (quick checks)")
    p.add_argument("--context-length", type=int, default=None, help="window length (default min(2048, model context))")
    p.add_argument("--json", metavar="OUT", help="write the result as JSON to OUT")
    b = p.add_argument_group("mixed precision", "per-layer sensitivity and a scheme per slot under a bit budget")
    b.add_argument("--sensitivity", action="store_true",
                   help="measure each layer and role's KL under each candidate, on calibration windows")
    b.add_argument("--budget", metavar="BITS[,BITS]",
                   help="choose a candidate per layer and role for at most BITS bits/element (implies --sensitivity) "
                   "and validate the mix (named mix@BITS) beside the other schemes")
    b.add_argument("--calibration", metavar="SETTINGS", default="",
                   help="calibration settings, e.g. 'corpus=embedded;windows=2;targets=128;"
                   "candidates=lm2rot,rot3,rot4,q8_0' (default corpus: the embedded one when another is "
                   "evaluated, else its tokens after the evaluated windows)")
    s = p.add_argument_group("results and scale", "finished units are kept and reused; Ray runs the missing ones")
    s.add_argument("--results", metavar="DIR", help="results store (default $KVLIB_HOME/results, i.e. ~/.cache/kvlib/results)")
    s.add_argument("--fresh", action="store_true", help="ignore the results store: compute every unit again")
    s.add_argument("--ray", nargs="?", const=True, default=False, metavar="ADDRESS",
                   help="a sweep's or RULER's units on Ray actors: a local cluster, or ADDRESS (RAY_ADDRESS set does the same)")
    r = p.add_argument_group("beyond perplexity", "checks against the exact cache, shown beside the verdict")
    r.add_argument("--retrieval", action="store_true", default=None, help="pass-key retrieval over a length x depth grid")
    r.add_argument("--retrieval-lengths", metavar="N,N", help=f"context lengths (default {_csv(_R.lengths)}; implies --retrieval)")
    r.add_argument("--retrieval-depths", metavar="F,F", help=f"key depths in [0, 1] (default {_csv(_R.depths)})")
    r.add_argument("--retrieval-keys", type=int, metavar="N", help=f"keys per cell (default {_R.keys})")
    r.add_argument("--generation", action="store_true", default=None, help="greedy generation agreement on prompts from the corpus")
    r.add_argument("--generation-prompts", type=int, metavar="N", help=f"prompts (default {_A.prompts}; implies --generation)")
    r.add_argument("--generation-context", type=int, metavar="N", help=f"context tokens per prompt (default {_A.context_tokens})")
    r.add_argument("--generation-tokens", type=int, metavar="N", help=f"tokens generated per prompt (default {_A.new_tokens})")
    u = p.add_argument_group("long context (RULER)", "RULER's synthetic tasks from a compressed or evicted cache")
    u.add_argument("--ruler", action="store_true", default=None, help="run the RULER-style suite on the schemes (and "
                   "the eviction peers at each scheme's bytes) instead of perplexity")
    u.add_argument("--ruler-lengths", metavar="N,N", help=f"prompt lengths in tokens (default {_csv(_U.lengths)}; "
                   "capped at the model's context; implies --ruler)")
    u.add_argument("--ruler-tasks", metavar="T,T", help=f"tasks, or 'all' (default {_csv(_U.tasks)}; all: "
                   f"{_csv(ALL_TASKS)})")
    u.add_argument("--ruler-samples", type=int, metavar="N", help=f"samples per task and length (default {_U.samples})")
    u.add_argument("--ruler-presses", metavar="P,P", help=f"eviction presses at each scheme's bytes, or 'none' "
                   f"(default {_csv(_U.presses)})")
    u.add_argument("--ruler-haystack", metavar="CORPUS", help="the text haystack's corpus (default: --corpus)")
    u.add_argument("--ruler-floors", action="store_true", default=None, help="also run the schemes on cells where "
                   "the exact cache is below the floor (a floor is not a result; by default only the exact cache "
                   "runs there)")
    return p


def ruler_config(args: argparse.Namespace) -> RulerConfig | None:
    """The RULER suite the flags ask for, None when none (ValueError names a bad setting)."""
    given = (args.ruler_lengths, args.ruler_tasks, args.ruler_samples, args.ruler_presses, args.ruler_haystack,
             args.ruler_floors)
    if not (args.ruler or (args.ruler is None and any(x is not None for x in given))):
        return None
    return RulerConfig.parse(args.ruler_tasks, args.ruler_lengths, args.ruler_samples, args.ruler_presses,
                             args.ruler_haystack or args.corpus, floors=args.ruler_floors)


def decoding_checks(args: argparse.Namespace) -> DecodingChecks:
    """The retrieval and agreement configurations the flags ask for (ValueError names a bad one)."""
    return DecodingChecks.from_parameters(args.retrieval, args.retrieval_lengths, args.retrieval_depths,
                                          args.retrieval_keys, args.generation, args.generation_prompts,
                                          args.generation_context, args.generation_tokens)


def check_output_path(path: str) -> None:
    """The --json path must be writable, tried now: its directory is created and a
    file written and removed there, so a run never ends unable to save its result."""
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(f"--json {path}: is a directory")
    for parent in [p.parent, *p.parent.parents]:
        if parent.exists() and not parent.is_dir():
            raise NotADirectoryError(f"--json {path}: {parent} is not a directory")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        probe = p.with_name(f".{p.name}.probe")
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise OSError(f"--json {path}: cannot write there ({e.strerror or e})") from None


def main(argv: list[str] | None = None) -> int:
    stop_on_sigterm()
    args = build_parser().parse_args(argv)
    if args.list_models:
        print(zoo.format_models(zoo.list_models()))
        return 0
    try:
        if (args.knob_format or args.boundary_check) and not args.knobs:
            raise ValueError("--knob-format and --boundary-check go with --engine vllm --knobs")
        if args.max_bits is not None and not args.knobs:
            raise ValueError("--max-bits bounds a --knobs search: it goes with --engine E --knobs")
        if args.max_bits is not None and not 0 < args.max_bits <= 32:
            raise ValueError(f"--max-bits {args.max_bits:g}: outside (0, 32]")
        if args.transfer and (args.lossless or args.bits or args.group_size or args.sparsity):
            raise ValueError("--transfer compares fixed schemes (each preset with and without +wire): drop --lossless, "
                             "--bits, --group-size and --sparsity")
        if args.knobs:
            return search_knobs(args)
        if args.peers is not None:
            if args.no_peers:
                raise ValueError("--peers and --no-peers: give one")
            if args.engine:
                raise ValueError("--peers and --engine: an engine's table holds its own options only (run the peers "
                                 "in a sweep of schemes)")
            peer_transforms(args.peers)  # an unknown name fails here, naming the choices
        specs = list(args.scheme or [])
        if args.schemes:
            specs += scheme_list(args.schemes)
        if args.engine:  # the engine's menu; a serving engine's verdict is a write-mode number
            specs += engine_schemes(args.engine)
            args.no_peers = True
        if args.transfer:  # a finished prefix's cache sent elsewhere: prefix mode
            specs += [s for s in transfer_schemes(engine_schemes(TRANSFER_ENGINE)) if s not in specs]
        args.mode = args.mode or (engine_mode(args.engine) if args.engine else "prefix")
        codecs = [resolve_codec(x, bits=args.bits, group_size=args.group_size, sparsity=args.sparsity,
                                lossless=args.lossless) for x in specs or [None]]
        codec = codecs[0]
        checks = decoding_checks(args)
        ruler = ruler_config(args)
        if ruler is not None:
            if args.quick_test:
                raise ValueError("--ruler needs a model: it does not run with --quick-test")
            if args.mode != "prefix":
                raise ValueError("--ruler runs in prefix mode only (the prompt's cache compressed once, as "
                                 "docs/ruler.md says): drop --mode write" + (" and --engine" if args.engine else ""))
            if args.json:
                check_output_path(args.json)
            r = run_ruler_suite(codecs, ruler, model=args.model, device="cpu" if args.cpu else None, dtype=args.dtype,
                                results=args.results, fresh=args.fresh, verbose=not args.quiet, ray=args.ray)
            print_ruler(r)
            if args.json:
                write_json(r.to_dict(), args.json)
            return 0
        if args.quick_test and (checks.retrieval or checks.agreement):
            raise ValueError("--retrieval and --generation need a model: they do not run with --quick-test")
        if args.json:
            check_output_path(args.json)
        if not args.quick_test:
            check_parameters(args.threshold, args.stride, args.max_windows, args.context_length)
        budgets = parse_budgets(args.budget)
        calibration = CalibrationConfig.from_string(args.calibration)
        if (budgets or args.sensitivity) and args.quick_test:
            raise ValueError("--budget and --sensitivity need a model: they do not run with --quick-test")
        if budgets and not specs:
            codecs = [resolve_codec(x) for x in similar_presets(budgets)]
        if args.engine and args.confirm_windows and args.confirm_windows < MIN_CI_UNITS:
            raise ValueError(f"--confirm-windows {args.confirm_windows}: a confirmation needs a CI, {MIN_CI_UNITS} "
                             f"windows or more (0: none)")
        if args.peers is not None and args.quick_test:
            raise ValueError("--peers runs transformers' caches beside the schemes on a model: it does not run with --quick-test")
        # --peers with one scheme asks for the peers beside it: a sweep of that one scheme and the peers
        if len(codecs) > 1 or budgets or args.sensitivity or args.peers is not None:
            sweep = run_sweep(codecs, model=args.model, corpus_name=args.corpus, device="cpu" if args.cpu else None,
                              dtype=args.dtype, threshold=args.threshold, stride=args.stride,
                              max_windows=args.max_windows, context_length=args.context_length,
                              peers=False if args.no_peers else (args.peers or True), verbose=not args.quiet,
                              checks=checks,
                              results=args.results, fresh=args.fresh, ray=args.ray, budget=budgets,
                              calibration=calibration, sensitivity=args.sensitivity, mode=args.mode,
                              calibrate_scales=args.calibrated_scales or bool(args.engine), transfer=args.transfer,
                              beside="prefix" if args.engine and args.mode == "write" else None)
            if args.engine and args.confirm_windows and sweep.engines:
                confirm_engine_answers(args, sweep, calibration)
            if args.json:
                sweep.to_json(args.json)
            if args.quiet:
                print(sweep.recommendation)
            return 0 if sweep.recommended else 1
        if args.quick_test:
            result = run_quick_test(verbose=not args.quiet, codec=codec)
        else:
            result = run_full_validation(
                device="cpu" if args.cpu else None, threshold=args.threshold, verbose=not args.quiet,
                model=args.model, corpus_name=args.corpus, codec=codec, stride=args.stride, max_windows=args.max_windows,
                dtype=args.dtype, context_length=args.context_length, checks=checks,
                results=args.results, fresh=args.fresh, ray=args.ray, mode=args.mode,
            )
        if args.json:
            result.to_json(args.json)
    except Exception as e:  # a clear one-line error and exit 2, not a traceback
        print(f"kv-validate: error: {type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if args.quiet:
        print(result.verdict)
    return 0 if result.passed else 1


def search_knobs(args: argparse.Namespace) -> int:
    """--engine E --knobs: the cheapest setting of E's knobs that passes robustly, in write mode
    (vllm: --knob-format X, the fewest layers skipped; --boundary-check: TurboQuant's fixed rule)."""
    if not args.engine or args.quick_test:
        raise ValueError("--knobs needs --engine (whose knobs) and a model (not --quick-test)")
    calibration = CalibrationConfig.from_string(args.calibration)
    read: list[tuple[int, int]] = []  # the evaluated corpus's tokens a ranking's calibration read

    def measure(spec_for: Any) -> Any:
        return format_sensitivity(spec_for, model=args.model, corpus_name=args.corpus, device="cpu" if args.cpu else None,
                                  dtype=args.dtype, stride=args.stride, max_windows=args.max_windows,
                                  context_length=args.context_length, results=args.results, fresh=args.fresh,
                                  calibration=calibration, verbose=not args.quiet, spans=read)

    knob = make_knob(args.engine, args.knob_format, measure)  # an unknown engine or format fails here
    if args.boundary_check and not getattr(knob, "boundary", 0):
        raise ValueError(f"--boundary-check: {args.knob_format} has no fixed rule (TurboQuant presets only)")
    if args.max_windows is not None and args.max_windows < MIN_CI_UNITS:
        raise ValueError(f"--knobs stops at the first robust pass, which needs a CI: give --max-windows "
                         f"{MIN_CI_UNITS} or more")
    if args.confirm_windows and not MIN_CI_UNITS <= args.confirm_windows:
        raise ValueError(f"--confirm-windows {args.confirm_windows}: a confirmation needs a CI, {MIN_CI_UNITS} windows "
                         f"or more (0: none)")
    if args.confirm_windows and args.max_windows is None:
        raise ValueError("--confirm-windows scores windows past the search's: give the search --max-windows "
                         "(or --confirm-windows 0)")
    check_parameters(args.threshold, args.stride, args.max_windows, args.context_length)
    if args.json:
        check_output_path(args.json)

    def sweep(specs: list[str]) -> Any:
        return run_sweep(specs, model=args.model, corpus_name=args.corpus, device="cpu" if args.cpu else None,
                         dtype=args.dtype, threshold=args.threshold, stride=args.stride, max_windows=args.max_windows,
                         context_length=args.context_length, peers=False, verbose=False, results=args.results,
                         fresh=args.fresh, ray=args.ray, mode="write")

    start: list[int] = []  # the first fresh window, found once the search's calibration is known

    def confirm(specs: list[str]) -> Any:
        if not start:
            start.append(fresh_windows(args, read))
        return run_sweep(specs, model=args.model, corpus_name=args.corpus, device="cpu" if args.cpu else None,
                         dtype=args.dtype, threshold=args.threshold, stride=args.stride,
                         max_windows=args.confirm_windows, first_window=start[0],
                         context_length=args.context_length, peers=False, verbose=False, results=args.results,
                         fresh=args.fresh, ray=args.ray, mode="write")

    say = (lambda *a, **k: None) if args.quiet else print
    bound = 16.0 if args.max_bits is None else args.max_bits
    found = cheapest_setting(args.engine, sweep, say=say, knob=knob, max_bits=bound,
                             confirm=confirm if args.confirm_windows else None)
    print_search(found)
    out = found.to_dict()
    if args.boundary_check:
        check = boundary_check(knob, sweep, say=say, searched=found, max_bits=bound,
                               confirm=confirm if args.confirm_windows else None)
        print_boundary_check(check)
        out["boundary_check"] = check.to_dict()
    if args.json:
        write_json(out, args.json)
    return 0 if found.cheapest else 1


def confirm_engine_answers(args: argparse.Namespace, sweep: Any, calibration: CalibrationConfig) -> None:
    """--engine: each engine's cheapest robust option re-validated on --confirm-windows fresh windows
    (past the sweep's and any tokens of the evaluated corpus its scale calibration read), as the knob
    search does; the tables' cheapest becomes the first that holds."""
    if args.max_windows is None:
        print("kv-validate: --engine: no confirmation on fresh windows (the sweep scored every window; "
              "give --max-windows, or --confirm-windows 0)")
        return
    run = prepare_run(RunParams(args.model, args.corpus, "cpu" if args.cpu else None, args.dtype, args.threshold,
                                args.stride, args.max_windows, args.context_length, args.results, args.fresh),
                      verbose=False)
    cal = calibration_tokens(calibration, run.text, run.ids, run.tokenizer, run.context_length, args.stride,
                             args.max_windows)
    read = [(s, s + run.context_length) for s in cal.starts] if cal.ids is run.ids else []
    first = fresh_windows(args, read)
    specs = {s.name: s.spec for s in sweep.schemes}

    def confirm(codecs: list[str]) -> Any:
        return run_sweep(codecs, model=args.model, corpus_name=args.corpus, device="cpu" if args.cpu else None,
                         dtype=args.dtype, threshold=args.threshold, stride=args.stride, max_windows=args.confirm_windows,
                         first_window=first, context_length=args.context_length, peers=False, verbose=False,
                         results=args.results, fresh=args.fresh, ray=args.ray, mode=sweep.mode)

    say = (lambda *a, **k: None) if args.quiet else print
    say(f"Confirming each engine's cheapest robust option on {args.confirm_windows} fresh windows from window {first}...")
    confirm_cheapest(sweep.engines, specs, confirm, say)
    if not args.quiet:
        print_engine_tables(sweep.engines)


def fresh_windows(args: argparse.Namespace, read: list[tuple[int, int]]) -> int:
    """The first of ``--confirm-windows`` fresh windows: past the search's ``--max-windows`` and the
    tokens its calibration read (``read``); ValueError when the corpus has too few left."""
    run = prepare_run(RunParams(args.model, args.corpus, "cpu" if args.cpu else None, args.dtype, args.threshold,
                                args.stride, None, args.context_length, args.results, args.fresh), verbose=False)
    plan = plan_windows(run.ids.shape[1], run.context_length, args.stride)
    first = first_fresh_window(plan, args.max_windows, read)
    if len(plan) - first < args.confirm_windows:
        raise ValueError(f"--confirm-windows {args.confirm_windows}: {run.text.name} has {len(plan) - first} windows "
                         f"left past the search's (from window {first} of {len(plan)}); ask for fewer")
    return first


if __name__ == "__main__":
    sys.exit(main())

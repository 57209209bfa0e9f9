"""The results store and resumable sweeps: units written atomically under content keys,
corrupt or mismatched files recomputed, a killed run resumed computing only what it had
not finished, an added scheme computing only its own units, a finished run loading no
model, and the merged JSON the same to the byte (timings aside) whichever way it was made."""

from __future__ import annotations

import json
import os

import pytest

from kvlib.models import sources as models
from kvlib.scoring.store import ResultsStore, StoreError, unit_key
from kvlib.runs.sweep import run_sweep

TIMING = ("seconds", "codec_time_ms", "processing_time_ms", "transform_seconds")


def sweep(tiny_dir, store, schemes=("int4", "kivi2"), **kw):
    """Three windows of 256 at stride 128 on the tiny model (two with a compressed context): two schemes,
    six units (a window of a scheme each)."""
    kw = {"context_length": 256, **kw}
    return run_sweep(list(schemes), model=str(tiny_dir / "model"), corpus_name=str(tiny_dir / "corpus.txt"),
                     device="cpu", stride=128, max_windows=3, peers=False, verbose=False, results=store, **kw)


def numbers(result) -> str:
    """The result's JSON without what measures time."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in TIMING and k != "timing"}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return json.dumps(strip(result.to_dict()), sort_keys=True)


def test_put_get_and_what_is_not_trusted(tmp_path, capsys):
    store = ResultsStore.open(tmp_path / "r")
    ident = {"unit": "scheme", "window": [1, 0, 512, 128], "scheme": "int4"}
    key = store.put(ident, {"x": 1.5, "y": float("nan")})
    assert key == unit_key(ident) and store.get(key)["x"] == 1.5 and len(store) == 1
    assert unit_key({**ident, "scheme": "int8"}) != key  # anything in the identity changes the key
    p = store.path(key)
    p.write_text(p.read_text()[:20])  # truncated
    assert store.get(key) is None and "not valid JSON" in capsys.readouterr().err
    p.write_text(json.dumps({"key": key, "identity": {**ident, "scheme": "int8"}, "x": 2}))  # content not its name
    assert store.get(key) is None and "does not hash to its name" in capsys.readouterr().err
    store.put(ident, {"x": 3})
    assert store.get(key)["x"] == 3 and ResultsStore.open(tmp_path / "r", fresh=True).get(key) is None
    assert not list(p.parent.glob("*.tmp"))


def test_a_store_that_cannot_be_written_fails_before_the_model_loads(tiny_dir, tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setattr(models, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("loaded the model"))
    try:
        if os.access(ro, os.W_OK):  # root writes anywhere: a file where the directory should be
            ro = tmp_path / "file"
            ro.write_text("")
        with pytest.raises(StoreError, match=f"results directory {ro}"):
            sweep(tiny_dir, ro)
    finally:
        (tmp_path / "ro").chmod(0o700)


def test_resume_add_a_scheme_and_a_finished_run(tiny_dir, tmp_path, monkeypatch):
    whole = sweep(tiny_dir, tmp_path / "whole")
    assert whole.timing["units_computed"] == 6 and whole.timing["units_reused"] == 0

    # A run killed after two windows keeps them; the rerun computes the third.
    from kvlib.scoring import units

    record, calls = units.ScoringPlan.record, []

    def dying(self, store, index, outcomes):
        record(self, store, index, outcomes)
        calls.append(index)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(units.ScoringPlan, "record", dying)
    with pytest.raises(KeyboardInterrupt):
        sweep(tiny_dir, tmp_path / "killed")
    monkeypatch.setattr(units.ScoringPlan, "record", record)
    resumed = sweep(tiny_dir, tmp_path / "killed")
    assert resumed.timing["units_computed"] == 2 and resumed.timing["units_reused"] == 4
    assert numbers(resumed) == numbers(whole)

    # An added scheme: only its own three units.
    more = sweep(tiny_dir, tmp_path / "killed", schemes=("int4", "kivi2", "q8_0"))
    assert more.timing["units_computed"] == 3 and more.timing["units_reused"] == 6
    assert numbers(more) == numbers(sweep(tiny_dir, tmp_path / "fresh3", schemes=("int4", "kivi2", "q8_0")))

    # Everything done: no model loads, the same numbers.
    monkeypatch.setattr(models, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("loaded the model"))
    again = sweep(tiny_dir, tmp_path / "killed")
    assert again.timing["units_computed"] == 0 and again.timing["model_load_s"] == 0
    assert numbers(again) == numbers(whole)


def test_fresh_and_corrupt_units_are_recomputed(tiny_dir, tmp_path, capsys):
    first = sweep(tiny_dir, tmp_path / "s")
    files = sorted((tmp_path / "s").glob("??/*.json"))
    victim = next(f for f in files if '"unit": "scheme"' in f.read_text())
    victim.write_text(victim.read_text()[:-40])
    again = sweep(tiny_dir, tmp_path / "s")
    assert again.timing["units_computed"] == 1 and "recomputing that unit" in capsys.readouterr().err
    assert numbers(again) == numbers(first)
    assert sweep(tiny_dir, tmp_path / "s", fresh=True).timing["units_computed"] == 6


def test_keys_follow_what_the_numbers_depend_on(tiny_dir, tmp_path):
    """Another stride, another corpus or another dtype: new units, none reused."""
    sweep(tiny_dir, tmp_path / "s")
    assert run_sweep(["int4", "kivi2"], model=str(tiny_dir / "model"), corpus_name=str(tiny_dir / "corpus.txt"),
                     device="cpu", stride=256, max_windows=3, peers=False, verbose=False,
                     results=tmp_path / "s").timing["units_reused"] == 0
    assert sweep(tiny_dir, tmp_path / "s", dtype="bfloat16").timing["units_reused"] == 0


def test_two_writers_of_one_key_never_show_a_partial_file(tmp_path, capsys):
    """Writers race on one key (as two runs sharing a store would) while a reader reads it:
    every read is a whole, trusted unit."""
    from concurrent.futures import ThreadPoolExecutor

    a, b = ResultsStore.open(tmp_path), ResultsStore.open(tmp_path)
    ident = {"unit": "scheme", "window": [3, 0, 2048, 512], "scheme": "kivi4"}
    key = a.put(ident, {"kld": [0.1] * 5000})

    def write(store):
        for i in range(40):
            store.put(ident, {"kld": [0.1] * 5000, "seconds": float(i)})

    def read():
        return [a.get(key) is not None for _ in range(200)]

    with ThreadPoolExecutor(3) as pool:
        futs = [pool.submit(write, a), pool.submit(write, b), pool.submit(read)]
        seen = futs[2].result()
        [f.result() for f in futs[:2]]
    assert all(seen) and "warning" not in capsys.readouterr().err
    assert not list(tmp_path.glob("??/*.tmp"))


def test_a_finished_run_with_decoding_checks_loads_no_model(tiny_dir, tmp_path, monkeypatch):
    from kvlib.checks.agreement import AgreementConfig
    from kvlib.checks.decoding import DecodingChecks

    checks = DecodingChecks(agreement=AgreementConfig(prompts=2, context_tokens=64, new_tokens=3))
    first = sweep(tiny_dir, tmp_path / "s", checks=checks)
    assert first.agreement and first.timing["model_load_s"] > 0
    monkeypatch.setattr(models, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("loaded the model"))
    again = sweep(tiny_dir, tmp_path / "s", checks=checks)
    assert again.timing["units_computed"] == 0 and numbers(again) == numbers(first)

"""What a user types: scheme lists with commas or ';', a check turned off whatever its settings, the
shipped WikiText-2 corpus, and the CLI's promises (a validation names its store)."""

from __future__ import annotations

import pytest

from kvlib.checks.agreement import AgreementConfig
from kvlib.checks.decoding import DecodingChecks
from kvlib.cli import build_parser, decoding_checks
from kvlib.codec.spec import resolve_codec, split_schemes
from kvlib.models.corpus import BUNDLED, load_corpus


@pytest.mark.parametrize("text, want", [
    ("int4,kivi4", ["int4", "kivi4"]),
    ("int4;k=asym4/g64/channel,v=q8_0", ["int4", "k=asym4/g64/channel,v=q8_0"]),
    ("int4,kivi4,k=asym4/g64/channel,v=q8_0", ["int4", "kivi4", "k=asym4/g64/channel,v=q8_0"]),
    ("int4,k3=q4_0,v0-5=rot4,q8_0", ["int4,k3=q4_0,v0-5=rot4", "q8_0"]),
    ("k=sym4/g64,v=q8_0+lossless,int4", ["k=sym4/g64,v=q8_0+lossless", "int4"]),
    ("k=asym4/g64/channel,v=asym4/g64,k3=q8_0,int8", ["k=asym4/g64/channel,v=asym4/g64,k3=q8_0", "int8"]),
    (" ; int4 ;; ", ["int4"]),
])
def test_scheme_lists_split_as_users_write_them(text, want, cli):
    got = split_schemes(text)
    assert got == want
    for spec in got:
        resolve_codec(spec)  # every piece is a spec the CLI accepts


def test_cli_takes_a_two_role_spec_in_schemes(cli):
    args = build_parser().parse_args(["--schemes", "int4,k=asym4/g64/channel,v=q8_0"])
    assert split_schemes(args.schemes) == ["int4", "k=asym4/g64/channel,v=q8_0"]


def test_a_check_turned_off_stays_off_whatever_its_settings():
    """make sweep RETRIEVAL=False passes retrieval=False with the notebook's default lengths."""
    assert DecodingChecks.from_parameters(False, "1024,2048").retrieval is None
    assert DecodingChecks.from_parameters(None, "1024,2048").retrieval is not None  # a setting implies it
    assert DecodingChecks.from_parameters(True).retrieval is not None
    assert DecodingChecks.from_parameters(generation=False, generation_prompts=3).agreement is None
    assert DecodingChecks.from_parameters(generation_prompts=3).agreement == AgreementConfig(prompts=3)


def test_cli_flags_imply_their_check():
    args = build_parser().parse_args(["--retrieval-lengths", "256"])
    assert decoding_checks(args).retrieval is not None and decoding_checks(args).agreement is None


def test_the_shipped_wikitext_is_real_text_offline():
    c = load_corpus("wikitext-2-valid")
    assert c.name == BUNDLED["wikitext-2-valid"][1]
    assert len(c.text) > 1_000_000 and " = Homarus gammarus = " in c.text[:200] and "<unk>" in c.text


def test_a_finished_validation_loads_no_model(tmp_path, monkeypatch, capsys, cli):
    """The README's promise for every run, single-scheme validations included: the second run reads
    its units (windows, geometry, the sample round trip) and never loads the model."""
    from kvlib.models import sources
    from kvlib.runs.validate import run_full_validation

    kw = dict(codec="int4", max_windows=2, context_length=256, stride=128, results=tmp_path / "store",
              workdir=tmp_path / "w", verbose=True, progress=False)
    first = run_full_validation(**kw)
    assert first.timing["model_load_s"] > 0
    assert f"Results store: {tmp_path / 'store'}" in capsys.readouterr().out
    monkeypatch.setattr(sources, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("loaded the model"))
    again = run_full_validation(**kw)
    assert again.timing["model_load_s"] == 0 and again.timing["units_computed"] == 0
    assert (again.context_delta, again.kld_mean, again.compression) == (first.context_delta, first.kld_mean,
                                                                        first.compression)
    with pytest.raises(pytest.fail.Exception):  # the guard is live: a fresh run must load the model
        run_full_validation(**{**kw, "fresh": True})


def test_ray_reaches_a_single_scheme_validation(monkeypatch, cli):
    """--ray ran a single-scheme validation serially, silently; now it reaches run_full_validation
    (which hands its missing windows to the same executor as a sweep)."""
    import kvlib.cli as cli_module

    seen = {}

    def fake(**kw):
        seen.update(kw)
        raise SystemExit(0)

    monkeypatch.setattr(cli_module, "run_full_validation", fake)
    with pytest.raises(SystemExit):
        cli_module.main(["--scheme", "int4", "--ray", "ray://head:10001"])
    assert seen["ray"] == "ray://head:10001"

"""CodecConfig: a hashable value that round-trips to the CLI's spec string,
with every rule (presets, grammar, bounds) taken from kv-compress itself."""

from __future__ import annotations

import json
from dataclasses import asdict
import subprocess

import pytest

from kvlib.codec.spec import CodecConfig, Scheme, SchemeError, presets, resolve_codec

PRESETS = ["int4", "int8", "asym4", "kivi4", "kivi2", "rot4", "rot3", "lm2rot", "lm3rot", "lm4rot", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]


def test_presets_are_the_issue_table(cli):
    p = presets()
    assert list(p) == PRESETS
    assert p["int4"] == CodecConfig(Scheme("sym", 4, 64), Scheme("sym", 4, 64))
    assert p["kivi4"] == CodecConfig(Scheme("asym", 4, 64, "channel"), Scheme("asym", 4, 64))
    assert p["kivi2"] == CodecConfig(Scheme("asym", 2, 32, "channel"), Scheme("asym", 2, 32))
    assert p["rot4"].key == Scheme("sym", 4, 64, rotate=True) == p["rot4"].value
    assert p["q5_1"].key == Scheme("q5_1", 5, 32)


@pytest.mark.parametrize("spec", PRESETS + [
    "k=asym4/g64/channel,v=asym4/g64", "asym3/g16/rot/out0.01/res128/sp0.25", "k=kivi2,v=q8_0",
    "sym8/g32/channel/res7", "k=int4/out1e-05,v=rot4", "int4+lossless", "k=asym4/g64/channel,v=q8_0+lossless", '{"key": {"method": "q4_0", "bits": 4, "group": 32, "axis": "token"},'
    ' "value": {"method": "asym", "bits": 2, "group": 8, "axis": "channel"}}',
    "symf3/g32/rot", "lm4/g128", "lm3rot,k0-1=q8_0,v0=lm4rot", "kivi2,kv3-5=int8,k4=q8_0+lossless",
    "k=lm3rot,v=lm2rot,v0-29=lm3rot", "int4+wire", "kivi2,kv3-5=int8+wire",
])
def test_spec_round_trips_through_the_cli(spec, cli):
    c = resolve_codec(spec)
    cli_spec = json.loads(subprocess.run([cli, "check", "-scheme", spec], capture_output=True, text=True, check=True).stdout)
    assert c.spec == cli_spec["scheme"]  # Python's canonical spelling is the CLI's
    assert resolve_codec(c.spec) == c
    assert {c: 1}[resolve_codec(c.spec)] == 1  # hashable: keys a sweep
    assert c.name == cli_spec["name"]


def test_legacy_flags_override_both_roles():
    c = resolve_codec("kivi4", bits=3, group_size=16)
    assert c.key == Scheme("asym", 3, 16, "channel") and c.value == Scheme("asym", 3, 16)
    assert resolve_codec(None, bits=8) == presets()["int8"]


@pytest.mark.parametrize("spec, words", [
    ("int5", "unknown scheme"), ("sym9", "bits 9"), ("sym4/g63", "group size 63"), ("asym4/channel/rot", "rotation"),
    ("sym4/out1.5", "outlier fraction 1.5"), ("k=int4", "both k= and v="), ("q4_0/g64", "q4_0 is 4-bit blocks"),
    ("sym4/gNaN", "option"), ("sym4/g1152921504606846976", "option"),
    ("lm5", "bits 5"), ("int4,k3=lm9", "layer 3 key scheme"), ("int4,k3-1=int8", "out of order"),
])
def test_bad_specs_fail_with_the_clis_line(spec, words):
    with pytest.raises(SchemeError, match=words):
        resolve_codec(spec)


def test_layer_overrides_resolve_per_slot():
    c = resolve_codec("lm3rot,k0-1=q8_0,v0=lm4rot")
    assert c.scheme_for(0, "key").method == "q8_0" == c.scheme_for(1, "key").method
    assert c.scheme_for(2, "key") == c.key and c.scheme_for(0, "value").bits == 4
    assert c != resolve_codec("lm3rot") and c.to_dict()["layers"][0] == {"layer": 0, "role": "key",
                                                                       "scheme": asdict(c.scheme_for(0, "key"))}


def test_lossless_stage_is_part_of_the_value():
    plain, coded = resolve_codec("kivi4"), resolve_codec("kivi4", lossless=True)
    assert coded == resolve_codec("kivi4+lossless") and coded != plain and coded.key == plain.key
    assert coded.spec == plain.spec + "+lossless" and coded.name == "kivi4+lossless"
    assert CodecConfig(plain.key, plain.value, lossless=True) == coded


def test_wire_stage_is_part_of_the_value():
    """+wire is the other entropy stage: in the value, its spec and its name; never both stages."""
    plain, wired = resolve_codec("kivi4"), resolve_codec("kivi4+wire")
    assert wired.wire and not wired.lossless and wired != plain and wired.key == plain.key
    assert wired.spec == plain.spec + "+wire" and wired.name == "kivi4+wire"
    assert CodecConfig(plain.key, plain.value, wire=True) == wired
    with pytest.raises(SchemeError, match="two entropy stages"):
        resolve_codec("kivi4+wire", lossless=True)


def test_ggml_rejects_bits_override():
    with pytest.raises(SchemeError, match="do not apply to q4_0"):
        resolve_codec("q4_0", bits=4)

"""Head overrides (``k3h1=SCHEME``): kv-compress stores a slot's tensor a head at a time, so the head's
reconstruction is exactly what its scheme gives the whole tensor, and the other heads are the slot's own,
through kvlib's transforms in prefix mode (a cache saved, compressed and read back) and in write mode (one
layer at a time)."""

from __future__ import annotations

import pytest
import torch

from kvlib.cache.layout import cache_layers, make_cache
from kvlib.codec.spec import HeadScheme, resolve_codec, split_schemes
from kvlib.transforms.codec import cache_transforms

SPEC = "int4,k1h2=q8_0,v0h0=lm2rot"


def _cache(seed: int = 0) -> object:
    g = torch.Generator().manual_seed(seed)
    return make_cache([(torch.randn(1, 3, 40, 64, generator=g), torch.randn(1, 3, 40, 64, generator=g)) for _ in range(2)])


def test_head_overrides_parse_and_print_as_kv_compress_does():
    c = resolve_codec("int4,k1h2=int8,k0h2=int8,k0h0=rot3,v3h1=lm2rot+wire")
    assert c.spec == "sym4/g64,k0h0=symf3/g64/rot,k0-1h2=sym8/g64,v3h1=lm2/g64/rot+wire"
    assert resolve_codec(c.spec) == c and c.heads[0] == HeadScheme(0, "key", 0, resolve_codec("rot3").key)
    assert [h.layer for h in c.for_layer(0).heads] == [0, 0] and not c.for_layer(5).heads
    assert c.for_layer(3).spec == "sym4/g64,v3h1=lm2/g64/rot+wire"
    assert split_schemes("int4,k3h1=int8,kivi4") == ["int4,k3h1=int8", "kivi4"]
    with pytest.raises(ValueError, match="engine's format"):
        resolve_codec("int4,k0h1=llama.cpp:q4_0")
    with pytest.raises(ValueError, match="per-head overrides"):
        from kvlib.budget.sensitivity import resolve_candidates

        resolve_candidates(("int4,k0h1=int8",))


@pytest.mark.parametrize("mode", ["prefix", "write"])
def test_a_head_takes_its_schemes_reconstruction(tmp_path, cli, mode):
    codecs = [resolve_codec(s) for s in (SPEC, "int4", "q8_0", "lm2rot")]
    ts, _ = cache_transforms(codecs, tmp_path, "t", mode=mode, architecture="llama")
    cache = _cache()
    if mode == "prefix":
        out = {c.name: cache_layers(ts[c.name](cache)[0]) for c in codecs}
    else:
        exact = cache_layers(cache)
        out = {c.name: [ts[c.name].roundtrip_layer(i, k, v)[:2] for i, (k, v) in enumerate(exact)] for c in codecs}
    mixed, int4, q8, lm2 = (out[c.name] for c in codecs)
    for layer, role, want in ((1, 0, [int4, int4, q8]), (0, 1, [lm2, int4, int4]), (0, 0, [int4] * 3), (1, 1, [int4] * 3)):
        for h, src in enumerate(want):
            assert torch.equal(mixed[layer][role][:, h], src[layer][role][:, h]), (mode, layer, role, h)
    if mode == "prefix":  # the report pools the split tensor as one, its bytes its heads' together
        _, m = ts[codecs[0].name](cache)
        names = [t["name"] for t in m.tensors]
        assert names == ["layer_0_key", "layer_0_value", "layer_1_key", "layer_1_value"]
        row = m.tensors[2]
        assert row["scheme"] == "h0=sym4/g64|h1=sym4/g64|h2=q8_0" and len(row["head_sums"]) == 3


def test_a_boundary_layer_the_spec_overrides_keeps_its_head_overrides_in_write_mode(tmp_path, cli):
    """vLLM keeps a TurboQuant cache's first and last layers exact; a slot there that the spec overrides
    keeps the user's scheme, head overrides included, as kv-compress stores the whole cache; a slot the
    engine keeps exact is exact whole."""
    spec = "k=vllm:turboquant_k8,v=int4,k0=int4,k0h1=int8,v0h1=int8"
    codecs = [resolve_codec(s) for s in (spec, "int4", "int8")]
    ts, _ = cache_transforms(codecs, tmp_path, "t", mode="write", architecture="llama")
    for t in ts.values():
        if hasattr(t, "set_num_layers"):
            t.set_num_layers(6)
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(1, 3, 24, 64, generator=g), torch.randn(1, 3, 24, 64, generator=g)
    mk, mv, _ = ts[codecs[0].name].roundtrip_layer(0, k, v)
    ik, _, _ = ts["int4"].roundtrip_layer(0, k, v)
    ek, _, _ = ts["int8"].roundtrip_layer(0, k, v)
    assert torch.equal(mk[:, 0], ik[:, 0]) and torch.equal(mk[:, 1], ek[:, 1]) and torch.equal(mk[:, 2], ik[:, 2])
    assert torch.equal(mv, v)  # the values' slot is the engine's to keep exact: its head override goes with it


def test_heads_on_refuses_an_engines_format_up_front():
    from kvlib.budget.sensitivity import CalibrationConfig

    with pytest.raises(ValueError, match="heads=on allots a scheme per KV head"):
        CalibrationConfig.from_string("candidates=lm2rot|llama.cpp:q8_0;heads=on")
    assert CalibrationConfig.from_string("candidates=lm2rot|llama.cpp:q8_0").candidates[1] == "llama.cpp:q8_0"

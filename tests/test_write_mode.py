"""Write mode: every K and V through the codec as each layer writes it, inside one forward; the
same codec (server or file CLI) as prefix mode, units keyed by mode, every window gated."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvlib.cache.io import layer_metadata
from kvlib.codec.cli import roundtrip_kv_cache
from kvlib.codec.server import CodecServer, SharedContext
from kvlib.codec.spec import engine_menu, resolve_codec
from kvlib.runs.sweep import check_engine_modes, run_sweep
from kvlib.scoring.perplexity import score_windows
from kvlib.scoring.write import write_cache
from kvlib.transforms.base import CacheTransform
from kvlib.transforms.codec import CLICacheRoundtrip, ServerCacheRoundtrip


class Identity(CacheTransform):
    name, spec = "identity", "identity"

    def roundtrip_layer(self, layer, key, value):
        return key, value, None


def _ids(n: int = 300) -> torch.Tensor:
    return torch.randint(3, 64, (1, n), generator=torch.Generator().manual_seed(1))


def test_identity_writes_reproduce_the_exact_forward(tiny_llama):
    r = score_windows(tiny_llama, _ids(), 128, 64, {"id": Identity()}, max_windows=3, progress=False, mode="write")["id"]
    assert all(w.compressed for w in r.windows)  # window 0 too: its tokens attend to written K/V
    assert [w.compressed_nll for w in r.windows] == [w.baseline_nll for w in r.windows]
    assert all(k == 0.0 for w in r.windows for k in w.kld) and sum(w.top1_agree for w in r.windows) == r.scored_tokens


def test_server_and_file_cli_write_the_same_bits(tiny_llama, tmp_path, cli):
    codec = resolve_codec("int4")
    with CodecServer() as srv:
        ts = {"server": ServerCacheRoundtrip(srv, codec, "tiny", context=SharedContext("tiny")),
              "cli": CLICacheRoundtrip(tmp_path, codec, "tiny")}
        r = score_windows(tiny_llama, _ids(), 128, 64, ts, max_windows=3, progress=False, mode="write")
    assert [w.compressed_nll for w in r["server"].windows] == [w.compressed_nll for w in r["cli"].windows]
    assert r["server"].compression.to_dict()["sums"] == r["cli"].compression.to_dict()["sums"]
    assert r["server"].compressed_perplexity != r["server"].baseline_perplexity  # int4 changes something
    # 22 layers x K, V per window, every token of the window counted
    assert r["cli"].compression.num_elements == 3 * 22 * 2 * 4 * 64 * 128


def test_the_first_layer_is_written_as_the_codec_reconstructs_it(tiny_llama, tmp_path, cli):
    """Layer 0's input is exact in either mode, so what write mode hands attention there is
    kv-compress's reconstruction of the exact K and V: checked through a file of its own."""
    ids = _ids(100)
    exact = tiny_llama(input_ids=ids, use_cache=True).past_key_values
    k0, v0 = exact.layers[0].keys, exact.layers[0].values
    save_file({"layer_0_key": k0.contiguous(), "layer_0_value": v0.contiguous()}, str(tmp_path / "l0.safetensors"),
              metadata=layer_metadata(0, k0, "tiny"))
    roundtrip_kv_cache(tmp_path / "l0.safetensors", tmp_path / "l0.out.safetensors", codec="q4_0")
    want = load_file(str(tmp_path / "l0.out.safetensors"))
    seen = {}

    class Spy(CLICacheRoundtrip):
        def roundtrip_layer(self, layer, key, value):
            k, v, m = super().roundtrip_layer(layer, key, value)
            seen.setdefault(layer, (k, v))
            return k, v, m

    sink: list = []
    tiny_llama(input_ids=ids, past_key_values=write_cache(tiny_llama, Spy(tmp_path / "w", resolve_codec("q4_0"), "tiny"),
                                                           sink), use_cache=True)
    assert torch.equal(seen[0][0], want["layer_0_key"]) and torch.equal(seen[0][1], want["layer_0_value"])
    assert len(sink) == 22 and not torch.equal(seen[0][0], k0)


def test_units_are_keyed_by_mode_and_results_record_it(tiny_dir, tmp_path, cli):
    kw = dict(model=str(tiny_dir / "model"), corpus_name=str(tiny_dir / "corpus.txt"), context_length=128, stride=64,
              max_windows=3, peers=False, verbose=False, progress=False, results=tmp_path / "store")
    prefix = run_sweep(["int4"], **kw)
    write = run_sweep(["int4"], mode="write", **kw)
    assert write.timing["units_computed"] == 3  # none of the prefix units serves write mode
    assert (prefix.mode, write.mode) == ("prefix", "write") and write.scheme("int4").mode == "write"
    assert write.context_windows == 3 and prefix.context_windows == 2  # write mode gates every window
    assert write.scheme("int4").context_delta != prefix.scheme("int4").context_delta
    again = run_sweep(["int4"], mode="write", **kw)
    assert again.timing["units_computed"] == 0 and again.scheme("int4").context_delta == write.scheme("int4").context_delta


def test_engine_channel_order_is_llamacpps(tmp_path, cli):
    """GGUF's interleaved pairs: position p holds HF channel (p % 2) * D/2 + p // 2 (convert_hf_to_gguf's
    permute), and a round trip through the engine's order with the identity scheme is exact."""
    from kvlib.transforms.engine import EngineWrite, gguf_order

    assert gguf_order(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    hf = torch.arange(64.0)
    assert hf[gguf_order(64)].reshape(-1, 2)[:, 1].tolist() == list(range(32, 64))
    t = EngineWrite(CLICacheRoundtrip(tmp_path, resolve_codec("none"), "tiny"), None, permuted=True)
    k, v = torch.randn(1, 2, 5, 64), torch.randn(1, 2, 5, 64)
    k2, v2, _ = t.roundtrip_layer(0, k, v)
    assert torch.equal(k2, k) and torch.equal(v2, v)


def test_engine_queries_are_converted_as_llamacpp_does(tmp_path, cli):
    """f16 K: Q rounded to f16; a quantized K: Q through q8_0, rotated as K (its rotation on by default)."""
    from kvlib.transforms.engine import EngineWrite, query_codec

    assert query_codec(resolve_codec("llama.cpp:f16").key).spec == "k=llama.cpp:f16,v=none"
    assert query_codec(resolve_codec("llama.cpp:q4_0").key).spec == "k=llama.cpp:q8_0,v=none"
    assert query_codec(resolve_codec("llama.cpp:q4_0/norot").key).spec == "k=llama.cpp:q8_0/norot,v=none"
    q = torch.randn(1, 4, 7, 64)
    f16 = EngineWrite(CLICacheRoundtrip(tmp_path / "a", resolve_codec("llama.cpp:f16"), "t"),
                      CLICacheRoundtrip(tmp_path / "b", query_codec(resolve_codec("llama.cpp:f16").key), "t"), False)
    assert torch.equal(f16.query_layer(0, q), q.half().float())
    q8 = CLICacheRoundtrip(tmp_path / "c", query_codec(resolve_codec("llama.cpp:q4_0/norot").key), "t")
    conv = EngineWrite(CLICacheRoundtrip(tmp_path / "d", resolve_codec("llama.cpp:q4_0/norot"), "t"), q8, False)
    got = conv.query_layer(0, q)
    blocks = q.reshape(1, 4, 7, 2, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    assert torch.allclose(got, (torch.round(blocks / d) * d.half().float()).reshape(q.shape), atol=1e-6)


def test_written_forward_converts_queries_only_inside(tiny_llama, tmp_path, cli):
    from kvlib.transforms.engine import EngineWrite, query_codec

    ids = _ids(100)
    t = EngineWrite(CLICacheRoundtrip(tmp_path / "k", resolve_codec("llama.cpp:q8_0/norot"), "t"),
                    CLICacheRoundtrip(tmp_path / "q", query_codec(resolve_codec("llama.cpp:q8_0/norot").key), "t"),
                    False)
    plain = CLICacheRoundtrip(tmp_path / "p", resolve_codec("llama.cpp:q8_0/norot"), "t")
    r = score_windows(tiny_llama, ids, 64, 32, {"engine": t, "plain": plain}, max_windows=2, progress=False,
                      mode="write")
    assert r["engine"].compressed_perplexity != r["plain"].compressed_perplexity  # Q converted in one only
    assert r["engine"].baseline_perplexity == r["plain"].baseline_perplexity  # the exact forward untouched
    assert tiny_llama.config._attn_implementation != "kvlib_write"


def test_vllm_fp8_queries_are_e4m3_at_scale_one(tmp_path, cli):
    """vLLM's FlashAttention quantizes Q to e4m3 with q_scale 1.0 for an fp8 K (clamped to +-448);
    e5m2 and the per-token-head formats leave Q exact."""
    from kvlib.transforms.engine import EngineWrite, query_codec

    for spec in ("vllm:fp8", "vllm:fp8_e4m3/scale0.5"):
        assert query_codec(resolve_codec(spec).key).spec == "k=vllm:fp8_e4m3,v=none"
    for spec in ("vllm:fp8_e5m2", "vllm:int8_per_token_head", "vllm:fp8_per_token_head", "int4"):
        assert query_codec(resolve_codec(spec).key) is None
    q = torch.randn(1, 4, 7, 64) * 100
    t = EngineWrite(CLICacheRoundtrip(tmp_path / "k", resolve_codec("vllm:fp8"), "t"),
                    CLICacheRoundtrip(tmp_path / "q", query_codec(resolve_codec("vllm:fp8").key), "t"), False)
    assert torch.equal(t.query_layer(0, q), q.clamp(-448, 448).to(torch.float8_e4m3fn).float())


def test_write_mode_sweeps_take_the_engine_write_path(tmp_path, cli):
    """In write mode an engine format comes with its engine's write path, and its units are keyed by
    it; prefix mode and kvlib's own schemes are unchanged."""
    from kvlib.transforms.codec import cache_transforms
    from kvlib.transforms.engine import EngineWrite, write_path, write_path_key

    codecs = [resolve_codec(s) for s in ("llama.cpp:q4_0", "vllm:fp8", "vllm:int8_per_token_head", "int4")]
    ts, _ = cache_transforms(codecs, tmp_path, "t", mode="write", architecture="llama")
    kinds = {name: type(t) is EngineWrite for name, t in ts.items()}
    assert kinds == {"llama.cpp:q4_0": True, "vllm:fp8": True, "vllm:int8_per_token_head": False, "int4": False}
    assert ts["llama.cpp:q4_0"].permuted and not ts["vllm:fp8"].permuted
    assert ts["vllm:fp8"].key == "vllm:fp8" + write_path_key(*write_path(codecs[1], "llama"))
    assert "channel order gguf" in ts["llama.cpp:q4_0"].key and "query k=vllm:fp8_e4m3,v=none" in ts["vllm:fp8"].key
    ts, _ = cache_transforms(codecs, tmp_path / "p", "t", mode="prefix", architecture="llama")
    assert not any(type(t) is EngineWrite for t in ts.values())


def test_engine_flag_sweeps_the_menu_in_write_mode(monkeypatch):
    import kvlib.cli as cli_module

    seen = {}

    def fake(codecs, **kw):
        seen.update(kw, codecs=[c.name for c in codecs])
        raise SystemExit(0)

    monkeypatch.setattr(cli_module, "run_sweep", fake)
    with pytest.raises(SystemExit):
        cli_module.main(["--engine", "vllm"])
    assert seen["codecs"] == [r["name"] for r in engine_menu("vllm")]
    assert seen["codecs"][:3] == ["vllm:fp8", "vllm:fp8_e4m3", "vllm:fp8_e5m2"] and "vllm:nvfp4" in seen["codecs"]
    assert seen["mode"] == "write" and seen["peers"] is False
    with pytest.raises(SystemExit):
        cli_module.main(["--engine", "llama.cpp", "--mode", "prefix"])
    assert seen["mode"] == "prefix" and len(seen["codecs"]) == 7
    # LMCache's serdes store a finished prefix: measured in prefix mode, never in write mode, and not
    # among the serving engines of --engine all
    with pytest.raises(SystemExit):
        cli_module.main(["--engine", "lmcache"])
    assert seen["mode"] == "prefix" and seen["codecs"] == ["lmcache:fp8", "lmcache:kivi", "lmcache:cachegen"]
    with pytest.raises(SystemExit):
        cli_module.main(["--engine", "all"])
    assert seen["mode"] == "write" and not any(c.startswith("lmcache:") for c in seen["codecs"])


def test_a_kv_sharing_serde_is_refused_in_write_mode(capsys):
    from kvlib import cli

    assert cli.main(["--engine", "lmcache", "--mode", "write", "--max-windows", "2"]) == 2
    assert "lmcache:fp8 is a serde of a stored prefix" in capsys.readouterr().err
    with pytest.raises(ValueError, match="lmcache:cachegen is a serde of a stored prefix"):
        check_engine_modes([resolve_codec("k=lmcache:cachegen,v=q8_0")], "write")
    check_engine_modes([resolve_codec("lmcache:cachegen")], "prefix")
    assert cli.main(["--scheme", "lmcache:cachegen", "--mode", "write", "--max-windows", "2"]) == 2  # one scheme too
    assert "lmcache:cachegen is a serde of a stored prefix" in capsys.readouterr().err


def test_turboquant_boundary_layers_keep_the_users_overrides_and_exact_queries(tmp_path, cli):
    """In write mode a TurboQuant boundary layer goes through none, but a slot the spec overrides
    keeps the user's scheme (as kv-compress does for a whole cache), and Q is left exact there."""
    from kvlib.transforms.engine import engine_write

    def make(codec):
        return CLICacheRoundtrip(tmp_path / codec.spec.replace("/", "_").replace(",", "_"), codec, "t")

    t = engine_write(make(resolve_codec("k=vllm:fp8_e4m3,v=vllm:turboquant_v4,k0=int4")), make, "llama")
    t.set_num_layers(6)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 2, 8, 64, generator=g), torch.randn(1, 2, 8, 64, generator=g)
    k0, v0, _ = t.roundtrip_layer(0, k, v)
    assert torch.equal(v0, v) and not torch.equal(k0, k)  # V kept exact, K through the user's int4
    k1, v1, _ = t.roundtrip_layer(1, k, v)
    assert torch.equal(k1, k) and torch.equal(v1, v)  # a boundary layer with no override: none
    q = torch.randn(1, 4, 8, 64, generator=g) * 3
    assert torch.equal(t.query_layer(1, q), q) and not torch.equal(t.query_layer(3, q), q)


def test_a_cache_the_engine_made_nan_fails_the_window(tiny_llama):
    """An engine format that writes NaN (SGLang's e4m3 cast past 464) spreads it to every later layer,
    as in the engine: the window's scores are NaN, nothing is sent to the codec after it."""
    from kvlib.scoring.write import score_write

    class Overflowing:
        seconds: dict = {}
        calls: list = []

        def roundtrip_layer(self, layer, key, value):
            self.calls.append(layer)
            return (key * float("nan") if layer == 0 else key), value, None

    ids = _ids(40)
    t = Overflowing()
    with torch.no_grad():
        logp = torch.log_softmax(tiny_llama(ids).logits[0, -11:-1].float(), -1)
    nll, kld, top1, m, _ = score_write(tiny_llama, ids, 10, ids[0, -10:], logp, t)
    assert math.isnan(nll) and all(math.isnan(k) for k in kld) and top1 == 0 and m is None
    assert t.calls == [0]  # layer 1's K arrives NaN: no codec call for it


def test_a_sweep_keys_llamacpp_formats_by_the_models_channel_order(tiny_dir, tmp_path):
    """A sweep's write mode knows the architecture before the model loads (its config): a Llama's
    llama.cpp formats go in GGUF's channel order, and their units say so."""
    from kvlib.runs.sweep import run_sweep

    r = run_sweep(["llama.cpp:q8_0"], model=str(tiny_dir / "model"), corpus_name=str(tiny_dir / "corpus.txt"),
                  device="cpu", stride=64, max_windows=2, context_length=128, peers=False, verbose=False,
                  results=tmp_path / "store", mode="write")
    keys = [p.read_text() for p in (tmp_path / "store").rglob("*.json")]
    assert any("channel order gguf" in k for k in keys) and not any("channel order model" in k for k in keys)
    assert r.schemes[0].name == "llama.cpp:q8_0"


def test_turboquant_write_mode_keeps_the_boundary_layers_exact(tiny_llama, tmp_path, cli):
    """A TurboQuant cache keeps the model's first and last two layers unquantized (vLLM's
    get_boundary_skip_layers); write mode sends one layer at a time, so its write path sends those
    through ``none`` once write_cache has told it the model's layer count; Q stays exact."""
    from kvlib.transforms.codec import cache_transforms
    from kvlib.transforms.engine import EngineWrite, boundary_layers, write_key

    codecs = [resolve_codec(s) for s in ("vllm:turboquant_k3v4_nc", "vllm:turboquant_k8v4", "vllm:int4_per_token_head")]
    assert [boundary_layers(c) for c in codecs] == [2, 2, 0]
    ts, _ = cache_transforms(codecs, tmp_path, "t", mode="write", architecture="llama")
    t = ts["vllm:turboquant_k3v4_nc"]
    assert type(t) is EngineWrite and t.boundary == 2 and t.query is None and not t.converts_queries
    assert type(ts["vllm:int4_per_token_head"]) is not EngineWrite
    assert t.key.endswith(", the first and last 2 layers unquantized") and t.key == codecs[0].spec + write_key(codecs[0], "llama")
    with pytest.raises(RuntimeError, match="layer count is unknown"):
        t.kept_exact(0)
    write_cache(tiny_llama, t, [])
    assert t.num_layers == 22 and [i for i in range(22) if t.kept_exact(i)] == [0, 1, 20, 21]
    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(1, 2, 8, 64, generator=g), torch.randn(1, 2, 8, 64, generator=g)
    for layer, exact in ((0, True), (1, True), (2, False), (19, False), (20, True), (21, True)):
        k2, v2, m = t.roundtrip_layer(layer, k, v)
        assert (torch.equal(k2, k) and torch.equal(v2, v)) == exact, layer
        assert m.bits_per_element == (32 if exact else (3.25 + 4.5) / 2)  # float32 kept; 3 + 16/64, 4 + 32/64


def test_an_engine_sweep_shows_prefix_mode_beside_write(tiny_dir, tmp_path, capsys):
    """--engine runs score the options in prefix mode too: each engine row carries the prefix delta
    beside its write-mode verdict, the same number (and units) a prefix-mode sweep gives."""
    from kvlib.runs.sweep import print_sweep

    kw = dict(model=str(tiny_dir / "model"), corpus_name=str(tiny_dir / "corpus.txt"), device="cpu", stride=64,
              max_windows=3, context_length=128, peers=False, verbose=False, results=tmp_path / "store")
    both = run_sweep(["llama.cpp:q8_0", "int4"], mode="write", beside="prefix", **kw)
    row = both.engines["llama.cpp"]["rows"][0]
    assert both.mode == "write" and row["option"] == "llama.cpp:q8_0" and row["beside"]["mode"] == "prefix"
    assert row["context_delta"] == both.scheme("llama.cpp:q8_0").context_delta  # the verdict stays write mode's
    prefix = run_sweep(["llama.cpp:q8_0"], mode="prefix", **kw)
    assert prefix.timing["units_computed"] == 0  # the beside pass stored them
    assert row["beside"]["context_delta"] == prefix.scheme("llama.cpp:q8_0").context_delta != row["context_delta"]
    print_sweep(both)
    assert "; prefix mode " in capsys.readouterr().out
    with pytest.raises(ValueError, match="beside 'write'"):
        run_sweep(["llama.cpp:q8_0"], mode="write", beside="write", **kw)


def test_engine_tables_count_a_skipped_layer_at_the_serving_dtype():
    """A layer TurboQuant keeps exact is stored by the engine in the model's 16-bit dtype: a float32 CPU
    run keeps it in float32, which the engine table must not count (kvlib.runs.engines.engine_bits)."""
    from kvlib.runs.engines import engine_bits, engine_tables
    from kvlib.runs.sweep import SchemeResult

    tensors = [{"scheme": "none", "num_elements": 100, "bits_per_element": 32},
               {"scheme": "vllm:turboquant_k4_nc", "num_elements": 300, "bits_per_element": 4.125}]
    s = SchemeResult(name="vllm:turboquant_4bit_nc", spec="vllm:turboquant_4bit_nc", kind="kvq", mode="write",
                     bits_per_element=(100 * 32 + 300 * 4.125) / 400, compression={"tensors": tensors})
    assert engine_bits(s) == (100 * 16 + 300 * 4.125) / 400
    row = engine_tables([s], "write")["vllm"]["rows"][0]
    assert row["bits_per_element"] == engine_bits(s) and row["stored_bits_per_element"] == s.bits_per_element
    s.compression["tensors"][0]["bits_per_element"] = 16  # a bf16 or fp16 run stores what the engine stores
    s.bits_per_element = (100 * 16 + 300 * 4.125) / 400
    assert engine_bits(s) == s.bits_per_element


def test_a_calibrated_twin_gets_its_prefix_delta_beside_too(tiny_dir, tmp_path):
    """A calibrated twin's codec is named by its per-layer spec and shown as OPTION@calibrated: the
    beside pass scores it and files it under that name."""
    kw = dict(model=str(tiny_dir / "model"), corpus_name=str(tiny_dir / "corpus.txt"), device="cpu", stride=64,
              max_windows=3, context_length=128, peers=False, verbose=False, results=tmp_path / "store")
    r = run_sweep(["vllm:fp8_e4m3"], mode="write", beside="prefix", calibrate_scales=True,
                  calibration="windows=1", **kw)
    rows = {row["option"]: row for row in r.engines["vllm"]["rows"]}
    assert set(rows) == {"vllm:fp8_e4m3", "vllm:fp8_e4m3@calibrated"}
    assert all(row["beside"]["mode"] == "prefix" for row in rows.values())
    assert rows["vllm:fp8_e4m3@calibrated"]["beside"]["context_delta"] != rows["vllm:fp8_e4m3"]["beside"]["context_delta"]


def test_kv_validate_engine_confirms_each_answer_on_fresh_windows(tiny_dir, tmp_path, capsys):
    """kv-validate --engine: after the sweep, each engine's cheapest robust option runs again on
    --confirm-windows fresh windows past the sweep's; the JSON keeps the confirmation."""
    import json

    from kvlib.cli import main

    out = tmp_path / "r.json"
    argv = ["--model", str(tiny_dir / "model"), "--corpus", str(tiny_dir / "corpus.txt"), "--engine", "ocp",
            "--context-length", "128", "--stride", "64", "--max-windows", "5", "--confirm-windows", "5",
            "--results", str(tmp_path / "store"), "--json", str(out), "--cpu"]
    main(argv)
    printed = capsys.readouterr().out
    assert "Confirming each engine's cheapest robust option on 5 fresh windows from window 5" in printed
    t = json.loads(out.read_text())["engines"]["ocp"]
    tried = [r for r in t["rows"] if "confirmation" in r]
    assert t["confirmed_on_fresh_windows"] and tried and all(r["confirmation"]["first_window"] == 5 for r in tried)
    assert t["cheapest"] in {r["option"] for r in tried if r["confirmed"]} | {None}
    assert all(r.get("beside", {}).get("mode") == "prefix" for r in t["rows"])
    assert main(argv + ["--confirm-windows", "3"]) == 2  # a confirmation needs a CI

"""The HQQ peer (kvlib.transforms.hqq_peer): transformers' QuantizedCache with its HQQ backend,
opt-in beside the quanto peer. Its reconstruction is the transformers layer's own, its bytes what
that layer stores, a cache shape HQQ cannot pack is a "not run" row, and a sweep runs it only when
asked. Small tensors and tiny random models only."""

from __future__ import annotations

import math
from importlib.metadata import version

import pytest
import torch

pytest.importorskip("hqq.core.quantize")

import kvlib.transforms.codec  # noqa: E402,F401  (registers the built-in peers, as a sweep does)
from kvlib import cli as cli_module  # noqa: E402
from kvlib.runs.sweep import run_sweep  # noqa: E402
from kvlib.scoring.perplexity import plan_windows  # noqa: E402
from kvlib.transforms import hqq_peer  # noqa: E402
from kvlib.transforms.base import checked_peers, peer_transforms, select_peers  # noqa: E402
from kvlib.transforms.hqq_peer import HqqPeer, PeerRefused  # noqa: E402

HQQ_NAMES = {"hf-hqq-int4", "hf-hqq-int2"}
SMALL = dict(device="cpu", context_length=128, stride=64, max_windows=2, verbose=False, progress=False)


def _layer(nbits: int, axis: int, k: torch.Tensor, v: torch.Tensor):
    """transformers' HQQ layer itself, as QuantizedCache(backend="hqq", residual_length=0) holds it."""
    from transformers.cache_utils import HQQQuantizedLayer

    layer = HQQQuantizedLayer(nbits=nbits, axis_key=axis, axis_value=axis, q_group_size=64, residual_length=0)
    layer.update(k, v)
    return layer


@pytest.mark.parametrize("nbits,dtype,bits", [(4, torch.float32, 5.0), (2, torch.float32, 3.0),
                                               (4, torch.bfloat16, 4.5)])
def test_reconstruction_and_bytes_are_the_transformers_layers(nbits, dtype, bits):
    g = torch.Generator().manual_seed(nbits)
    k, v = (torch.randn(1, 2, 32, 64, generator=g).to(dtype) for _ in range(2))
    yk, yv, m = HqqPeer(nbits).roundtrip_layer(3, k, v)
    layer = _layer(nbits, 1, k, v)
    assert torch.equal(yk, layer._dequantize(layer._quantized_keys).to(dtype))
    assert torch.equal(yv, layer._dequantize(layer._quantized_values).to(dtype))
    assert yk.shape == k.shape and yk.dtype == dtype and not torch.equal(yk, k)
    # HQQ's default axis 0 groups other elements: the peer's axis 1 is not it (the comparison can fail).
    assert not torch.equal(yk, _layer(nbits, 0, k, v)._dequantize(_layer(nbits, 0, k, v)._quantized_keys).to(dtype))
    # Bytes: what the layer stores, counted here from its tensors (codes + scale + zero per group of 64).
    stored = 0
    for codes, meta in (layer._quantized_keys, layer._quantized_values):
        assert codes.dtype == torch.uint8 and codes.numel() == 64 * 64 * nbits // 8  # 64 groups, packed
        assert meta["scale"].shape == meta["zero"].shape == (64, 1) and meta["scale"].dtype == dtype
        stored += codes.numel() + 2 * meta["scale"].numel() * meta["scale"].element_size()
    assert m.compressed_size_bytes == stored and m.original_size_bytes == 2 * (k.numel() + v.numel())
    assert m.bits_per_element == pytest.approx(bits) and m.compression_ratio == pytest.approx(16 / bits)
    # Reconstruction error, in the CLI's JSON shape, from the tensors themselves.
    e2 = float(((yk.double() - k.double()) ** 2).sum() + ((yv.double() - v.double()) ** 2).sum())
    assert m.sums["sum_e2"] == pytest.approx(e2) and m.sums["n"] == k.numel() + v.numel()
    assert [t["name"] for t in m.tensors] == ["layer_3_key", "layer_3_value"]
    assert 0 < m.rmse and math.isfinite(m.snr_db)


def test_a_shape_hqq_cannot_pack_is_refused_in_one_line():
    """Groups packed 8/nbits to a byte: 3 groups fail at 4 bits, 6 at 2 bits, in HQQ itself as the refusal says."""
    odd, six, four = torch.randn(1, 1, 3, 64), torch.randn(1, 3, 2, 64), torch.randn(1, 1, 4, 64)
    for nbits, x in ((4, odd), (2, six)):  # HQQ fails on them, packing or unpacking
        with pytest.raises(RuntimeError, match="size of tensor"):
            layer = _layer(nbits, 1, x, x)
            layer._dequantize(layer._quantized_keys)
    why = HqqPeer(4).refuses([(0, "key", (1, 1, 4, 64)), (5, "value", tuple(odd.shape))])
    assert why == (f"hqq {version('hqq')} cannot quantize layer 5's value (1, 1, 3, 64) at 4 bits: 3 groups of 64 "
                   "are not a multiple of 2 (hqq.core.bitpack: pack_4bit_u8 packs them into 2 rows, which "
                   "unpack_4bit_u8 returns as 4 groups)")
    assert "\n" not in why
    assert "6 groups of 64 are not a multiple of 4" in HqqPeer(2).refuses([(0, "key", tuple(six.shape))])
    assert HqqPeer(4).refuses([(0, "key", tuple(four.shape))]) is None
    assert HqqPeer(2).refuses([(0, "key", tuple(four.shape))]) is None
    layer = _layer(4, 1, four, four)  # what it does not refuse, HQQ takes
    assert layer._dequantize(layer._quantized_keys).shape == four.shape
    assert "pack_4bit_u8: RuntimeError: The size of tensor a (2302) must match" in HqqPeer(4).refuses(
        [(0, "key", (1, 3, 1535, 64))])  # SmolLM2-135M's context: the packer itself fails
    with pytest.raises(PeerRefused, match="3 groups of 64"):  # called directly, it says so before HQQ fails
        HqqPeer(4).roundtrip_layer(0, odd, odd)


def test_its_key_names_hqqs_version():
    assert HqqPeer(4).key == ("transformers QuantizedCache, HQQ int4, group 64, axis 1, residual 0, "
                              f"hqq {version('hqq')}")
    assert HqqPeer(2).name == "hf-hqq-int2" and HqqPeer(2).kind == "peer"


def test_opt_in_only():
    assert HQQ_NAMES.isdisjoint(t.name for t in peer_transforms())
    assert HQQ_NAMES.isdisjoint(t.name for t in peer_transforms(True))
    assert [t.name for t in peer_transforms("hf-quanto,hf-hqq")] == [
        "hf-quanto-int4", "hf-quanto-int2", "hf-hqq-int4", "hf-hqq-int2"]
    assert [t.name for t in peer_transforms(["hf-hqq-int4"])] == ["hf-hqq-int4"]
    assert peer_transforms(False) == [] and peer_transforms("") == []
    with pytest.raises(ValueError, match="unknown peer 'hqq'.*hf-quanto, hf-hqq"):
        peer_transforms("hf-quanto,hqq")
    assert checked_peers(("hf-quanto-int4", "hf-hqq-int4")) == ("hf-quanto-int4",) and checked_peers(True) is True


def test_the_cli_passes_the_selection(monkeypatch, capsys):
    seen = {}

    def fake(codecs, **kw):
        seen.update(kw, codecs=codecs)
        raise SystemExit(0)

    monkeypatch.setattr(cli_module, "run_sweep", fake)
    for argv, peers in ((["--peers", "hf-quanto,hf-hqq"], "hf-quanto,hf-hqq"), ([], True), (["--no-peers"], False)):
        with pytest.raises(SystemExit):
            cli_module.main(["--schemes", "int4,kivi4", *argv])
        assert seen["peers"] == peers
        seen.clear()
    assert cli_module.main(["--schemes", "int4,kivi4", "--peers", "hf-hqq,nope"]) == 2
    assert "unknown peer 'nope'" in capsys.readouterr().err and not seen
    with pytest.raises(SystemExit):  # one scheme with --peers: a sweep of it and the peers, not a lone validation
        cli_module.main(["--scheme", "int4", "--peers", "hf-hqq"])
    assert [c.name for c in seen.pop("codecs")] == ["int4"] and seen["peers"] == "hf-hqq"
    seen.clear()
    for argv, why in ((["--scheme", "int4", "--peers", "hf-hqq", "--quick-test"], "does not run with --quick-test"),
                      (["--engine", "ocp", "--peers", "hf-quanto"], "--peers and --engine")):
        assert cli_module.main(argv) == 2
        assert why in capsys.readouterr().err and not seen


def test_select_peers_before_any_window(monkeypatch):
    """3 KV heads x 63 context tokens: 189 groups, which HQQ cannot pack; quanto runs on."""
    geometry = {"num_kv_heads": 3, "head_dim": 64, "layer_windows": [0, 0]}
    windows = plan_windows(300, 128, 64, 2)  # window 1 holds a context of 63 tokens
    kept, refused = select_peers("hf-quanto,hf-hqq", geometry, windows)
    assert kept == ("hf-quanto-int4", "hf-quanto-int2")
    assert [(t.name, why.split(":")[0]) for t, why in refused] == [
        ("hf-hqq-int4", f"hqq {version('hqq')} cannot quantize layer 0's key (1, 3, 63, 64) at 4 bits"),
        ("hf-hqq-int2", f"hqq {version('hqq')} cannot quantize layer 0's key (1, 3, 63, 64) at 2 bits")]
    even = {**geometry, "num_kv_heads": 4}
    assert select_peers("hf-hqq", even, windows) == ("hf-hqq", [])  # nothing refused: the selection itself
    assert select_peers(True, geometry, windows) == (True, [])
    # Write mode: each layer's K/V of the whole window (128 tokens): 384 groups, which it packs.
    assert select_peers("hf-hqq", geometry, windows, mode="write") == ("hf-hqq", [])
    monkeypatch.setattr(hqq_peer, "hqq_unavailable", lambda: "hqq cannot be imported (test)")
    kept, refused = select_peers("hf-quanto,hf-hqq", even, windows)
    assert kept == ("hf-quanto-int4", "hf-quanto-int2")
    assert [(t.name, why) for t, why in refused] == [("hf-hqq-int4", "hqq cannot be imported (test)"),
                                                    ("hf-hqq-int2", "hqq cannot be imported (test)")]


def test_a_sweep_runs_it_when_asked(tiny_dir):
    """The tiny Llama (4 KV heads): 2 windows of 128, one with a context of 63 tokens, both HQQ rows scored."""
    r = run_sweep(["int4"], model=str(tiny_dir / "model"), corpus_name=str(tiny_dir / "corpus.txt"),
                  peers="hf-hqq", results=False, **SMALL)
    rows = {s.name: s for s in r.schemes}
    assert set(rows) == {"int4", *HQQ_NAMES}
    for name, bits in (("hf-hqq-int4", 5.0), ("hf-hqq-int2", 3.0)):
        s = rows[name]
        assert not s.error and s.kind == "peer" and s.spec == HqqPeer(int(name[-1])).spec
        assert s.bits_per_element == pytest.approx(bits) and math.isfinite(s.context_delta)
        assert 0 < s.top1_agreement <= 100 and len(s.layer_key_snr_db) == r.kv_geometry["num_layers"]
    assert rows["hf-hqq-int4"].keys["snr_db"] > rows["hf-hqq-int2"].keys["snr_db"]


@pytest.fixture
def one_head_dir(tmp_path, tiny_tokenizer):
    """A tiny random Llama with a single KV head: a 63-token context holds 63 groups."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256)
    LlamaForCausalLM(cfg).eval().save_pretrained(tmp_path / "model")
    tiny_tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def test_a_cache_hqq_cannot_pack_is_a_not_run_row(one_head_dir, tiny_dir):
    r = run_sweep(["int4"], model=str(one_head_dir), corpus_name=str(tiny_dir / "corpus.txt"),
                  peers="hf-quanto,hf-hqq", results=False, **SMALL)
    rows = {s.name: s for s in r.schemes}
    assert set(rows) == {"int4", "hf-quanto-int4", "hf-quanto-int2", *HQQ_NAMES}
    for name in HQQ_NAMES:
        assert rows[name].error.startswith(f"hqq {version('hqq')} cannot quantize layer 0's key (1, 1, 63, 64) at "
                                           f"{name[-1]} bits: 63 groups of 64 are not a multiple of")
        assert rows[name].verdict_text == "not run" and math.isnan(rows[name].bits_per_element)
    for name in ("int4", "hf-quanto-int4", "hf-quanto-int2"):
        assert not rows[name].error and math.isfinite(rows[name].context_delta)
    assert [s.name for s in r.schemes][-2:] == ["hf-hqq-int4", "hf-hqq-int2"]  # not-run rows last

"""The codec server on a GPU: shared-memory segments page-locked, copies queued without
blocking, and still every reconstruction and every score equal to the file CLI's, with the
codec overlapped or not. Skipped without CUDA (CI has none); run on a GPU machine with
``pytest tests/test_cuda.py``."""

from __future__ import annotations

import pytest
import torch

from kvlib.transforms.codec import CLICacheRoundtrip
from kvlib.cache.layout import cache_layers
from kvlib.codec.server import CodecServer, SharedContext
from kvlib.transforms.codec import ServerCacheRoundtrip
from kvlib.cache.layout import CacheLayout, make_cache
from kvlib.codec.pinned import is_pinned
from test_codec_server import random_cache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SCHEMES = ("int4", "kivi4", "q8_0", "k=asym3/g48/channel,v=sym5/g32/res16")


def gpu_cache(dtype, layout=None, seed=0):
    """test_codec_server's random cache (outlier key channels), on the GPU."""
    return make_cache([(k.cuda(), v.cuda()) for k, v in cache_layers(random_cache(dtype, layout, seed))], layout)


def tensors(c):
    return [x for kv in cache_layers(c) for x in kv]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_reconstructions_equal_the_file_cli(cli, tmp_path, dtype):
    layout = CacheLayout((0, 32, 0, 32), 100)
    with CodecServer() as srv:
        ctx = SharedContext("m")
        ts = {s: ServerCacheRoundtrip(srv, s, "m", context=ctx) for s in SCHEMES}
        for seed in (0, 1):  # the second window reuses every buffer
            cache = gpu_cache(dtype, layout, seed)
            got = ServerCacheRoundtrip.run_batch(list(ts.values()), cache)
            for (s, t), (a, ma, _) in zip(ts.items(), got):
                b, mb = CLICacheRoundtrip(tmp_path / s, s, "m")(cache)
                assert all(x.is_cuda and x.dtype == dtype for x in tensors(a))
                assert all(torch.equal(x, y) for x, y in zip(tensors(a), tensors(b)))
                assert ma.sums == mb.sums and ma.compressed_size_bytes == mb.compressed_size_bytes
                assert is_pinned(t.out.buf)
        assert is_pinned(ctx._held[0][1].buf) and ctx.writes == 2


def test_gpu_scoring_is_identical_overlapped_or_not(cli, tiny_llama, tmp_path, monkeypatch):
    from kvlib.codec.spec import resolve_codec
    from kvlib.scoring.perplexity import score_windows
    from kvlib.transforms.codec import cache_transforms

    model = tiny_llama.to("cuda")
    ids = torch.randint(3, 64, (1, 900), generator=torch.Generator().manual_seed(0))
    codecs = [resolve_codec(s) for s in SCHEMES[:3]]
    out = {}
    for backend, overlap in (("cli", False), ("server", False), ("server", True)):
        monkeypatch.setenv("KVLIB_CODEC", backend)
        ts, _ = cache_transforms(codecs, tmp_path / f"{backend}{overlap}", "m")
        res = score_windows(model, ids, 256, 128, ts, progress=False, overlap=overlap)
        out[backend, overlap] = {k: [(w.baseline_nll, w.compressed_nll, w.kld, w.top1_agree) for w in r.windows]
                                 for k, r in res.items()}
    model.to("cpu")
    assert out["server", False] == out["cli", False] == out["server", True]

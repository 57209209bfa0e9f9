"""The codec server (kv-compress serve) against the file CLI: the same
reconstructions and metrics to the bit, on every preset, F32/F16/bfloat16
caches and sliding-window layouts, inside a real scoring run; and its faults:
a refused request, a killed server (restarted once), a server that cannot
start (the file CLI instead), no process and no shared memory left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from kvlib.codec import server as codec_server
from kvlib.transforms.codec import CLICacheRoundtrip
from kvlib.cache.layout import cache_layers
from kvlib.codec.spec import presets, resolve_codec
from kvlib.codec.server import CodecServer, CodecServerError, SharedContext
from kvlib.transforms.codec import ServerCacheRoundtrip
from kvlib.cache.layout import CacheLayout, layout_of, make_cache

TIMES = ("codec_time_ms", "processing_time_ms")


def metrics_dict(m) -> dict:
    d = dict(vars(m))
    for k in TIMES:
        d.pop(k, None)
    return d


def random_cache(dtype=torch.float32, layout: CacheLayout | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n = 6 if layout is None else len(layout.windows)
    layers = []
    for i in range(n):
        t = 300 if layout is None else layout.stored(i)
        k = torch.randn(1, 2, t, 64, generator=g) * 2
        k[..., :3] *= 10  # outlier channels, as real keys have
        layers.append((k.to(dtype), torch.randn(1, 2, t, 64, generator=g).to(dtype)))
    return make_cache(layers, layout)


@pytest.fixture(scope="module")
def server(cli):
    with CodecServer() as s:
        yield s


def same(a, b) -> bool:
    return all(torch.equal(x, y) for p, q in zip(cache_layers(a), cache_layers(b)) for x, y in zip(p, q))


@pytest.mark.parametrize("scheme", [*presets(), "int4+lossless", "k=asym3/g48/channel,v=sym5/g32/res16"])
def test_server_equals_the_file_cli(server, tmp_path, scheme):
    cache = random_cache()
    a, ma = ServerCacheRoundtrip(server, scheme, "m")(cache)
    b, mb = CLICacheRoundtrip(tmp_path, scheme, "m")(cache)
    assert same(a, b) and metrics_dict(ma) == metrics_dict(mb)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_and_sliding_layouts(server, tmp_path, dtype):
    layout = CacheLayout((0, 32, 32, 0), 100)  # two sliding layers of window 32 among full ones
    cache = random_cache(dtype, layout, seed=3)
    a, ma = ServerCacheRoundtrip(server, "kivi4", "m")(cache)
    b, mb = CLICacheRoundtrip(tmp_path, "kivi4", "m")(cache)
    assert same(a, b) and metrics_dict(ma) == metrics_dict(mb)
    assert layout_of(a) == layout and cache_layers(a)[0][0].dtype == dtype


def test_context_written_once_for_every_scheme(server):
    ctx = SharedContext("m")
    ts = [ServerCacheRoundtrip(server, s, "m", context=ctx) for s in ("int4", "q8_0", "kivi2")]
    c1, c2 = random_cache(seed=1), random_cache(seed=2)
    for c in (c1, c2):
        for t in ts:
            t(c)
    assert ctx.writes == 2 and all(t.calls == 2 for t in ts)


def test_scoring_run_is_identical_with_either_backend(embedded, tmp_path, monkeypatch):
    """score_schemes on the embedded model: every number of every scheme equal, server or file CLI."""
    from kvlib.models.corpus import load_corpus, tokenize
    from kvlib.runs.sweep import score_schemes

    lm, tok = embedded
    ids = tokenize(tok, load_corpus("embedded"))[:, :700]
    out = {}
    for backend in ("server", "cli"):
        monkeypatch.setenv("KVLIB_CODEC", backend)
        schemes, first, timing = score_schemes(lm, ids, 256, 128, [resolve_codec("int4"), resolve_codec("kivi2")],
                                               tmp_path / backend, "smol", max_windows=3)
        out[backend] = [{k: v for k, v in vars(s).items() if k != "seconds"} for s in schemes]
        for s in out[backend]:
            for t in s["compression"].get("tensors", []):
                t.pop("codec_time_ms", None)
            for k in TIMES:
                s["compression"].pop(k, None)
    # As JSON: NaN (no CI from two gated windows) equals NaN there.
    assert json.dumps(out["server"], sort_keys=True) == json.dumps(out["cli"], sort_keys=True)
    assert [len(s["window_deltas"]) for s in out["cli"]] == [2, 2]  # two windows with a compressed context each


def test_a_refused_request_is_one_line_and_the_server_goes_on(server):
    seg = codec_server.SharedSegment(256)
    x = [{"name": "x", "dtype": "F32", "shape": [64], "offset": 0}]
    for req, why in [
        ({"input": {"path": "/nonexistent", "size": 256}, "tensors": x,
          "schemes": [{"args": ["-scheme", "int4"], "output": seg.segment()}]}, "input.path: open /nonexistent"),
        ({"input": seg.segment(), "tensors": x, "schemes": [{"args": ["-scheme", "int9"], "output": seg.segment()}]},
         "schemes\\[0\\].args"),
        ({"input": seg.segment(), "tensors": [{**x[0], "shape": [65]}],
          "schemes": [{"args": ["-scheme", "int4"], "output": seg.segment()}]}, "tensors\\[0\\] \\(x\\): 260 bytes"),
    ]:
        with pytest.raises(CodecServerError, match=why) as e:
            server.request({"op": "roundtrip", **req})
        assert "\n" not in str(e.value)
    seg.close()
    a, _ = ServerCacheRoundtrip(server, "int4", "m")(random_cache())
    assert server.proc is not None and server.proc.poll() is None and server.restarts == 0


def test_a_killed_server_is_restarted_once(cli, capsys):
    with CodecServer() as s:
        t = ServerCacheRoundtrip(s, "q4_0", "m")
        ref, _ = t(random_cache())
        ref = [x.clone() for kv in cache_layers(ref) for x in kv]
        s.proc.kill()
        s.proc.wait()
        again, _ = t(random_cache())
        assert s.restarts == 1 and all(torch.equal(x, y) for x, y in zip([x for kv in cache_layers(again) for x in kv], ref))
        assert "restarting it once" in capsys.readouterr().err
        s.proc.kill()
        s.proc.wait()
        with pytest.raises(CodecServerError, match="died"):
            t(random_cache())


def test_a_server_that_cannot_start_means_the_file_cli(tmp_path, monkeypatch, capsys):
    with pytest.raises(CodecServerError, match="died|cannot start"):
        CodecServer(cli="/bin/false")
    monkeypatch.setattr(codec_server, "_shared", None)
    monkeypatch.setattr(codec_server, "CodecServer", lambda: (_ for _ in ()).throw(CodecServerError("no luck")))
    from kvlib.transforms.codec import cache_transforms

    ts, _ = cache_transforms([resolve_codec("int4")], tmp_path, "m")
    assert isinstance(ts["int4"], CLICacheRoundtrip)
    err = capsys.readouterr().err
    assert "the codec server cannot start (no luck); using the file CLI" in err and err.count("\n") == 1


def test_nothing_is_left_behind(cli, tmp_path):
    """No server outlives its Python process, even one killed with SIGKILL mid-run, and
    no shared memory appears under /dev/shm."""
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent("""
        import sys, time, torch
        from kvlib.codec.server import CodecServer
        from kvlib.transforms.codec import ServerCacheRoundtrip
        from kvlib.cache.layout import make_cache
        s = CodecServer()
        ServerCacheRoundtrip(s, "int4", "m")(make_cache([(torch.randn(1, 2, 64, 64), torch.randn(1, 2, 64, 64))]))
        print(s.proc.pid, flush=True)
        time.sleep(60)
    """))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    server_pid = int(p.stdout.readline())
    assert Path(f"/proc/{server_pid}").exists()
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            state = Path(f"/proc/{server_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state == "Z":  # exited; only its parent (gone) could reap it
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"kv-compress serve {server_pid} outlived its killed parent")
    shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert shm_after - shm_before == set()


def test_overlapped_scoring_gives_the_same_numbers(tiny_llama, tmp_path):
    """With the codec of window w in a second thread during window w+1's forward, every window's
    NLLs, KLD and top-1 are those of the sequential loop, with the peer as well."""
    from kvlib.scoring.perplexity import score_windows
    from kvlib.transforms.codec import cache_transforms

    # 3 windows of 256 at stride 128: window 1's codec runs during window 2's forward.
    ids = torch.randint(0, 64, (1, 512), generator=torch.Generator().manual_seed(3))
    out = {}
    for overlap in (False, True):
        ts, _ = cache_transforms([resolve_codec("int4"), resolve_codec("kivi2")], tmp_path, "tiny", peers=True)
        res = score_windows(tiny_llama, ids, 256, 128, ts, 3, progress=False, overlap=overlap)
        out[overlap] = {k: [(w.index, w.baseline_nll, w.compressed_nll, w.kld, w.top1_agree, w.compressed)
                            for w in r.windows] for k, r in res.items()}
    assert out[True] == out[False] and len(out[True]) == 4 and len(out[True]["int4"]) == 3
    assert [w[-1] for w in out[True]["int4"]] == [False, True, True]  # two windows through the codec


def test_one_request_per_window_for_all_schemes(server, tiny_llama):
    """score_windows sends each window's context once, with every scheme in one request."""
    from kvlib.scoring.perplexity import score_windows

    ctx = SharedContext("m")
    ts = {s: ServerCacheRoundtrip(server, s, "m", context=ctx) for s in ("int4", "kivi4", "q8_0")}
    before = server.requests
    ids = torch.randint(0, 64, (1, 400), generator=torch.Generator().manual_seed(0))
    res = score_windows(tiny_llama, ids, 160, 64, ts, 4, progress=False)
    windows = sum(w.compressed for w in res["int4"].windows)
    assert windows == 3 and server.requests - before == windows and ctx.writes == windows
    assert all(t.calls == windows for t in ts.values())


def test_a_server_that_hangs_is_stopped_after_its_timeout(tmp_path, monkeypatch):
    """A codec that never answers ends in a one-line error (and a killed process), not a hung run."""
    fake = tmp_path / "kv-compress"
    fake.write_text("#!/bin/sh\n# answers the ping, then hangs\nhead -c 4 >/dev/null\nprintf '\\015\\000\\000\\000{\"id\": 1}    '\n"
                    "exec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setattr(codec_server, "TIMEOUT_BASE_S", 0.5)
    s = CodecServer(cli=str(fake))
    s.restarts = 1  # no second chance: this test is about the first
    with pytest.raises(CodecServerError, match="did not answer within 0 s"):
        s.request({"op": "ping"})
    assert s.proc is None or s.proc.poll() is not None
    s.close()


def test_a_reconstruction_in_use_is_not_overwritten(server):
    """While one reconstruction is still viewed (scored while the next window's is made), the
    next call writes into a second buffer; once released, the first buffer is used again."""
    t = ServerCacheRoundtrip(server, "int4", "m")
    a, _ = t(random_cache(seed=1))
    first = t.out
    keep = [x.clone() for x in cache_layers(a)[0]]
    b, _ = t(random_cache(seed=2))
    assert all(torch.equal(x, y) for x, y in zip(cache_layers(a)[0], keep))
    second = t.out
    assert second is not first
    del a
    t(random_cache(seed=3))
    assert t.out is first


def test_schemes_reading_one_context_share_their_buffers(server):
    """Schemes called one after another on one context reuse one output buffer between them, so
    memory follows the reconstructions alive at once, not the number of schemes; while all are
    alive, each has its own; and at the pool's limit the oldest is written again."""
    ctx = SharedContext("m")
    ts = [ServerCacheRoundtrip(server, s, "m", context=ctx) for s in ("int4", "q8_0", "kivi4", "rot3")]
    cache = random_cache(seed=4)
    for t in ts:
        rec, _ = t(cache)
        del rec
    assert len(ctx.outputs.segments) == 1 and all(t.out is ts[0].out for t in ts)
    held = [t(cache)[0] for t in ts]
    assert len({id(t.out) for t in ts}) == 4 == len(ctx.outputs.segments)
    oldest = ts[0].out
    ctx.outputs.limit = 4  # full: the next call takes the buffer written longest ago, viewed or not
    ts[2](cache)
    assert ts[2].out is oldest and len(ctx.outputs.segments) == 4
    del held

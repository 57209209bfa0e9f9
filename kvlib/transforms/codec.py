"""Cache transforms through kvlib's codec: a ``kv-compress`` round trip per codec, through the
run's codec server (all schemes reading one shared-memory copy of each context) or, when the
server cannot start or ``KVLIB_CODEC=cli``, through the file CLI (one context file per cache).
``cache_transforms`` builds them, with the registered peers when asked, in the order every check
takes them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from safetensors import safe_open
from safetensors.torch import save_file

from kvlib.cache.io import layer_metadata, load_kv_cache, save_kv_cache
from kvlib.cache.layout import cache_layers, cache_like
from kvlib.codec.binary import find_cli_binary
from kvlib.codec.cli import roundtrip_kv_cache
from kvlib.codec.metrics import CompressionMetrics
from kvlib.codec.server import CodecServer, SharedContext, SharedSegment, by_name, named_layout, shared_server, view
from kvlib.dtypes import stored
from kvlib.codec.spec import CodecConfig, resolve_codec
from kvlib.transforms.base import CodecRoundtrip, peer_transforms, peers_unavailable
from kvlib.transforms.engine import engine_write
from kvlib.transforms import peer as _builtin_peers  # noqa: F401  (registers the built-in peers: quanto)
from kvlib.transforms import hqq_peer as _hqq_peer  # noqa: F401  (and HQQ, opt-in)


class ContextFile:
    """Where context caches are saved: each once, however many codecs read it.

    Keeps the last ``slots`` caches on disk (one per window when scoring
    perplexity; one per haystack or prompt of a decoding batch), each in its
    own file beside ``path``."""

    def __init__(self, path: str | os.PathLike, model_name: str = "unknown", slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"slots {slots} must be at least 1")
        self.path, self.model_name, self.slots = Path(path), model_name, slots
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._saved: list[tuple[Any, Path]] = []  # (cache, its file), oldest first
        self.writes = 0

    def _slot_path(self, i: int) -> Path:
        return self.path if i == 0 else self.path.with_name(f"{self.path.stem}.{i}{self.path.suffix}")

    def path_for(self, cache: Any) -> Path:
        """The file holding ``cache``, written now unless it is one of the last ``slots`` written."""
        for saved, path in self._saved:
            if saved is cache:
                return path
        if len(self._saved) == self.slots:
            _, path = self._saved.pop(0)
        else:
            used = {p for _, p in self._saved}
            path = next(self._slot_path(i) for i in range(self.slots) if self._slot_path(i) not in used)
        save_kv_cache(cache, path, model_name=self.model_name)
        self._saved.append((cache, path))
        self.writes += 1
        return path


class CLICacheRoundtrip(CodecRoundtrip):
    """A cache transform through the real codec: save as safetensors, run
    ``kv-compress roundtrip``, load the reconstruction as a new DynamicCache.

    Callable as ``transform(cache) -> (cache, CompressionMetrics)``; keeps the
    time spent in each part (save, CLI, load) so a benchmark can report it.
    Transforms that share a ``context`` file save each window's cache once.
    """

    def __init__(self, workdir: str | os.PathLike, codec: CodecConfig | str | None = None,
                 model_name: str = "unknown", context: ContextFile | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.codec, self.model_name = resolve_codec(codec), model_name
        self.context = context or ContextFile(self.workdir / "context.safetensors", model_name)
        self.seconds = {"save": 0.0, "cli": 0.0, "load": 0.0}
        self.calls = 0
        find_cli_binary()  # a missing CLI is an error now, not after the first window

    def __call__(self, cache: Any) -> tuple[Any, CompressionMetrics]:
        dst = self.workdir / "context.restored.safetensors"
        k0 = cache_layers(cache)[0][0]
        t0 = time.perf_counter()
        src = self.context.path_for(cache)
        t1 = time.perf_counter()
        metrics = roundtrip_kv_cache(src, dst, codec=self.codec)
        t2 = time.perf_counter()
        restored, _ = load_kv_cache(dst, device=str(k0.device))
        # In the context's own layout (sliding-window layers included); bfloat16 travels as float32.
        restored = cache_like(cache, [(k.to(k0.dtype), v.to(k0.dtype)) for k, v in cache_layers(restored)])
        t3 = time.perf_counter()
        self.seconds["save"] += t1 - t0
        self.seconds["cli"] += t2 - t1
        self.seconds["load"] += t3 - t2
        self.calls += 1
        return restored, metrics

    def roundtrip_layer(self, layer: int, key: Any, value: Any) -> tuple[Any, Any, CompressionMetrics]:
        """Write mode through the file CLI: one layer's K and V in a file of their own."""
        src, dst = self.workdir / "layer.safetensors", self.workdir / "layer.restored.safetensors"
        kn, vn = _layer_names(layer)
        t0 = time.perf_counter()
        save_file({n: t.detach().to("cpu", stored(t.dtype).torch).contiguous() for n, t in ((kn, key), (vn, value))},
                  str(src), metadata=layer_metadata(layer, key, self.model_name))
        t1 = time.perf_counter()
        metrics = roundtrip_kv_cache(src, dst, codec=self.codec.for_layer(layer))
        t2 = time.perf_counter()
        with safe_open(str(dst), framework="pt") as f:
            k, v = (f.get_tensor(n).to(t.device, t.dtype) for n, t in ((kn, key), (vn, value)))
        self.seconds["save"] += t1 - t0
        self.seconds["cli"] += t2 - t1
        self.seconds["load"] += time.perf_counter() - t2
        self.calls += 1
        return k, v, metrics



def _layer_names(layer: int) -> tuple[str, str]:
    return f"layer_{layer}_key", f"layer_{layer}_value"


class ServerCacheRoundtrip(CodecRoundtrip):
    """A cache transform through the codec server: ``transform(cache) -> (cache, CompressionMetrics)``,
    the same reconstruction and metrics as ``bridge.CLICacheRoundtrip`` to the bit.

    On CPU the returned cache's tensors view an output buffer, taken from the context's
    ``OutputPool`` that every scheme reading the context shares: one that no tensor views any
    more, a new one while the pool holds fewer than BUFFERS per scheme (one window's
    reconstructions scored while the next window's are made), or else the one written longest
    ago. On CUDA the buffer is pinned and the tensors are device copies queued without blocking
    on the current stream (stream order makes them ready for the model); a buffer is not
    rewritten before its copies are done."""

    BUFFERS = 2

    def __init__(self, server: CodecServer, codec: CodecConfig | str | None = None, model_name: str = "unknown",
                 context: SharedContext | None = None) -> None:
        self.server, self.codec, self.model_name = server, resolve_codec(codec), model_name
        self.context = context or SharedContext(model_name)
        self.context.outputs.limit += self.BUFFERS
        self.out: SharedSegment | None = None  # the output buffer of the last call
        self.seconds = {"save": 0.0, "cli": 0.0, "load": 0.0}
        self.calls = 0

    @property
    def batch_with(self) -> tuple[int, int]:
        """Transforms with the same server and context can share one request (``run_batch``)."""
        return id(self.server), id(self.context)

    def __call__(self, cache: Any) -> tuple[Any, CompressionMetrics]:
        (restored, metrics, _), = self.run_batch([self], cache)
        return restored, metrics

    def roundtrip_layer(self, layer: int, key: Any, value: Any) -> tuple[Any, Any, CompressionMetrics]:
        """Write mode through the server: one layer's K and V in two segments of this transform's
        own (grown as needed), the reconstruction copied out so the next layer can reuse them."""
        kn, vn = _layer_names(layer)
        refs, size = named_layout([(kn, key), (vn, value)])
        cuda = key.is_cuda
        t0 = time.perf_counter()
        for attr, tag in (("_layer_in", "kvlib-layer"), ("_layer_out", "kvlib-layer-restored")):
            seg = getattr(self, attr, None)
            if seg is None or seg.size < size or seg.for_cuda != cuda:
                if seg is not None:
                    seg.close()
                setattr(self, attr, SharedSegment(size, tag, pinned=cuda))
        where = by_name(refs)
        for n, t in ((kn, key), (vn, value)):
            view(self._layer_in, where[n]).copy_(t.detach(), non_blocking=cuda)
        self._layer_in.fence.mark()
        self._layer_in.fence.wait()
        t1 = time.perf_counter()
        resp = self.server.request({"op": "roundtrip", "input": self._layer_in.segment(),
                                    "metadata": layer_metadata(layer, key, self.model_name), "tensors": refs,
                                    "schemes": [{"args": self.codec.for_layer(layer).cli_args(),
                                                 "output": self._layer_out.segment()}]})
        t2 = time.perf_counter()
        k, v = (view(self._layer_out, where[n]).to(t.device, t.dtype, copy=True) for n, t in ((kn, key), (vn, value)))
        self.seconds["save"] += t1 - t0
        self.seconds["cli"] += t2 - t1
        self.seconds["load"] += time.perf_counter() - t2
        self.calls += 1
        return k, v, CompressionMetrics.from_dict(resp["results"][0])

    @staticmethod
    def run_batch(ts: list["ServerCacheRoundtrip"], cache: Any) -> list[tuple[Any, CompressionMetrics, float]]:
        """Every transform of ``ts`` (one server, one context) on ``cache`` in one request: the
        context crosses once and the server runs the schemes in turn. (cache, metrics, seconds) each."""
        layers = cache_layers(cache)
        k0 = layers[0][0]
        t0 = time.perf_counter()
        seg, refs, meta = ts[0].context.segment_for(cache)
        cuda = k0.is_cuda
        outs: list[SharedSegment] = []
        for t in ts:
            t.out = ts[0].context.outputs.take(seg.size, cuda, outs)
            outs.append(t.out)
        t1 = time.perf_counter()
        resp = ts[0].server.request({"op": "roundtrip", "input": seg.segment(), "metadata": meta, "tensors": refs,
                                     "schemes": [{"args": t.codec.cli_args(), "output": o.segment()}
                                                 for t, o in zip(ts, outs)]})
        t2 = time.perf_counter()
        where, res = by_name(refs), []
        for t, o, rep in zip(ts, outs, resp["results"]):
            t3 = time.perf_counter()
            restored = cache_like(cache, [tuple(view(o, where[f"layer_{i}_{role}"]).to(
                k0.device, k0.dtype, non_blocking=cuda) for role in ("key", "value")) for i in range(len(layers))])
            o.fence.mark()
            load = time.perf_counter() - t3
            # The shared parts (the copy into shared memory, the request) are split evenly.
            t.seconds["save"] += (t1 - t0) / len(ts)
            t.seconds["cli"] += (t2 - t1) / len(ts)
            t.seconds["load"] += load
            t.calls += 1
            res.append((restored, CompressionMetrics.from_dict(rep), (t2 - t0) / len(ts) + load))
        return res


def cache_transforms(codecs: list[CodecConfig], workdir: str | os.PathLike, model_name: str,
                     peers: bool = False, slots: int = 1, mode: str = "prefix", architecture: str | None = None,
                     ) -> tuple[dict[str, Any], str | None]:
    """The transforms by name, and why the peers are missing (None when they run or were not
    asked). ``slots``: how many context caches are in use at once (the rows of a decoding
    batch), each saved once for every codec. In write mode an engine format comes with its
    engine's write path (kvlib.transforms.engine: the query's conversion, the channel order of
    a model of ``architecture``)."""
    server = shared_server()
    transforms: dict[str, Any]
    if server is not None:
        shared = SharedContext(model_name, slots=slots)

        def make(c: CodecConfig, sub: str = "") -> Any:
            return ServerCacheRoundtrip(server, c, model_name, context=shared)
    else:
        context = ContextFile(Path(workdir) / "context.safetensors", model_name, slots=slots)

        def make(c: CodecConfig, sub: str = "") -> Any:  # sub: a scheme's (sharing the context file); else a query's
            if sub:
                return CLICacheRoundtrip(Path(workdir) / sub, c, model_name, context=context)
            return CLICacheRoundtrip(Path(workdir) / ("query-" + c.spec.replace("/", "_")), c, model_name)
    transforms = {c.name: make(c, f"scheme{i}") for i, c in enumerate(codecs)}
    if mode == "write":
        transforms = {name: engine_write(t, make, architecture) for name, t in transforms.items()}
    missing = peers_unavailable(peers) if peers else None
    if peers and missing is None:
        transforms.update({t.name: t for t in peer_transforms(peers)})
    return transforms, missing

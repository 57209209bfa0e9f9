"""The cache transforms a check compares, built once from the codec list:
a ``kv-compress`` round trip per codec (through the run's codec server, all
reading one shared-memory copy of each context; or, when the server cannot
start or ``KVLIB_CODEC=cli``, through the file CLI, all reading one context
file per cache) and, when asked, transformers' QuantizedCache peer.

Each is ``transform(cache) -> (cache, metrics)``; perplexity, retrieval and
agreement all take them in this order.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kvlib.bridge import CLICacheRoundtrip, ContextFile
from kvlib.codec import CodecConfig
from kvlib.codec_server import ServerCacheRoundtrip, SharedContext, shared_server

# The transforms that run kvlib's codec (the others are the peer's).
CODEC_TRANSFORMS = (CLICacheRoundtrip, ServerCacheRoundtrip)


def cache_transforms(codecs: list[CodecConfig], workdir: str | os.PathLike, model_name: str,
                     peers: bool = False, slots: int = 1,
                     ) -> tuple[dict[str, Any], str | None]:
    """The transforms by name, and why the peer is missing (None when it runs or
    was not asked). ``slots``: how many context caches are in use at once (the
    rows of a decoding batch), each saved once for every codec."""
    from kvlib.peer import PEER_BITS, QuantoPeer, peer_name, peer_unavailable

    server = shared_server()
    transforms: dict[str, Any]
    if server is not None:
        shared = SharedContext(model_name, slots=slots)
        transforms = {c.name: ServerCacheRoundtrip(server, c, model_name, context=shared) for c in codecs}
    else:
        context = ContextFile(Path(workdir) / "context.safetensors", model_name, slots=slots)
        transforms = {c.name: CLICacheRoundtrip(Path(workdir) / f"scheme{i}", c, model_name, context=context)
                      for i, c in enumerate(codecs)}
    missing = peer_unavailable() if peers else None
    if peers and missing is None:
        for nbits in PEER_BITS:
            transforms[peer_name(nbits)] = QuantoPeer(nbits)
    return transforms, missing


def transform_spec(transform: Any) -> str | None:
    """What a transform computes, as a unit's key names it: the codec's canonical spec, or
    the peer's settings and optimum-quanto version; None for any other (never stored)."""
    codec = getattr(transform, "codec", None)
    if codec is not None:
        return codec.spec
    if hasattr(transform, "nbits"):
        from kvlib.peer import quanto_version

        return (f"quanto int{transform.nbits}, group {transform.q_group_size}, residual 0, "
                f"optimum-quanto {quanto_version()}")
    return None

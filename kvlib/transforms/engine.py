"""An engine's write path around kvlib's codec: what the engine does besides writing its cache
format that changes the numbers. Two things, for llama.cpp (0c1e57098, via llama-cpp-python
0.3.36):

- **Channel order.** convert_hf_to_gguf.py permutes each head's Q and K rows of a Llama-family
  model into interleaved pairs (LlamaModel.permute; transformers' GGUF loader undoes it,
  modeling_gguf_pytorch_utils.LlamaTensorProcessor), so llama.cpp's K blocks of 32 group other
  channels than kvlib's K: GGUF position p holds HF channel (p % 2) * D/2 + p // 2. K (and Q) go
  to the codec in the engine's order and come back in the model's.
- **The query.** With a quantized K, the CPU flash-attention kernel converts Q to the K type's
  dot-product format (q8_0; q8_1 for q4_1/q5_1, the same values) after rotating it as K
  (ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16_one_chunk); with an f16 K, to f16.
  Q goes through the codec as K would (``k=llama.cpp:q8_0[/norot]``, or ``llama.cpp:f16``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from kvlib.codec.spec import CodecConfig, Scheme, resolve_codec
from kvlib.transforms.base import CacheTransform, CodecRoundtrip

# GGUF architectures whose converter permutes Q/K into interleaved pairs (transformers reverses
# exactly these on load: TENSOR_PROCESSORS "llama" -> LlamaTensorProcessor).
PERMUTED_ARCHITECTURES = ("llama",)


def gguf_order(head_dim: int) -> torch.Tensor:
    """The engine's channel order of a permuted head: position p holds HF channel order[p]."""
    half = head_dim // 2
    return torch.tensor([(p % 2) * half + p // 2 for p in range(head_dim)])


def query_codec(key: Scheme) -> CodecConfig:
    """How llama.cpp converts Q for a K of scheme ``key``: f16 for f16 K, else q8_0 rotated as K."""
    if key.method == "llama.cpp:f16":
        return resolve_codec("k=llama.cpp:f16,v=none")
    return resolve_codec("k=llama.cpp:q8_0" + ("" if key.rotate else "/norot") + ",v=none")


class EngineWrite(CacheTransform):
    """Write mode as the engine computes it: ``inner`` writes K and V in the engine's channel order,
    and ``query`` (a round trip of the same kind) converts Q as the engine does."""

    kind: ClassVar[str] = "kvq"

    def __init__(self, inner: CodecRoundtrip, query: CodecRoundtrip | None, permuted: bool) -> None:
        self.inner, self.query, self.permuted = inner, query, permuted
        self.seconds = inner.seconds
        self.converts_queries = query is not None  # type: ignore[misc]

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property
    def spec(self) -> str:
        return self.inner.spec

    @property
    def key(self) -> str:
        return (f"{self.inner.key} | engine write path: query {self.query.spec if self.query else 'exact'}, "
                f"channel order {'gguf' if self.permuted else 'model'}")

    def _to_engine(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., gguf_order(x.shape[-1])].contiguous() if self.permuted else x

    def _to_model(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., torch.argsort(gguf_order(x.shape[-1]))].contiguous() if self.permuted else x

    def roundtrip_layer(self, layer: int, key: Any, value: Any) -> tuple[Any, Any, Any]:
        k, v, m = self.inner.roundtrip_layer(layer, self._to_engine(key), value)
        return self._to_model(k), v, m

    def query_layer(self, layer: int, query: torch.Tensor) -> torch.Tensor:
        """Q as the engine's attention reads it (exact when it converts none)."""
        if self.query is None:
            return query
        q, _, _ = self.query.roundtrip_layer(layer, self._to_engine(query), query[..., :1, :])  # V: "none"
        return self._to_model(q)


def engine_write(inner: CodecRoundtrip, make: Any, architecture: str | None) -> CacheTransform:
    """``inner`` wrapped with llama.cpp's write path when its key scheme is a llama.cpp format
    (``make(codec)`` builds the query's round trip of the same kind); else ``inner`` itself."""
    key = inner.codec.key
    if not key.method.startswith("llama.cpp:"):
        return inner
    return EngineWrite(inner, make(query_codec(key)), architecture in PERMUTED_ARCHITECTURES)

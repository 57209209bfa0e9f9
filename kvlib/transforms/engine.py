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

And for vLLM (0.33.0): with ``--kv-cache-dtype fp8``/``fp8_e4m3`` the FlashAttention backend (vLLM's
default on Hopper) quantizes Q to float8 e4m3 with its q_scale, which is 1.0 unless the checkpoint
has one (attention/attention.py:470-526; kv_cache.py:147-196 sets it to 1.0 even where it logs
"Setting it to k_scale"): ``k=vllm:fp8_e4m3,v=none``, Q clamped to +-448 and rounded. fp8_e5m2
and the per-token-head formats leave Q exact (attention.py:517; triton_attn.py:648-652). vLLM
keeps the model's channel order.

vLLM's TurboQuant presets never quantize Q (``supports_quant_query_input = False``,
v1/attention/backends/turboquant_attn.py:308): the MSE decode rotates Q by the same Hadamard in
float32 (triton_turboquant_decode.py:519-528), which the cache's read in the model's basis stands
for, and the FP8-key decode multiplies Q as it is, so Q stays exact. What they do change is which
layers are quantized: a TurboQuant cache keeps the first and last two layers of the model at the
model's dtype (TurboQuantConfig.get_boundary_skip_layers). kv-compress applies that rule to a whole
cache; write mode sends one layer at a time, so here those layers go through ``none`` instead
(``boundary_layers``, from kv-compress's menu; the model's layer count from ``write_cache``).

And for SGLang (0.5.10.post1): with ``fp8_e4m3`` its FlashAttention-3 backend (the default on Hopper)
casts Q with a plain ``q.to(torch.float8_e4m3fn)``, no scale, when head_dim <= 256
(srt/layers/attention/flashattention_backend.py): ``k=sglang:fp8_e4m3,v=none``, NaN past 464 as the
cast gives. fp8_e5m2 runs on the triton backend there; its Q is left exact here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, ClassVar

import torch

from kvlib.codec.spec import CodecConfig, Scheme, engine_menu, resolve_codec
from kvlib.transforms.base import CacheTransform, CodecRoundtrip

# GGUF architectures whose converter permutes Q/K into interleaved pairs (transformers reverses
# exactly these on load: TENSOR_PROCESSORS "llama" -> LlamaTensorProcessor).
PERMUTED_ARCHITECTURES = ("llama",)


def gguf_order(head_dim: int) -> torch.Tensor:
    """The engine's channel order of a permuted head: position p holds HF channel order[p]."""
    half = head_dim // 2
    return torch.tensor([(p % 2) * half + p // 2 for p in range(head_dim)])


def query_codec(key: Scheme) -> CodecConfig | None:
    """How the engine converts Q for a K of scheme ``key`` (None: it reads Q exactly). llama.cpp:
    f16 for an f16 K, else q8_0 rotated as K; vLLM: e4m3 at q_scale 1 for an fp8/fp8_e4m3 K; SGLang:
    torch's e4m3 cast for an fp8_e4m3 K; TensorRT-LLM: its satfinite E4M3 for an fp8 K."""
    if key.method == "llama.cpp:f16":
        return resolve_codec("k=llama.cpp:f16,v=none")
    if key.method.startswith("llama.cpp:"):
        return resolve_codec("k=llama.cpp:q8_0" + ("" if key.rotate else "/norot") + ",v=none")
    if key.method in ("vllm:fp8", "vllm:fp8_e4m3"):
        return resolve_codec("k=vllm:fp8_e4m3,v=none")
    if key.method == "sglang:fp8_e4m3":
        return resolve_codec("k=sglang:fp8_e4m3,v=none")
    if key.method == "trtllm:fp8":
        # FP8 context FMHA (on with paged context FMHA, which block reuse turns on by default) writes Q
        # as E4M3 with the KV multiplier; the PyTorch backend's is 1 (docs/research, TensorRT-LLM 1d)
        return resolve_codec("k=trtllm:fp8,v=none")
    return None


@lru_cache(maxsize=1)
def _boundary_by_method() -> dict[str, int]:
    """Each engine format's boundary rule (kv-compress's menu: an option's ``boundary_layers``, given
    to its K and V formats)."""
    out: dict[str, int] = {}
    for row in engine_menu("all"):
        for role in ("key_scheme", "value_scheme"):
            m = row[role]["method"]
            out[m] = max(out.get(m, 0), int(row.get("boundary_layers") or 0))
    return out


def boundary_layers(codec: CodecConfig) -> int:
    """How many layers at each end of the model the engine keeps unquantized when ``codec``'s K or V
    default is its format (vLLM's TurboQuant: 2); 0 for none."""
    table = _boundary_by_method()
    return max(table.get(codec.key.method, 0), table.get(codec.value.method, 0))


class EngineWrite(CacheTransform):
    """Write mode as the engine computes it: ``inner`` writes K and V in the engine's channel order,
    ``query`` (a round trip of the same kind) converts Q as the engine does, and with ``boundary``
    the first and last ``min(boundary, L/2)`` of the model's L layers go through ``skip`` (a ``none``
    round trip) instead, as the engine keeps them unquantized (``write_cache`` says L)."""

    kind: ClassVar[str] = "kvq"

    def __init__(self, inner: CodecRoundtrip, query: CodecRoundtrip | None, permuted: bool, boundary: int = 0,
                 skip: CodecRoundtrip | None = None, make: Any = None) -> None:
        self.inner, self.query, self.permuted = inner, query, permuted
        self.boundary, self.skip, self.num_layers = boundary, skip, None
        self.make, self._trips = make, {}  # round trips of boundary layers the spec overrides
        self.seconds = inner.seconds
        self.converts_queries = query is not None  # type: ignore[misc]

    def set_num_layers(self, n: int) -> None:
        """The model's layer count (``write_cache`` calls it before a written forward)."""
        self.num_layers = n

    def kept_exact(self, layer: int) -> bool:
        """Whether the engine keeps ``layer`` unquantized (a boundary layer)."""
        if not self.boundary:
            return False
        if self.num_layers is None:
            raise RuntimeError(f"{self.name}: the engine keeps boundary layers exact, but the model's layer count is unknown")
        n = min(self.boundary, self.num_layers // 2)
        return layer < n or layer >= self.num_layers - n

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property
    def spec(self) -> str:
        return self.inner.spec

    @property
    def key(self) -> str:
        return self.inner.key + write_path_key(self.query.codec if self.query else None, self.permuted, self.boundary)

    def _to_engine(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., gguf_order(x.shape[-1])].contiguous() if self.permuted else x

    def _to_model(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., torch.argsort(gguf_order(x.shape[-1]))].contiguous() if self.permuted else x

    def _overrides(self, layer: int) -> dict[str, Scheme]:
        """The spec's own per-layer schemes for ``layer`` ({role: scheme})."""
        return {o.role: o.scheme for o in self.inner.codec.layers if o.layer == layer}

    def _boundary_trip(self, layer: int) -> Any:
        """A boundary layer's round trip: ``none`` for its slots, but a slot the spec overrides keeps
        the user's scheme and its head overrides (as kv-compress's withEngineSkips does for a whole
        cache; a slot the engine keeps exact is exact whole)."""
        own = self._overrides(layer)
        if not own:
            return self.skip
        if layer not in self._trips:
            none = resolve_codec("none").key
            k, v = own.get("key", none), own.get("value", none)
            heads = "".join(f",{h.role[0]}{layer}h{h.head}={h.scheme.spec}" for h in self.inner.codec.heads
                            if h.layer == layer and h.role in own)
            self._trips[layer] = self.make(resolve_codec(f"k={k.spec},v={v.spec}{heads}"))
        return self._trips[layer]

    def roundtrip_layer(self, layer: int, key: Any, value: Any) -> tuple[Any, Any, Any]:
        if self.skip is not None and self.kept_exact(layer):
            trip = self._boundary_trip(layer)
            if trip is self.skip:
                return trip.roundtrip_layer(layer, key, value)
            k, v, m = trip.roundtrip_layer(layer, self._to_engine(key), value)
            return self._to_model(k), v, m
        k, v, m = self.inner.roundtrip_layer(layer, self._to_engine(key), value)
        return self._to_model(k), v, m

    def query_layer(self, layer: int, query: torch.Tensor) -> torch.Tensor:
        """Q as the engine's attention reads it (exact when it converts none, and on a layer the
        engine keeps unquantized: its attention runs in the model's dtype there)."""
        if self.query is None:
            return query
        if self.skip is not None and self.kept_exact(layer) and "key" not in self._overrides(layer):
            return query
        q, _, _ = self.query.roundtrip_layer(layer, self._to_engine(query), query[..., :1, :])  # V: "none"
        return self._to_model(q)


def write_path(codec: CodecConfig, architecture: str | None) -> tuple[CodecConfig | None, bool]:
    """The engine's write path for ``codec``: the query's conversion (None: exact) and whether K
    goes in GGUF's interleaved channel order (llama.cpp, on a Llama-architecture model)."""
    key = codec.key
    return query_codec(key), key.method.startswith("llama.cpp:") and architecture in PERMUTED_ARCHITECTURES


def write_path_key(query: CodecConfig | None, permuted: bool, boundary: int = 0) -> str:
    """What the write path adds to a unit's key ("" when it does nothing): known before anything loads."""
    if query is None and not permuted and not boundary:
        return ""
    kept = f", the first and last {boundary} layers unquantized" if boundary else ""
    return f" | engine write path: query {query.spec if query else 'exact'}, channel order {'gguf' if permuted else 'model'}{kept}"


def write_key(codec: CodecConfig, architecture: str | None) -> str:
    """``write_path_key`` of ``codec``'s whole write path."""
    return write_path_key(*write_path(codec, architecture), boundary_layers(codec))


def engine_write(inner: CodecRoundtrip, make: Any, architecture: str | None) -> CacheTransform:
    """``inner`` wrapped with its engine's write path when its key scheme is an engine format that
    converts Q or reorders channels (``make(codec)`` builds the query's round trip of the same
    kind); else ``inner`` itself."""
    query, permuted = write_path(inner.codec, architecture)
    boundary = boundary_layers(inner.codec)
    if query is None and not permuted and not boundary:
        return inner
    return EngineWrite(inner, make(query) if query is not None else None, permuted, boundary,
                       make(resolve_codec("none")) if boundary else None, make)

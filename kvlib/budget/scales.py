"""Calibrated static scales for the engines' per-tensor formats (vLLM's ``fp8``, ``fp8_e4m3``,
``fp8_e5m2``; SGLang's ``fp8_e4m3``, ``fp8_e5m2``; TensorRT-LLM's ``fp8``, ``int8``; the NVFP4
formats' global scale, ``vllm:nvfp4``, ``vllm:nvfp4_4over6``, ``trtllm:nvfp4``): the scale a quantized
checkpoint would carry, next to the 1.0 a user gets from the flag alone.

Rule: per layer and role, scale = amax / the format's max (kv-compress's ``scale_max``: 448 for e4m3,
6 * 448 for NVFP4, ModelOpt's amax / (6 * 448)) over the context caches of the calibration windows
(never the evaluated ones), as float32 — the static per-tensor rule of an FP8 ``kv_cache_scheme``
(llm-compressor's min-max observer, ModelOpt's amax export; their code did not run here). The
scales become per-layer overrides of the spec (``k3=vllm:fp8_e4m3/scale0.0123``), held across
windows as the engine holds them. The amax table is a unit of the results store: a finished sweep
reads it and loads no model.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

from kvlib.cache.layout import cache_layers, new_cache
from kvlib.codec.spec import CodecConfig, engine_menu, format_float32, resolve_codec
from kvlib.scoring.provenance import RunIdentity, ids_digest
from kvlib.scoring.store import ResultsStore, unit_key

CALIBRATED = "@calibrated"  # the name suffix of a codec with calibrated scales


@functools.cache
def format_max() -> dict[str, float]:
    """The largest value each static-scale engine format holds (what scale 1 saturates beyond), as
    kv-compress states it (schemes -engine all: scale_max)."""
    return {row["name"]: float(row["scale_max"]) for row in engine_menu("all") if row.get("scale_max")}


@functools.cache
def shared_scale() -> frozenset[str]:
    """The formats whose engine keeps one static scale per layer for K and V (TensorRT-LLM's
    max(k_scale, v_scale)): kv-compress's schemes -engine all, shared_scale."""
    return frozenset(row["name"] for row in engine_menu("all") if row.get("shared_scale"))


def takes_scales(codec: CodecConfig) -> bool:
    """A codec whose key or value format has a static per-tensor scale, and no per-layer overrides yet."""
    tops = format_max()
    return not codec.layers and (codec.key.method in tops or codec.value.method in tops)


def kv_amax(model: Any, ids: torch.Tensor, starts: list[int], length: int) -> list[tuple[float, float]]:
    """Per layer, the largest |K| and |V| in the context caches of windows [s, s + length)."""
    device = next(model.parameters()).device
    out: list[list[float]] = []
    with torch.no_grad():
        for s in starts:
            window = ids[:, s: s + length].to(device)
            cache = model(input_ids=window, past_key_values=new_cache(model), use_cache=True).past_key_values
            for i, (k, v) in enumerate(cache_layers(cache)):
                a = (float(k.abs().max()), float(v.abs().max()))
                if i == len(out):
                    out.append(list(a))
                else:
                    out[i] = [max(out[i][0], a[0]), max(out[i][1], a[1])]
    return [(k, v) for k, v in out]


def calibrated(codec: CodecConfig, amax: list[tuple[float, float]]) -> CodecConfig:
    """``codec`` with each layer's scale amax / format_max() (float32; of K and V together where the
    engine shares one scale; a role of a format without a static scale, or an all-zero layer, keeps
    its scheme)."""
    parts = [codec.spec]
    for layer, pair in enumerate(amax):
        for role, scheme, a in (("k", codec.key, pair[0]), ("v", codec.value, pair[1])):
            if scheme.method in shared_scale():
                a = max(pair)  # one scale for the layer's K and V
            top = format_max().get(scheme.method)
            if top is None or not a > 0:
                continue
            scale = np.float32(np.float32(a) / np.float32(top))
            parts.append(f"{role}{layer}={scheme.method}/scale{format_float32(float(scale))}")
    return resolve_codec(",".join(parts))


def calibrated_scales(codecs: list[CodecConfig], load: Callable[[], Any], ids: torch.Tensor, starts: list[int],
                      length: int, store: ResultsStore | None, identity: RunIdentity | None, say: Callable[..., None],
                      ) -> dict[str, CodecConfig]:
    """For each codec that takes static scales, its calibrated twin, by the twin's display name
    (``vllm:fp8_e4m3@calibrated``). The amax table is read from the store when there."""
    wanted = [c for c in codecs if takes_scales(c)]
    if not wanted:
        return {}
    key = None if identity is None else {
        "model": identity.model, "dtype": identity.dtype, "device": identity.device, "tokenizer": identity.tokenizer,
        "code": identity.code, "versions": identity.versions, "unit": "kv-amax", "tokens": ids_digest(ids),
        "starts": starts, "length": length}
    unit = store.get(unit_key(key)) if store is not None and key is not None else None
    if unit is not None:
        amax = [tuple(p) for p in unit["amax"]]
    else:
        say(f"Calibrating static scales (amax / format max per layer and role) on {len(starts)} windows of {length} tokens...")
        amax = kv_amax(load(), ids, starts, length)
        if store is not None and key is not None:
            store.put(key, {"amax": [list(p) for p in amax]})
    return {c.name + CALIBRATED: calibrated(c, amax) for c in wanted}

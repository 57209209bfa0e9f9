"""vLLM 0.33.0's own TurboQuant code on kv-compress's vector caches: the store launcher
``triton_turboquant_store`` (torch's norm and rotation GEMM on the CPU, then the Triton kernels
``_tq_fused_store_fp8`` / ``_tq_fused_store_mse`` in Triton's interpreter, TRITON_INTERPRET=1), the
rotation ``_build_hadamard_cached``, the midpoints as ``_ensure_on_device`` computes them, and the
read ``_tq_full_dequant_kv`` (tests/third_party/vllm_turboquant_*.py, verbatim from the wheel).

``python tests/vllm_turboquant_harness.py`` (needs ``triton``, which the project's environment does
not carry: a side environment with the project's packages and triton) writes
tests/vectors/vllm_turboquant_engine.json: for every TurboQuant tensor of the vector cases, the bytes
vLLM's store wrote for it and the float16 values vLLM's read gives back (in the rotated basis for
MSE keys, as attention reads them). tests/test_vllm_formats.py compares kv-compress's vectors with
that file, and reruns this harness where triton is importable.

Two things the interpreter does not do as a GPU does, and what is used instead:
- its fp32 -> float8e4nv cast rounds half up on the first dropped bit, loses the mantissa's carry
  into an odd exponent (1.9375 gives 1.0; Triton 3.8.0's _convert_float), mishandles subnormals and
  does not saturate, where SM90+ rounds to nearest even and saturates (cvt.rn.satfinite): the FP8
  keys (turboquant_k8v4) are recorded as torch's float8_e4m3fn cast after a clamp to +-448, which
  is that conversion;
- its tl.sum is numpy's pairwise sum, one of the orders a GPU might take (as torch's CPU norm and
  GEMM are for the store's rotation): the read's sum of squared centroids may differ from
  kv-compress's in-order sum in the last bit, the only difference the comparison allows for there.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
THIRD = HERE / "third_party"
OUT = HERE / "vectors" / "vllm_turboquant_engine.json"
F32 = np.float32


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, THIRD / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # config.py's dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def modules():
    """vLLM's code: (config, centroids, store, dequant). The Triton ones need TRITON_INTERPRET=1
    set before triton is first imported."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return (_load("vllm_turboquant_config"), _load("vllm_turboquant_centroids"), _load("vllm_turboquant_store"),
            _load("vllm_turboquant_dequant"))


def run_preset(key: np.ndarray, value: np.ndarray, dtype: str, preset: str) -> dict:
    """One layer's K and V ([batch, heads, tokens, head_dim] float32 values of a cache of ``dtype``)
    through vLLM's store and read. Returns per head vector, in kv-compress's order (batch, head,
    token): the K bytes and V bytes of each slot, and the read's float16 K (rotated basis for MSE
    keys) and V."""
    import torch

    config, centroids, store, dequant = modules()
    tdt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[dtype]
    b, h, t, d = key.shape
    n = b * t
    cfg = config.TurboQuantConfig.from_cache_dtype(preset, d)
    block = 16
    blocks = (n + block - 1) // block
    k = torch.from_numpy(np.ascontiguousarray(key)).to(tdt).permute(0, 2, 1, 3).reshape(n, h, d).contiguous()
    v = torch.from_numpy(np.ascontiguousarray(value)).to(tdt).permute(0, 2, 1, 3).reshape(n, h, d).contiguous()
    cache = torch.zeros(blocks, block, h, cfg.slot_size_aligned, dtype=torch.uint8)
    slot_mapping = torch.arange(n, dtype=torch.int32)
    # _ensure_on_device (turboquant_attn.py:455-473), on the CPU
    pit = _load("vllm_turboquant_attn")._build_hadamard_cached(d, "cpu")
    cents = centroids.get_centroids(d, cfg.centroid_bits).to(device="cpu", dtype=torch.float32)
    c_sorted, _ = cents.sort()
    midpoints = (c_sorted[:-1] + c_sorted[1:]) / 2
    store.triton_turboquant_store(k, v, cache, slot_mapping, pit, midpoints, mse_bits=cfg.key_mse_bits,
                                  key_packed_size=cfg.key_packed_size, value_quant_bits=cfg.effective_value_quant_bits,
                                  key_fp8=cfg.key_fp8)
    kps, vps = cfg.key_packed_size, cfg.value_packed_size
    slots = cache.reshape(blocks * block, h, -1)[:n]
    if cfg.key_fp8:  # SM90+'s cvt.rn.satfinite (see the module's docstring), not the interpreter's cast
        slots[:, :, :kps] = k.float().clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    # the read of the continuation prefill (turboquant_attn.py:998-1027)
    block_table = torch.arange(blocks, dtype=torch.int32).reshape(1, -1)
    k_out = torch.zeros(1, h, blocks * block, d, dtype=torch.float16)
    v_out = torch.zeros(1, h, blocks * block, d, dtype=torch.float16)
    dequant._tq_full_dequant_kv[(blocks * block, h)](
        cache, block_table, cents, k_out, v_out, k_out.stride(0), k_out.stride(1), k_out.stride(2), v_out.stride(0),
        v_out.stride(1), v_out.stride(2), cache.stride(0), cache.stride(1), cache.stride(2), block_table.stride(0),
        HEAD_DIM=d, BLOCK_SIZE=block, NUM_KV_HEADS=h, MSE_BYTES=math.ceil(d * cfg.key_mse_bits / 8) if not cfg.key_fp8 else d,
        KPS=kps, VQB=cfg.effective_value_quant_bits, VAL_DATA_BYTES=math.ceil(d * cfg.effective_value_quant_bits / 8),
        MSE_BITS=cfg.key_mse_bits, KEY_FP8=1 if cfg.key_fp8 else 0, BLOCK_D=1 << (d - 1).bit_length(),
        NORM_CORRECTION=1 if cfg.norm_correction else 0, FP8_E4B15=0, num_warps=4)

    def ours(x: torch.Tensor) -> np.ndarray:  # [n, h, ...] -> kv-compress's (batch, head, token) rows
        x = x.reshape(b, t, h, -1).permute(0, 2, 1, 3)
        return x.reshape(b * h * t, -1).contiguous().numpy()

    kread = k_out[0, :, :n].reshape(h, b, t, d).permute(1, 0, 2, 3).reshape(b * h * t, d)
    vread = v_out[0, :, :n].reshape(h, b, t, d).permute(1, 0, 2, 3).reshape(b * h * t, d)
    return {"key_bytes": ours(slots[:, :, :kps]), "value_bytes": ours(slots[:, :, kps:kps + vps]),
            "key_read": kread.numpy(), "value_read": vread.numpy()}


def _dense(num_layers: int):
    """A dense model's config as get_boundary_skip_layers reads it."""
    from types import SimpleNamespace

    return SimpleNamespace(is_hybrid=False, hf_text_config=SimpleNamespace(num_hidden_layers=num_layers))


def boundary_layers(num_layers: int) -> list[int]:
    """vLLM's own boundary rule (config.py:177-213) for a dense model of ``num_layers`` layers."""
    config = _load("vllm_turboquant_config")
    return [int(i) for i in config.TurboQuantConfig.get_boundary_skip_layers(_dense(num_layers))]


def preset_of(case: dict) -> str | None:
    """The TurboQuant preset a vector case's spec starts with, if any."""
    import vllm_reference as vr

    for preset in vr.TURBOQUANT:
        if case["spec"].startswith(vr.tq_spec(preset)):
            return preset
    return None


def build(cases: list[dict]) -> dict:
    """The engine's output for every layer of every TurboQuant case that quantizes it."""
    import vllm_reference as vr
    from kvq_reference import decode

    out = []
    for c in cases:
        preset = preset_of(c)
        if preset is None or "error" in c:
            continue
        ts = {t["name"]: t for t in c["tensors"]}
        for kname in (n for n in ts if n.endswith("_key")):
            kt, vt = ts[kname], ts[kname.replace("_key", "_value")]
            if (kt.get("format"), vt.get("format")) != tuple(f"vllm:{f}" for f in vr.TURBOQUANT[preset]):
                continue  # a boundary layer (none), or a slot set apart
            x = {r: decode(bytes.fromhex(t["input_hex"]), t["dtype"]).reshape(t["shape"]) for r, t in (("key", kt), ("value", vt))}
            got = run_preset(x["key"], x["value"], kt["dtype"], preset)
            out.append({"case": c["name"], "layer": kname.removesuffix("_key"), "preset": preset,
                        "key_hex": got["key_bytes"].tobytes().hex(), "value_hex": got["value_bytes"].tobytes().hex(),
                        "key_read_hex": got["key_read"].astype("<f2").tobytes().hex(),
                        "value_read_hex": got["value_read"].astype("<f2").tobytes().hex()})
    return {"vllm_version": "vLLM 0.33.0 (wheel, commit 4ba787ec9)", "centroids": centroid_tables(),
            "boundary_layers": {str(n): boundary_layers(n) for n in (1, 2, 3, 4, 5, 6, 32, 61)}, "layers": out}


TABLES = [(d, b) for d in (16, 32, 64, 128, 256, 512) for b in (3, 4)]


def centroid_tables() -> dict[str, list[str]]:
    """get_centroids(d, b) of vLLM's own solver (centroids.py, verbatim) as float32 bits, "d/b" each."""
    centroids = _load("vllm_turboquant_centroids")
    return {f"{d}/{b}": [f"{u:08x}" for u in centroids.get_centroids(d, b).numpy().view(np.uint32)] for d, b in TABLES}


def main() -> None:
    sys.path.insert(0, str(HERE))
    cases = json.loads((HERE / "vectors" / "engine_vectors.json").read_text())["cases"]
    OUT.write_text(json.dumps(build(cases), indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

"""vLLM 0.33.0's own per-token-head writers on kv-compress's vector caches, in Triton's interpreter
(TRITON_INTERPRET=1) on the CPU: the launcher triton_reshape_and_cache_flash_per_token_head_quant
and its kernel _reshape_cache_per_token_head (int8_per_token_head, fp8_per_token_head;
tests/third_party/vllm_per_token_head.py), and reshape_and_cache_int4 (int4_per_token_head: vLLM's
torch RHT, then the kernel _reshape_cache_int4_kernel; tests/third_party/vllm_int4_store.py), all
verbatim from the wheel; and the Triton attention backend's per-tensor write of fp8, fp8_e4m3 and
fp8_e5m2, triton_reshape_and_cache_flash and its kernel reshape_and_cache_kernel_flash
(tests/third_party/vllm_reshape_and_cache_flash.py), whose launcher is told it runs on SM90.

``python tests/vllm_triton_harness.py`` (needs ``triton``, which the project's environment does not
carry: a side environment with the project's packages and triton) writes
tests/vectors/vllm_per_token_head_engine.json: for every tensor of the vector cases that one of the
three formats quantizes, the bytes vLLM's writer stored for each head vector, as its paged cache
holds them ([codes | float32 scale] per token and head: TritonAttentionBackend.customize_spec and
_ensure_scale_caches, triton_attn.py:307-319, 413-472), in kv-compress's order (batch, head, token).
tests/test_vllm_formats.py compares kv-compress's vectors with that file, and reruns this harness
where triton is importable. The per-tensor formats' bytes are recorded likewise, one code per
element in the cache's order. The read is not run: vLLM dequantizes these caches inside its attention
kernels (unified_attention's per-token-head branches, _attn_packed for int4), with no read kernel of
its own.

What the interpreter does not do as a GPU does, and what is used instead:
- its fp32 -> float8e4nv conversion (triton/runtime/interpreter.py _convert_float, Triton 3.8.0)
  rounds half up on the first dropped bit, loses the mantissa's carry into an odd exponent (1.9375
  gives 1.0) and mishandles subnormals, where SM89+ converts with cvt.rn.satfinite (round to
  nearest even, saturating). The fp32 -> fp8 conversions here, the stores of fp8_per_token_head's
  codes (after the kernel's own clamp to +-448) and of the per-tensor formats' x / scale, are
  therefore made torch's float8_e4m3fn cast after a clamp to +-448 (that conversion; the TurboQuant
  harness's substitution for its FP8 keys): the interpreter's builder is patched for that one pair
  of types while a kernel runs. The file records how many code bytes the interpreter's own cast
  would have given otherwise. The Triton backend converts to e4m3 for fp8_e5m2 as well: its cache
  is viewed as current_platform.fp8_dtype(), float8_e4m3fn (triton_attn.py:542, 826-831; the
  launcher's :423-435), so its fp8_e5m2 bytes are e4m3 codes, not the e5m2 codes kv-compress writes
  as FlashInfer's CUDA writer does.
- it computes int4's ``k * inv_k + k_zp_f`` as a product and a sum (numpy, two roundings) where the
  GPU, with Triton's default fp fusion (LLVM's contraction, ptxas --fmad), computes one fma.rn.f32;
  kv-compress takes the fused form. On these vectors the two differ at 2 of 9,920 codes, where the
  unfused sum lands exactly on a tie; the file keeps the interpreter's codes, and
  tests/test_vllm_formats.py recomputes each of the 2 both ways and allows those alone.
- its divisions are IEEE (numpy), as kv-compress's are; the GPU's div.full.f32 may differ by 2 ulp.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
THIRD = HERE / "third_party"
OUT = HERE / "vectors" / "vllm_per_token_head_engine.json"
FORMATS = ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")
FILES = {  # tests/third_party/README.md
    "vllm_per_token_head.py": "0b8ae4dfd46d05849fdc272bbdb6e5392eca78b2cfc774bd60c79e02eeb004f9",
    "vllm_int4_store.py": "28f2430eb11322c34736973ccca2ceee42d60ad67432d91ae6eade53132cd6d3",
    "vllm_int4_rht.py": "9883ea18ef7016e44d2fba770ab4f14b609de51b3d20eece1403fda6df9e6d58",
    "vllm_reshape_and_cache_flash.py": "73630a68521c5e5bda6612a2bc89f5f241c0c8a3f1d9f66788d999281102bacc",
}
PER_TENSOR = ("fp8", "fp8_e4m3", "fp8_e5m2")
BLOCK = 16  # the paged cache's block size (a multiple of 16, TritonAttentionBackend)


def _load(name: str):
    path = THIRD / f"{name}.py"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == FILES[path.name], path
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def modules():
    """vLLM's code: (per_token_head, int4_store, reshape_and_cache_flash). Needs TRITON_INTERPRET=1
    set before triton is first imported."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    _load("vllm_int4_rht")
    return _load("vllm_per_token_head"), _load("vllm_int4_store"), _load("vllm_reshape_and_cache_flash")


@contextlib.contextmanager
def gpu_fp8_conversion(enabled: bool = True):
    """While open, the interpreter converts fp32 to float8e4nv as SM89+'s cvt.rn.satfinite does
    (torch's float8_e4m3fn cast after a clamp to +-448; a NaN stays the NaN 0x7f), not with its own
    _convert_float (see the module's docstring). Every other conversion is the interpreter's."""
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    own = builder.create_fp_to_fp

    def satfinite(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
            x = torch.from_numpy(np.ascontiguousarray(src.data, np.float32))
            codes = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            return interpreter.TensorHandle(codes.view(interpreter._get_np_dtype(dst_type)), dst_type.scalar)
        return own(self, src, dst_type, rounding_mode)

    if enabled:
        builder.create_fp_to_fp = satfinite
    try:
        yield
    finally:
        builder.create_fp_to_fp = own


def _caches(kv_cache):
    """The per-token-head views of a packed cache (num_blocks, num_kv_heads, block_size, 2 * (hs +
    4)) as vLLM takes them: TritonAttentionImpl._ensure_scale_caches (triton_attn.py:413-472) for the
    float32 scales at byte hs of each half, _pth_key_value_caches (:794-803) for the data."""
    import torch

    num_blocks, nkv, block_size, content = kv_cache.shape
    hs = content // 2 - 4  # one-byte cache dtypes: a float32 scale is 4 elements
    base = torch.tensor([], dtype=torch.float32).set_(kv_cache.untyped_storage())
    b, h, s = (st // 4 for st in kv_cache.stride()[:3])  # bytes (one-byte dtypes) in float32 units
    k_scale = torch.as_strided(base, (num_blocks, block_size, nkv), (b, s, h), hs // 4)
    v_scale = torch.as_strided(base, (num_blocks, block_size, nkv), (b, s, h), (content // 2 + hs) // 4)
    k_scale.fill_(1.0)
    v_scale.fill_(1.0)
    key_cache, value_cache = kv_cache.transpose(1, 2).split(content // 2, dim=-1)
    return key_cache[..., :hs], value_cache[..., :hs], k_scale, v_scale


def _by_token(x: np.ndarray, dtype: str):
    """A [batch, heads, tokens, head_dim] tensor as the cache's dtype, [batch * tokens, heads, head_dim]:
    the layout vLLM's writers take (one row a token)."""
    import torch

    b, h, t, d = x.shape
    tdt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[dtype]
    return torch.from_numpy(np.ascontiguousarray(x)).to(tdt).permute(0, 2, 1, 3).reshape(b * t, h, d).contiguous()


def run_layer(key: np.ndarray, value: np.ndarray, dtype: str, fmt: str, gpu_fp8: bool = True) -> dict[str, np.ndarray]:
    """One layer's K and V ([batch, heads, tokens, head_dim] float32 values of a cache of ``dtype``)
    through vLLM's writer for ``fmt``. Returns per role the stored bytes of each head vector ([codes |
    float32 scale]), in kv-compress's order (batch, head, token)."""
    import torch

    pth, int4, _ = modules()
    b, h, t, d = key.shape
    n, blocks = b * t, (b * t + BLOCK - 1) // BLOCK
    k, v = _by_token(key, dtype), _by_token(value, dtype)
    hs = d // 2 if fmt == "int4_per_token_head" else d
    # STR_DTYPE_TO_TORCH_DTYPE (utils/torch_utils.py:50-52): int8 for int8, uint8 for fp8 and int4
    cache_dtype = torch.int8 if fmt == "int8_per_token_head" else torch.uint8
    kv_cache = torch.zeros(blocks, h, BLOCK, 2 * (hs + 4), dtype=cache_dtype)
    key_cache, value_cache, k_scale, v_scale = _caches(kv_cache)
    slot_mapping = torch.arange(n, dtype=torch.int64)
    if fmt == "int4_per_token_head":
        int4.reshape_and_cache_int4(k, v, key_cache, value_cache, slot_mapping, k_scale_cache=k_scale, v_scale_cache=v_scale)
    else:
        if fmt == "fp8_per_token_head":  # _pth_key_value_caches retypes the data as the fp8 dtype
            key_cache, value_cache = key_cache.view(pth.FP8_DTYPE), value_cache.view(pth.FP8_DTYPE)
        mode = pth.KVQuantMode.INT8_PER_TOKEN_HEAD if fmt == "int8_per_token_head" else pth.KVQuantMode.FP8_PER_TOKEN_HEAD
        with gpu_fp8_conversion(gpu_fp8):
            pth.triton_reshape_and_cache_flash_per_token_head_quant(k, v, key_cache, value_cache, k_scale, v_scale, slot_mapping,
                                                                    kv_quant_mode=mode)
    raw = kv_cache.view(torch.uint8).permute(0, 2, 1, 3).reshape(blocks * BLOCK, h, -1)[:n]  # [token, head, content]

    def ours(x: torch.Tensor) -> np.ndarray:  # [n, h, ...] -> kv-compress's (batch, head, token) rows
        return x.reshape(b, t, h, -1).permute(0, 2, 1, 3).reshape(b * h * t, -1).contiguous().numpy()

    return {"key": ours(raw[:, :, :hs + 4]), "value": ours(raw[:, :, hs + 4:])}


def run_per_tensor(key: np.ndarray, value: np.ndarray, dtype: str, fmt: str, k_scale: float, v_scale: float,
                   gpu_fp8: bool = True) -> dict[str, np.ndarray]:
    """One layer's K and V through the Triton backend's write of the per-tensor format ``fmt`` with
    the layer's static scales: per role one code byte per element, in the cache's order."""
    import torch

    flash = modules()[2]
    b, h, t, d = key.shape
    n, blocks = b * t, (b * t + BLOCK - 1) // BLOCK
    k, v = _by_token(key, dtype), _by_token(value, dtype)
    # do_kv_cache_update (triton_attn.py:826-831): the (num_blocks, heads, block_size, 2 * head_size)
    # cache split into K and V and viewed as the platform's fp8 dtype
    kv_cache = torch.zeros(blocks, h, BLOCK, 2 * d, dtype=torch.uint8)
    key_cache, value_cache = kv_cache.transpose(1, 2).split(d, dim=-1)
    key_cache, value_cache = key_cache.view(flash.current_platform.fp8_dtype()), value_cache.view(flash.current_platform.fp8_dtype())
    scales = (torch.tensor([k_scale], dtype=torch.float32), torch.tensor([v_scale], dtype=torch.float32))
    capability = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: (9, 0)  # the launcher's question (:445): SM90
    try:
        with gpu_fp8_conversion(gpu_fp8):
            flash.triton_reshape_and_cache_flash(k, v, key_cache, value_cache, torch.arange(n, dtype=torch.int64), fmt, *scales)
    finally:
        torch.cuda.get_device_capability = capability
    raw = kv_cache.permute(0, 2, 1, 3).reshape(blocks * BLOCK, h, 2 * d)[:n]

    def ours(x: torch.Tensor) -> np.ndarray:
        return x.reshape(b, t, h, -1).permute(0, 2, 1, 3).reshape(b * h * t, -1).contiguous().numpy()

    return {"key": ours(raw[:, :, :d]), "value": ours(raw[:, :, d:])}


def static_scale(spec: str, role: str) -> float:
    """A per-tensor format's scale for ``role`` in a vector case's spec (/scaleS; 1 without one)."""
    for part in spec.split(","):
        if part.startswith(f"{role[0]}=") or "=" not in part:
            if "/scale" in part:
                return float(np.float32(part.split("/scale")[1]))
    return 1.0


def layers(cases: list[dict], formats=FORMATS):
    """(case, layer, {role: tensor}, format) of every layer whose tensors one of FORMATS quantizes;
    a role of another format is left out."""
    for c in cases:
        if "error" in c:
            continue
        ts = {t["name"]: t for t in c["tensors"]}
        for layer in dict.fromkeys(name.rsplit("_", 1)[0] for name in ts):
            for fmt in formats:
                mine = {r: ts[f"{layer}_{r}"] for r in ("key", "value") if ts.get(f"{layer}_{r}", {}).get("format") == f"vllm:{fmt}"}
                if mine:
                    yield c, layer, mine, fmt


def build(cases: list[dict]) -> dict:
    """The engine's bytes for every tensor of ``cases`` that FORMATS quantize."""
    from kvq_reference import decode

    out, differs, of = [], 0, 0
    for c, layer, roles, fmt in layers(cases):
        x = {r: decode(bytes.fromhex(t["input_hex"]), t["dtype"]).reshape(t["shape"]) for r, t in roles.items()}
        # a role alone in its format: the same values as the other role too (its bytes are not kept)
        key, value = x.get("key", x.get("value")), x.get("value", x.get("key"))
        dtype = next(iter(roles.values()))["dtype"]
        got = run_layer(key, value, dtype, fmt)
        for r in roles:
            out.append({"case": c["name"], "tensor": f"{layer}_{r}", "format": fmt, "hex": got[r].tobytes().hex()})
        if fmt == "fp8_per_token_head":  # what the interpreter's own fp32 -> float8e4nv cast gives instead
            own = run_layer(key, value, dtype, fmt, gpu_fp8=False)
            for r in roles:
                d = key.shape[-1]
                differs += int(np.sum(own[r][:, :d] != got[r][:, :d]))
                of += got[r][:, :d].size
    per_tensor, pt_differs, pt_of = [], 0, 0
    for c, layer, roles, fmt in layers(cases, PER_TENSOR):
        x = {r: decode(bytes.fromhex(t["input_hex"]), t["dtype"]).reshape(t["shape"]) for r, t in roles.items()}
        key, value = x.get("key", x.get("value")), x.get("value", x.get("key"))
        sc = {r: static_scale(c["spec"], r) for r in ("key", "value")}
        args = (key, value, next(iter(roles.values()))["dtype"], fmt, sc["key"], sc["value"])
        got, own = run_per_tensor(*args), run_per_tensor(*args, gpu_fp8=False)
        for r in roles:
            per_tensor.append({"case": c["name"], "tensor": f"{layer}_{r}", "format": fmt, "scale": sc[r], "hex": got[r].tobytes().hex()})
            pt_differs += int(np.sum(own[r] != got[r]))
            pt_of += got[r].size
    import triton

    return {"vllm_version": "vLLM 0.33.0 (wheel, commit 4ba787ec9)", "triton_version": triton.__version__,
            "fp8_codes_the_interpreters_own_cast_changes": {"bytes": differs, "of": of}, "tensors": out,
            "per_tensor_codes_the_interpreters_own_cast_changes": {"bytes": pt_differs, "of": pt_of}, "per_tensor": per_tensor}


def main() -> None:
    sys.path.insert(0, str(HERE))
    cases = json.loads((HERE / "vectors" / "engine_vectors.json").read_text())["cases"]
    OUT.write_text(json.dumps(build(cases), indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

"""
Copyright 2023-2024 SGLang Team
Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
"""

# Copied verbatim from sglang/srt/mem_cache/memory_pool.py in the sglang-0.5.10.post1 wheel
# (py3-none-any), lines 1-14 (the license), 16 (the __future__ import), 89-123 (_set_kv_buffer_impl)
# and 967-1032 (MHATokenToKVPool's cache accessors and set_kv_buffer, the write of
# --kv-cache-dtype fp8_e4m3 / fp8_e5m2), under a class line of kvlib's; and get_is_capture_mode,
# which _set_kv_buffer_impl imports, from sglang/srt/model_executor/cuda_graph_runner.py:357-362.
# Only the names they import are defined here instead, with their values off CUDA: _is_cuda and
# _is_hip (false: the plain `k_cache[indices] = k` write, not the store_cache JIT kernel, which on
# CUDA copies the same rows of bytes, jit_kernel/csrc/elementwise/kvcache.cuh), can_use_store_cache
# and store_cache (not reached off CUDA); the module _set_kv_buffer_impl imports
# get_is_capture_mode from is put in sys.modules by tests/test_sglang_formats.py while it runs. Not
# copied: KVCache.__init__ and MHATokenToKVPool.__init__ (memory_pool.py:646-684, 743-796), which
# set the attributes these methods read; tests/test_sglang_formats.py sets them as those lines do.
# ruff: noqa
# fmt: off
from __future__ import annotations

from typing import Any, Optional

import torch

_is_cuda = False
_is_hip = False


def can_use_store_cache(size: int) -> bool:  # sglang/jit_kernel/kvcache.py: a CUDA JIT kernel
    raise NotImplementedError("not reached off CUDA")


def store_cache(*args, **kwargs) -> None:  # sglang/jit_kernel/kvcache.py: a CUDA JIT kernel
    raise NotImplementedError("not reached off CUDA")


# sglang/srt/model_executor/cuda_graph_runner.py:357-362, verbatim
# Detect whether the current forward pass is in capture mode
is_capture_mode = False


def get_is_capture_mode():
    return is_capture_mode


# sglang/srt/mem_cache/memory_pool.py:89-123, verbatim
def _set_kv_buffer_impl(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    row_dim: int,  # head_num * head_dim
    store_dtype: torch.dtype,
    device_module: Any,
    alt_stream: Optional[torch.cuda.Stream] = None,
    same_kv_dim: bool = True,
) -> None:
    row_bytes = row_dim * store_dtype.itemsize
    if (_is_cuda or _is_hip) and same_kv_dim and can_use_store_cache(row_bytes):
        return store_cache(
            k.view(-1, row_dim),
            v.view(-1, row_dim),
            k_cache.view(-1, row_dim),
            v_cache.view(-1, row_dim),
            indices,
            row_bytes=row_bytes,
        )

    from sglang.srt.model_executor.cuda_graph_runner import get_is_capture_mode

    if get_is_capture_mode() and alt_stream is not None:
        current_stream = device_module.current_stream()
        alt_stream.wait_stream(current_stream)
        k_cache[indices] = k
        with device_module.stream(alt_stream):
            v_cache[indices] = v
        current_stream.wait_stream(alt_stream)
    else:  # fallback to naive implementation
        k_cache[indices] = k
        v_cache[indices] = v


class MHATokenToKVPool:  # kvlib's line (memory_pool.py:741 has MHATokenToKVPool(KVCache)); 967-1032 verbatim
    def _get_key_buffer(self, layer_id: int):
        # for internal use of referencing
        if self.store_dtype != self.dtype:
            return self.k_buffer[layer_id - self.start_layer].view(self.dtype)
        return self.k_buffer[layer_id - self.start_layer]

    def get_key_buffer(self, layer_id: int):
        # note: get_key_buffer is hooked with synchronization for layer-wise KV cache loading
        # it is supposed to be used only by attention backend not for information purpose
        # same applies to get_value_buffer and get_kv_buffer
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)
        return self._get_key_buffer(layer_id)

    def _get_value_buffer(self, layer_id: int):
        # for internal use of referencing
        if self.store_dtype != self.dtype:
            return self.v_buffer[layer_id - self.start_layer].view(self.dtype)
        return self.v_buffer[layer_id - self.start_layer]

    def get_value_buffer(self, layer_id: int):
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)
        return self._get_value_buffer(layer_id)

    def get_kv_buffer(self, layer_id: int):
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(
        self,
        layer: RadixAttention,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        layer_id_override: Optional[int] = None,
    ):
        if layer_id_override is not None:
            layer_id = layer_id_override
        else:
            layer_id = layer.layer_id
        if cache_k.dtype != self.dtype:
            if k_scale is not None:
                cache_k.div_(k_scale)
            if v_scale is not None:
                cache_v.div_(v_scale)
            cache_k = cache_k.to(self.dtype)
            cache_v = cache_v.to(self.dtype)

        if self.store_dtype != self.dtype:
            cache_k = cache_k.view(self.store_dtype)
            cache_v = cache_v.view(self.store_dtype)

        _set_kv_buffer_impl(
            cache_k,
            cache_v,
            self.k_buffer[layer_id - self.start_layer],
            self.v_buffer[layer_id - self.start_layer],
            loc,
            row_dim=self.row_dim,
            store_dtype=self.store_dtype,
            device_module=self.device_module,
            alt_stream=self.alt_stream,
            same_kv_dim=self.same_kv_dim,
        )

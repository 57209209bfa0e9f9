# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
# Copied verbatim from vllm/v1/attention/backends/turboquant_attn.py in the vllm-0.33.0 wheel
# (commit 4ba787ec9), lines 115-120 (_build_hadamard_cached: the rotation PiT the store and the
# decode use). Only its imports are written here.
# ruff: noqa
# fmt: off

import functools
import math

import torch


@functools.cache
def _build_hadamard_cached(d: int, device_str: str) -> torch.Tensor:
    H = torch.tensor([[1.0]])
    while H.shape[0] < d:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    return (H / math.sqrt(d)).to(torch.device(device_str))

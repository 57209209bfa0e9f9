# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
# Copied verbatim from vllm/v1/attention/ops/int4_per_token_head.py in the vllm-0.33.0 wheel
# (commit 4ba787ec9), lines 1074-1167: fast_hadamard_transform, _get_rht_signs and single_rht, the
# pure-torch path vLLM runs without CUDA. Only the names they import are defined here instead:
# _hadacore_available (false: no CUDA), _TRITON_HADAMARD_* (unused off CUDA) and
# largest_power_of_2_divisor (vllm/utils/math_utils.py:37-39, verbatim).
# ruff: noqa
# fmt: off

import torch

_TRITON_HADAMARD_MIN_D, _TRITON_HADAMARD_MAX_D = 16, 128


def _hadacore_available() -> bool:
    return False


def largest_power_of_2_divisor(n: int) -> int:
    """Return the largest power-of-2 that divides *n* (isolate lowest set bit)."""
    return n & (-n)


# Public API
def fast_hadamard_transform(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized Walsh-Hadamard Transform along the last dimension.

    H_d × x where H_d × H_d = d × I.  Last dim must be a power of 2.

    Three-tier dispatch:
      1. Hadacore CUDA Tensor Core kernel (sm_80+).
      2. Triton MMA matmul kernel (CUDA fallback + ROCm MFMA/WMMA path).
      3. PyTorch butterfly (CPU and any GPU/dtype combo Triton can't take).
    """
    d = x.shape[-1]
    assert d & (d - 1) == 0, f"Requires power-of-2 dim, got {d}"

    # Tier 1 — hadacore on CUDA.
    if _hadacore_available() and 0 < d <= (1 << 15):
        from vllm import _custom_ops as ops

        # hadacore returns x @ (H/√d); rescale to the unnormalized H × x
        # convention the INT4 scale math is calibrated to.
        rescale = d**0.5
        if x.dtype in (torch.float16, torch.bfloat16):
            y = ops.hadacore_transform(x.contiguous().clone(), inplace=True)
            return y * rescale
        # fp32 → bf16 round-trip; precision loss is irrelevant before
        # INT4 quantization.
        orig_dtype = x.dtype
        x_bf16 = x.contiguous().to(torch.bfloat16)
        y_bf16 = ops.hadacore_transform(x_bf16, inplace=True)
        return y_bf16.to(orig_dtype) * rescale

    # Tier 2 — Triton MMA kernel (covers ROCm via MFMA/WMMA codegen, and
    # also CUDA when hadacore is unavailable).
    if (
        x.is_cuda
        and _TRITON_HADAMARD_MIN_D <= d <= _TRITON_HADAMARD_MAX_D
        and x.dtype in (torch.float16, torch.bfloat16, torch.float32)
    ):
        return _triton_hadamard_transform(x)

    # Tier 3 — PyTorch butterfly (CPU / unsupported dtype / D < 16).
    h = 1
    while h < d:
        xv = x.view(*x.shape[:-1], d // (2 * h), 2, h)
        a = xv[..., 0, :]
        b = xv[..., 1, :]
        x = torch.stack([a + b, a - b], dim=-2).reshape(x.shape)
        h <<= 1
    return x


# Randomized Hadamard Transform (used by INT4)
# Deterministic ±1 signs for Randomized Hadamard Transform.
# RHT = H × D × x  (sign flip + Hadamard).  Breaks residual structure
# in KV vectors, improving quantization quality.
_RHT_SIGNS_CACHE: dict[tuple[int, int, str], torch.Tensor] = {}


def _get_rht_signs(d: int, round_idx: int, device: torch.device) -> torch.Tensor:
    """Return a cached deterministic ±1 sign vector of length *d*."""
    key = (d, round_idx, str(device))
    if key not in _RHT_SIGNS_CACHE:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(0x9E3779B9 + round_idx * 0x517CC1B7)
        signs = (
            2.0 * torch.bernoulli(torch.full((d,), 0.5, device="cpu"), generator=gen)
            - 1.0
        )
        _RHT_SIGNS_CACHE[key] = signs.to(device)
    return _RHT_SIGNS_CACHE[key]


def single_rht(x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Single Randomized Hadamard Transform: H × D₁ × x.

    Used by INT4 per-token-head quantization to gaussianize data
    before asymmetric quantization.
    """
    d = x.shape[-1]
    block = largest_power_of_2_divisor(d)
    if block < d:
        # H is only defined for power-of-two rows, so apply it
        # block-diagonally: H_b inside each of the d / b blocks, for b the
        # largest power-of-two divisor of d.  That keeps H @ H.T = b * I
        # without padding the row, hence the norm is sqrt(b), not sqrt(d).
        lead = x.shape[:-1]
        return single_rht(x.reshape(*lead, d // block, block), inverse).reshape(
            *lead, d
        )
    d1 = _get_rht_signs(d, 0, x.device)
    if inverse:
        return fast_hadamard_transform(x) * d1
    else:
        return fast_hadamard_transform(x * d1)

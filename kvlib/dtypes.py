"""One table of the floating-point types kvlib handles (as safetensors keeps its ``_TYPES``):
a model's precision, what a cache file stores, and what the codec server's segments carry."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DType:
    """A type by its names: kvlib's (``float32``), torch's and safetensors' (``F32``)."""

    name: str
    torch: torch.dtype
    safetensors: str
    itemsize: int
    stored: str  # the type a cache file and the codec hold it as (bfloat16 travels as float32)


TYPES = (
    DType("float32", torch.float32, "F32", 4, "float32"),
    DType("float16", torch.float16, "F16", 2, "float16"),
    DType("bfloat16", torch.bfloat16, "BF16", 2, "float32"),
)
BY_NAME = {t.name: t for t in TYPES}
BY_TORCH = {t.torch: t for t in TYPES}
BY_SAFETENSORS = {t.safetensors: t for t in TYPES}
MODEL_DTYPES = tuple(t.name for t in TYPES)  # what --dtype takes (with "auto")


def stored(dt: torch.dtype) -> DType:
    """The entry a tensor of ``dt`` is saved and sent as (anything else: float32)."""
    return BY_NAME[BY_TORCH[dt].stored] if dt in BY_TORCH else BY_NAME["float32"]


def torch_dtype(name: str) -> torch.dtype:
    """``float32`` etc. as a torch dtype; ValueError names the choices."""
    if name not in BY_NAME:
        raise ValueError(f"dtype {name!r}: choose one of {', '.join(MODEL_DTYPES)}")
    return BY_NAME[name].torch


def dtype_name(dt: torch.dtype) -> str:
    """kvlib's name of a torch dtype (``float32``)."""
    return str(dt).removeprefix("torch.")


def resolve_dtype(dtype: str | None, device: str) -> torch.dtype:
    """float32 on CPU and float16 on CUDA unless asked; ValueError names the choices."""
    if dtype is None or dtype == "auto":
        return torch.float16 if device.startswith("cuda") else torch.float32
    return torch_dtype(dtype)

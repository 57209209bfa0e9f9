"""Order-0 entropy of a compressed file's quantization codes (bits per code),
for make bench to print beside the lossless stage's result: how close an
entropy coder of independent codes could get."""

from __future__ import annotations

import json

import numpy as np
from safetensors import safe_open

# ggml blocks: (bytes per block, offset of qh or None, offset of the 16 nibble bytes or None, q8 offset)
GGML = {"q4_0": (18, None, 2), "q4_1": (20, None, 4), "q5_0": (22, 2, 6), "q5_1": (24, 4, 8), "q8_0": (34, None, None)}


def _entropy(codes: np.ndarray) -> float:
    _, counts = np.unique(codes, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def _unpack(raw: np.ndarray, bits: int) -> np.ndarray:
    b = np.unpackbits(raw, bitorder="little")
    n = b.size // bits
    return (b[: n * bits].reshape(n, bits) << np.arange(bits, dtype=np.uint8)).sum(1)


def _ggml_codes(raw: np.ndarray, method: str) -> np.ndarray:
    size, qh_at, qs_at = GGML[method]
    blocks = raw.reshape(-1, size)
    if method == "q8_0":
        return blocks[:, 2:].reshape(-1)
    qs = blocks[:, qs_at : qs_at + 16]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    if qh_at is not None:
        qh = np.unpackbits(blocks[:, qh_at : qh_at + 4], axis=1, bitorder="little")
        q = q | (qh << 4)
    return q.reshape(-1)


def code_entropy(path: str) -> float:
    """Bits per code of the pooled codes of every tensor of a (non-lossless) kvq file."""
    with safe_open(path, "np") as f:
        infos = json.loads(f.metadata()["kvq.tensors"])
        codes = []
        for ti in infos:
            raw = f.get_tensor(ti["name"] + ".codes").view(np.uint8)
            sc = ti["scheme"]
            codes.append(_ggml_codes(raw, sc["method"]) if sc["method"].startswith("q")
                         else _unpack(raw, sc["bits"]))
    return _entropy(np.concatenate(codes))

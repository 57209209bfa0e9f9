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


def _tensor_codes(f, ti: dict) -> tuple[np.ndarray, int]:
    """One tensor's codes as [batch, heads, tokens, head_dim] and its alphabet size."""
    raw = f.get_tensor(ti["name"] + ".codes").view(np.uint8)
    sc, (b, h, t, d) = ti["scheme"], ti["shape"]
    if sc["method"] in GGML:
        return _ggml_codes(raw, sc["method"]).astype(np.int64).reshape(b, h, t, d), 256 if sc["method"] == "q8_0" else 32
    q = _unpack(raw, sc["bits"]).astype(np.int64)[: b * h * t * d]
    q = q.reshape(b, h, d, t).transpose(0, 1, 3, 2) if sc["axis"] == "channel" else q.reshape(b, h, t, d)
    return np.ascontiguousarray(q), 1 << sc["bits"]


def _bits(ctx: np.ndarray, sym: np.ndarray, contexts: int, alphabet: int) -> float:
    """Empirical code length in bits of sym under a static table per context."""
    c = np.bincount(ctx.ravel() * alphabet + sym.ravel(), minlength=contexts * alphabet).reshape(contexts, alphabet)
    n = c.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(-(c * np.log2(np.where(c > 0, c / np.maximum(n, 1), 1))).sum())


CONTEXTS = ("tensor", "head", "channel", "head, channel", "head, channel, previous token",
            "head, channel class, previous token")
TABLE_ENTRY_BITS = 10  # a static table's frequency, as context_entropy(tables=True) prices it
CLASSES = 4  # channel classes a head: its channels ranked by their mean code, cut in this many equal parts


def channel_classes(q: np.ndarray, k: int = CLASSES) -> np.ndarray:
    """[heads, head_dim] class of each channel: the rank of its mean code within its head, in k parts
    (a map of log2 k bits a channel; with a table per class and previous code, few tables where
    (head, channel, previous token) would need heads x head_dim x alphabet of them)."""
    _, h, _, d = q.shape
    rank = np.argsort(np.argsort(q.mean(axis=(0, 2)), axis=1, kind="stable"), axis=1, kind="stable")
    return rank * k // d


def context_entropy(path: str, tables: bool = False) -> dict[str, float]:
    """Bits per code of a (4-D, non-entropy-coded) kvq file's codes under each context the wire stage
    could model (docs/kv-compress/lossless.md): which context is worth its tables. With ``tables``,
    each context's figure also counts its static tables at TABLE_ENTRY_BITS an entry (and the class
    map at log2(CLASSES) bits a channel), as a stream would have to carry them."""
    total, n = dict.fromkeys(CONTEXTS, 0.0), 0
    with safe_open(path, "np") as f:
        for ti in json.loads(f.metadata()["kvq.tensors"]):
            q, a = _tensor_codes(f, ti)
            _, h, _, d = q.shape
            hh = np.broadcast_to(np.arange(h)[None, :, None, None], q.shape)
            dd = np.broadcast_to(np.arange(d)[None, None, None, :], q.shape)
            prev = np.concatenate([np.zeros_like(q[:, :, :1]), q[:, :, :-1]], 2)
            cls = np.broadcast_to(channel_classes(q)[None, :, None, :], q.shape)
            for name, ctx, k in zip(CONTEXTS, (np.zeros_like(q), hh, dd, hh * d + dd, (hh * d + dd) * a + prev,
                                               (hh * CLASSES + cls) * a + prev),
                                    (1, h, d, h * d, h * d * a, h * CLASSES * a)):
                total[name] += _bits(ctx, q, k, a)
                if tables:
                    total[name] += k * a * TABLE_ENTRY_BITS + (h * d * np.log2(CLASSES) if "class" in name else 0)
            n += q.size
    return {k: v / n for k, v in total.items()}


if __name__ == "__main__":
    import sys

    for p in sys.argv[1:]:
        for tables in (False, True):
            print(p, "with tables" if tables else "codes alone",
                  "  ".join(f"{k}: {v:.3f}" for k, v in context_entropy(p, tables).items()))

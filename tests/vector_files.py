"""The safetensors files the shared-vector tests hand kv-compress and read back, byte for byte
(no library between the vectors and the bytes)."""

from __future__ import annotations

import json
from pathlib import Path


def write_inputs(path: Path, tensors: list[dict]) -> None:
    """A safetensors file of the vector tensors' input bytes (``input_hex``, ``dtype``, ``shape``)."""
    header, blobs, off = {}, [], 0
    for t in tensors:
        raw = bytes.fromhex(t["input_hex"])
        header[t["name"]] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def read_parts(path: Path) -> tuple[dict, dict[str, bytes]]:
    """A safetensors file's header and each tensor's bytes."""
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    body = blob[8 + n :]
    return header, {k: body[v["data_offsets"][0] : v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}

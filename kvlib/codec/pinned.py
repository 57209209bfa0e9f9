"""Page-locked ("pinned") host memory for CUDA copies: the codec server's shared-memory
segments are registered with the CUDA driver in place (``cudaHostRegister``), so copies
between them and the GPU are DMA transfers that can run asynchronously (``non_blocking``)
instead of staged, synchronous copies. Without CUDA, or when the driver refuses a
mapping, nothing is registered and the copies stay correct, only synchronous.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from typing import Any

import torch

_warned = False


def _cudart() -> Any | None:
    if not torch.cuda.is_available():
        return None
    try:
        return torch.cuda.cudart()
    except (AttributeError, RuntimeError):
        return None


def address_of(buf: mmap.mmap) -> int:
    """The address of a mapping's first byte (the buffer export is released at once)."""
    c = ctypes.c_char.from_buffer(buf)
    try:
        return ctypes.addressof(c)
    finally:
        del c


def pin(buf: mmap.mmap) -> int | None:
    """Register ``buf`` as pinned memory; its address (for ``unpin``), or None when it stays
    pageable (no CUDA, or the driver refused: said once on stderr)."""
    global _warned
    rt = _cudart()
    if rt is None or len(buf) == 0:
        return None
    addr = address_of(buf)
    err = rt.cudaHostRegister(addr, len(buf), 0)
    if int(err) != 0:
        _clear_last_error()
        if not _warned:
            _warned = True
            print(f"kvlib: warning: cudaHostRegister refused shared memory (error {int(err)}); "
                  f"codec copies stay synchronous", file=sys.stderr, flush=True)
        return None
    return addr


def _clear_last_error() -> None:
    """Consume the CUDA runtime's last error, which the refused call left for torch's next check
    to raise from an unrelated kernel."""
    try:
        torch.zeros(1, device="cuda").add_(1)
    except RuntimeError:
        pass


def unpin(addr: int | None) -> None:
    """Undo ``pin`` (before the mapping goes)."""
    rt = _cudart()
    if addr is not None and rt is not None:
        rt.cudaHostUnregister(addr)


def is_pinned(buf: mmap.mmap) -> bool:
    """Whether CUDA sees ``buf`` as page-locked (False without CUDA)."""
    if not torch.cuda.is_available():
        return False
    return torch.frombuffer(buf, dtype=torch.uint8, count=1).is_pinned()


class CopyFence:
    """Host memory that a non-blocking CUDA copy still reads or writes is not touched again
    until the copy is done: ``mark()`` after queuing the copies, ``wait()`` before reuse."""

    def __init__(self) -> None:
        self._event: Any = None

    def mark(self) -> None:
        if torch.cuda.is_available():
            self._event = torch.cuda.Event()
            self._event.record()

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()
            self._event = None

    def done(self) -> bool:
        """Whether no copy marked on it is still running (always on CPU)."""
        return self._event is None or bool(self._event.query())

"""The machine and the process: kvlib's home directory, the default device, file digests and the
environment flags every room reads. A leaf: it imports nothing of kvlib."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
from functools import lru_cache
from pathlib import Path

import torch

_TRUE = ("1", "true", "True", "yes")


def flag(name: str) -> bool:
    """An on/off environment flag (KVLIB_FRESH=1, KVLIB_RAY=true, ...)."""
    return os.environ.get(name, "") in _TRUE


def kvlib_home() -> Path:
    """``$KVLIB_HOME``, else ``~/.cache/kvlib``: the zoo's models and the results store live here."""
    return Path(os.environ.get("KVLIB_HOME") or Path.home() / ".cache" / "kvlib")


def default_device() -> str:
    """CUDA when available, else CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@lru_cache(maxsize=None)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file, computed once per (path, size, mtime) in a process."""
    st = os.stat(path)
    return _sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def stop_on_sigterm() -> None:
    """From now on SIGTERM ends the process as Ctrl-C does: by an exception, so that every ``with``
    and ``finally`` runs (temporary directories, the codec server, llama-perplexity's process group,
    shared memory); exit status 128 + 15. Only the main thread can install it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_exit)

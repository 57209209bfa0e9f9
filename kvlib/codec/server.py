"""The codec as a long-lived process: ``kv-compress serve``, the same Go code as
the file commands, reached through framed JSON on a pipe, with the tensors in
shared memory. A round trip then costs no process start, no file and no
parsing: the context cache is copied once into shared memory per window (for
every scheme), and each reconstruction lands in a buffer torch wraps without a
copy.

The shared memory is a memfd (``os.memfd_create``): the server opens it as
``/proc/<pid>/fd/<n>``, nothing ever appears in ``/dev/shm``, and the kernel
frees it when both processes are gone, however they end. The server reads
requests on its stdin, so it exits when this process does (even on SIGKILL,
when the pipe closes). ``transforms.cache_transforms`` starts one server per
run and falls back to the file CLI, with a one-line warning, when it cannot.
"""

from __future__ import annotations

import atexit
import itertools
import json
import mmap
import os
import select
import struct
import subprocess
import sys
import threading
import weakref
from typing import Any

import torch

from kvlib.codec.binary import find_cli_binary
from kvlib.codec.cli import TIMEOUT_BASE_S, TIMEOUT_BYTES_PER_S
from kvlib.cache.io import file_metadata, metadata_of
from kvlib.cache.layout import cache_layers
from kvlib.codec.pinned import CopyFence, pin, unpin
from kvlib.dtypes import BY_SAFETENSORS
from kvlib.dtypes import stored

ALIGN = 64  # bytes: every tensor starts on a cache line


class CodecServerError(RuntimeError):
    """The server could not start, died, or answered a request with an error."""


_generations = itertools.count(1)


class SharedSegment:
    """``size`` bytes of shared memory (a memfd) mapped here, named for the server by a /proc path;
    with ``pinned``, also page-locked for CUDA copies (``kvlib.codec.pinned``)."""

    def __init__(self, size: int, name: str = "kvlib", pinned: bool = False) -> None:
        self.size = size
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.buf = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.path = f"/proc/{os.getpid()}/fd/{self.fd}"
        self.gen = next(_generations)  # the server remaps a path whose generation changed
        self.for_cuda = pinned
        self.pinned_at = pin(self.buf) if pinned else None
        self.fence = CopyFence()  # CUDA copies still reading or writing this segment
        # Released by close() or, at the latest, when this object goes: a mapping left registered
        # with CUDA after its unmapping would corrupt later copies from the same addresses.
        self._release = weakref.finalize(self, _release, self.buf, self.fd, self.pinned_at, self.fence)
        self._own_refs = sys.getrefcount(self.buf)

    def viewed(self) -> bool:
        """Whether a tensor still views this memory (torch.frombuffer holds the mmap object)."""
        return sys.getrefcount(self.buf) > self._own_refs

    def segment(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "gen": self.gen}

    def close(self) -> None:
        self._release()


def _release(buf: mmap.mmap, fd: int, pinned_at: int | None, fence: CopyFence) -> None:
    """Unregister and close the memfd; the mapping itself goes with its last reference, since
    tensors made by torch.frombuffer may still view it (they hold the mmap object, not an export)."""
    fence.wait()
    unpin(pinned_at)
    os.close(fd)


def _layout(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[list[dict[str, Any]], int]:
    """Where each tensor lies in a segment, and the segment's size. Named, typed and ordered as
    save_kv_cache's file holds them (safetensors orders tensors by name), so the codec sees the
    same tensors in the same order and pools its sums identically."""
    return named_layout([(f"layer_{i}_{role}", t) for i, (k, v) in enumerate(layers)
                         for role, t in (("key", k), ("value", v))])


def named_layout(named: list[tuple[str, torch.Tensor]]) -> tuple[list[dict[str, Any]], int]:
    """``_layout`` for any named tensors (one layer's, in write mode), ordered by name."""
    refs, off = [], 0
    for name, t in sorted(named, key=lambda nt: nt[0]):
        dt = stored(t.dtype)  # bfloat16 travels as float32, as in a file
        refs.append({"name": name, "dtype": dt.safetensors, "shape": list(t.shape), "offset": off})
        off += -(-t.numel() * dt.itemsize // ALIGN) * ALIGN
    return refs, max(off, ALIGN)


def by_name(refs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in refs}


def view(seg: SharedSegment, ref: dict[str, Any]) -> torch.Tensor:
    dt = BY_SAFETENSORS[ref["dtype"]].torch
    n = 1
    for d in ref["shape"]:
        n *= d
    return torch.frombuffer(seg.buf, dtype=dt, count=n, offset=ref["offset"]).view(ref["shape"])


class CodecServer:
    """One ``kv-compress serve`` process and its pipe. ``request`` sends a frame and waits for
    the answer; a server that dies is restarted once, then CodecServerError."""

    def __init__(self, cli: str | None = None, start_timeout: float = 10.0) -> None:
        self.cli = cli or find_cli_binary()
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.requests = 0  # answered round trips, however many schemes each carried
        self._next_id = 0
        self._lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        try:
            self.proc = subprocess.Popen([self.cli, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE)
        except OSError as e:
            raise CodecServerError(f"cannot start {self.cli} serve: {e}") from None
        try:
            self._exchange({"op": "ping"})
        except CodecServerError:
            self.close()
            raise

    def _exchange(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self._next_id += 1
        req = {"id": self._next_id, **req}
        body = json.dumps(req).encode()
        # As long as the file CLI may take on the same bytes, for each scheme.
        timeout = TIMEOUT_BASE_S + (req.get("input") or {}).get("size", 0) * len(req.get("schemes") or [None]) \
            / TIMEOUT_BYTES_PER_S
        try:
            self.proc.stdin.write(struct.pack("<I", len(body)) + body)
            self.proc.stdin.flush()
            if not select.select([self.proc.stdout], [], [], timeout)[0]:
                self.proc.kill()
                self.proc.wait()
                raise CodecServerError(f"kv-compress serve did not answer within {timeout:.0f} s (stopped)")
            head = self.proc.stdout.read(4)
            if len(head) < 4:
                raise EOFError
            (n,) = struct.unpack("<I", head)
            data = self.proc.stdout.read(n)
            if len(data) < n:
                raise EOFError
        except (BrokenPipeError, EOFError, OSError):
            raise CodecServerError(f"kv-compress serve died: {self._stderr_tail()}") from None
        resp = json.loads(data)
        if resp.get("id") != req["id"]:
            raise CodecServerError(f"kv-compress serve answered request {resp.get('id')}, expected {req['id']}")
        return resp

    def _stderr_tail(self) -> str:
        if self.proc is None:
            return "not running"
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "no reply"
        err = self.proc.stderr.read().decode(errors="replace").strip() if self.proc.stderr else ""
        return f"exit {self.proc.returncode}" + (f": {err.splitlines()[-1]}" if err else "")

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """One request's answer; restarts a dead server once. A request the server refuses
        raises CodecServerError with its one-line reason."""
        with self._lock:
            try:
                resp = self._exchange(req)
            except CodecServerError as e:
                if self.restarts >= 1:
                    raise
                print(f"kvlib: warning: {e}; restarting it once", file=sys.stderr, flush=True)
                self.restarts += 1
                self.close()
                self._start()
                resp = self._exchange(req)
        if resp.get("error"):
            raise CodecServerError(f"kv-compress serve: {resp['error']}")
        self.requests += 1
        return resp

    def close(self) -> None:
        """Stop the server (end of its stdin, then a kill after 5 s) and reap it."""
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            if p.stdin:
                p.stdin.close()
            p.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            p.kill()
            p.wait()
        for f in (p.stdout, p.stderr):
            if f:
                f.close()

    def __enter__(self) -> "CodecServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_shared: CodecServer | None = None


def shared_server() -> CodecServer | None:
    """The run's codec server, started on first use and stopped at exit; None (with a one-line
    warning) when it cannot start or ``KVLIB_CODEC=cli`` asks for the file CLI."""
    global _shared
    if os.environ.get("KVLIB_CODEC", "server") == "cli":
        return None
    if _shared is None or _shared.proc is None:
        try:
            _shared = CodecServer()
        except (CodecServerError, FileNotFoundError) as e:
            print(f"kvlib: warning: the codec server cannot start ({' '.join(str(e).split())}); "
                  f"using the file CLI", file=sys.stderr, flush=True)
            return None
        atexit.register(_shared.close)
    return _shared


class OutputPool:
    """The output buffers of the transforms that read one context, shared: memory follows the
    reconstructions alive at once, not the number of schemes (a decoding check that calls the
    schemes one by one needs one buffer, not one per scheme).

    ``take`` returns a buffer that no tensor views and no copy still reads, of the size asked
    (resized if not); else a new one while fewer than ``limit`` exist (each transform adds
    ServerCacheRoundtrip.BUFFERS to it, so a window's reconstructions of every scheme and the next
    window's fit); else the one written longest ago. ``busy``: the buffers already taken for the
    request being made."""

    def __init__(self) -> None:
        self.segments: list[SharedSegment] = []  # least recently taken first
        self.limit = 0

    def take(self, size: int, cuda: bool, busy: list[SharedSegment]) -> SharedSegment:
        idle = [seg for seg in self.segments if not any(seg is b for b in busy)]
        free = [seg for seg in idle if not seg.viewed() and seg.fence.done()]
        pick = next((seg for seg in free if seg.size == size and seg.for_cuda == cuda), free[0] if free else None)
        if pick is None and len(self.segments) >= self.limit and idle:
            pick = idle[0]
        if pick is not None:
            self.segments.remove(pick)
            pick.fence.wait()  # the copies out of its last reconstruction are done
            if pick.size != size or pick.for_cuda != cuda:
                pick.close()
                pick = SharedSegment(size, "kvlib-restored", pinned=cuda)
        else:
            pick = SharedSegment(size, "kvlib-restored", pinned=cuda)
        self.segments.append(pick)
        return pick

    def close(self) -> None:
        for seg in self.segments:
            seg.close()
        self.segments = []


class SharedContext:
    """The context cache in shared memory: each window's written once, whichever schemes read it
    (the shared-memory counterpart of bridge.ContextFile, with the same ``slots``)."""

    def __init__(self, model_name: str = "unknown", slots: int = 1) -> None:
        self.model_name, self.slots = model_name, slots
        self._held: list[tuple[Any, SharedSegment, list[dict[str, Any]], dict[str, str]]] = []
        self.writes = 0
        self.outputs = OutputPool()  # the reconstructions' buffers, shared by the schemes reading this context

    def segment_for(self, cache: Any) -> tuple[SharedSegment, list[dict[str, Any]], dict[str, str]]:
        for held, seg, refs, meta in self._held:
            if held is cache:
                return seg, refs, meta
        layers = cache_layers(cache)
        refs, size = _layout(layers)
        cuda = layers[0][0].is_cuda
        if len(self._held) == self.slots:
            _, seg, _, _ = self._held.pop(0)
            if seg.size < size or cuda != seg.for_cuda:
                seg.close()
                seg = SharedSegment(size, "kvlib-context", pinned=cuda)
        else:
            seg = SharedSegment(size, "kvlib-context", pinned=cuda)
        where = by_name(refs)
        for i, (k, v) in enumerate(layers):
            for role, t in (("key", k), ("value", v)):
                # From a GPU: one DMA copy per tensor into pinned memory, all queued, then one wait.
                view(seg, where[f"layer_{i}_{role}"]).copy_(t.detach(), non_blocking=cuda)
        seg.fence.mark()
        seg.fence.wait()
        meta = file_metadata(metadata_of(cache, self.model_name), BY_SAFETENSORS[refs[0]["dtype"]].name)
        self._held.append((cache, seg, refs, meta))
        self.writes += 1
        return seg, refs, meta

"""Where a scoring run's missing units are computed: in this process, or on a Ray cluster.
Both take the same ``ScoringJob`` (a value: what a worker needs to load and score) and the
windows still missing per scheme, and tell ``on_window`` each window's outcomes as they
finish; the caller stores and merges them, so the result is the same, bit for bit, whichever
ran them.

Ray: one actor per worker loads the model, tokenizer and codec once; windows are handed out
one at a time as actors free up; results stream back to the driver, which alone writes the
store (no shared filesystem). An actor that dies is restarted and its window recomputed.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from kvlib.codec.server import shared_server
from kvlib.codec.spec import resolve_codec
from kvlib.dtypes import torch_dtype
from kvlib.models.sources import load_model_and_tokenizer
from kvlib.transforms.codec import cache_transforms
from kvlib.scoring.perplexity import score_windows
from kvlib.scoring.units import Outcome, decode, encode

OnWindow = Callable[[int, "dict[str, Outcome]"], None]


@dataclass(frozen=True)
class ScoringJob:
    """What scoring needs besides the token ids: shipped once to each worker."""

    model: str
    device: str
    dtype: str
    codecs: tuple[str, ...]  # canonical specs, in order
    peers: bool
    max_length: int
    stride: int
    max_windows: int | None
    model_name: str
    threads: int = 0  # torch threads per worker (0: the worker's default)
    mode: str = "prefix"  # kvlib.scoring.perplexity.MODES


def _groups(missing: dict[int, list[str]]) -> dict[tuple[str, ...], set[int]]:
    """Windows that miss the same schemes, scored together (one pass each)."""
    out: dict[tuple[str, ...], set[int]] = {}
    for index, names in sorted(missing.items()):
        out.setdefault(tuple(names), set()).add(index)
    return out


@dataclass
class SerialExecutor:
    """In this process: the model and the transforms are made on first need (``load`` and
    ``transforms``), so a run with nothing missing loads nothing."""

    load: Callable[[], Any]
    transforms: Callable[[], dict[str, Any]]
    progress: bool = False

    def run(self, job: ScoringJob, ids: torch.Tensor, missing: dict[int, list[str]], on_window: OnWindow) -> None:
        if not missing:
            return
        lm, ts = self.load(), self.transforms()
        for names, select in _groups(missing).items():
            score_windows(lm, ids, job.max_length, job.stride, {n: ts[n] for n in names}, job.max_windows,
                          self.progress, select=select, on_window=on_window, mode=job.mode)


class RayUnavailable(RuntimeError):
    """Ray is not installed, or its cluster cannot be reached (one line naming the address)."""


class _Worker:
    """A Ray actor's state: the model, tokenizer and transforms, loaded once."""

    def __init__(self, job: ScoringJob) -> None:
        if job.threads:
            torch.set_num_threads(job.threads)
        self.job = job
        device = "cuda" if job.device.startswith("cuda") and torch.cuda.is_available() else job.device
        self.lm, self.tok = load_model_and_tokenizer(job.model, device=device, dtype=torch_dtype(job.dtype))
        # A work directory only where the file CLI needs one: Ray ends its actors without running
        # finalizers, so a directory made here would outlive them (close() removes it before).
        self._tmp = None if shared_server() is not None else tempfile.TemporaryDirectory(prefix="kvlib-worker-")
        workdir = self._tmp.name if self._tmp is not None else tempfile.gettempdir()
        self.transforms, _ = cache_transforms([resolve_codec(c) for c in job.codecs], workdir,
                                              job.model_name, job.peers, mode=job.mode,
                                              architecture=getattr(self.lm.config, "model_type", None))

    def close(self) -> None:
        """Remove the work directory (called before the actor is killed)."""
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def pid(self) -> int:
        return os.getpid()

    def score(self, index: int, names: list[str], ids: Any) -> tuple[int, dict[str, dict[str, Any]]]:
        """Window ``index``'s outcomes for ``names``; ``ids`` (the corpus's token ids, numpy) come
        with each task from the object store, so a restarted actor needs nothing from before."""
        out: dict[str, Outcome] = {}
        score_windows(self.lm, torch.from_numpy(ids.copy()), self.job.max_length, self.job.stride, {n: self.transforms[n] for n in names},
                      self.job.max_windows, progress=False, select={index}, on_window=lambda i, r: out.update(r), mode=self.job.mode)
        return index, {n: encode(o) for n, o in out.items()}


def ray_init(address: str | None = None, num_cpus: int | None = None) -> Any:
    """Ray, connected: to ``address`` (or RAY_ADDRESS), else a local cluster started here."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("ray is not installed (pip install ray, or `make setup`)") from None
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _check_reachable(address)
    try:
        ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RayUnavailable(f"cannot reach the Ray cluster at {address or 'a new local cluster'}: "
                             f"{' '.join(str(e).split())[:200]}") from None
    return ray


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """A cluster address (host:port, or ray://host:port) that takes no TCP connection fails
    now, in one line, instead of after Ray's minute of retries."""
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0]
    if hostport in ("auto", "local") or ":" not in hostport:
        return
    host, port = hostport.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as e:
        raise RayUnavailable(f"cannot reach the Ray cluster at {address}: "
                             f"{getattr(e, 'strerror', None) or e}") from None


@dataclass
class RayExecutor:
    """On Ray: ``workers`` actors (default: one per GPU of the cluster on CUDA, else one per
    ``cpus_per_worker`` CPUs), each with ``cpus_per_worker`` CPUs and, on CUDA, one GPU."""

    address: str | None = None
    workers: int | None = None
    cpus_per_worker: int = 1
    max_restarts: int = 2
    seconds: dict[str, float] = field(default_factory=dict)
    actors: list[Any] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # the actors' processes, once loaded

    def run(self, job: ScoringJob, ids: torch.Tensor, missing: dict[int, list[str]], on_window: OnWindow) -> None:
        if not missing:
            return
        t0 = time.perf_counter()
        ray = ray_init(self.address)
        ids_ref = ray.put(ids.cpu().numpy())
        # Each actor's torch uses the CPUs Ray gives it: 1 thread against the serial run's 2 gives
        # the same numbers (tests/test_ray.py, and make bench on the embedded model).
        self.actors, self.pids = start_actors(ray, _Worker, replace(job, threads=self.cpus_per_worker),
                                              actor_count(ray, job.device, self.workers, self.cpus_per_worker,
                                                          len(missing)), self.cpus_per_worker, self.max_restarts)
        t1 = time.perf_counter()
        try:
            dispatch(ray, self.actors, sorted(missing.items()),
                     lambda actor, item: actor.score.remote(item[0], item[1], ids_ref),
                     lambda item, got: on_window(got[0], {k: decode(v) for k, v in got[1].items()}))
        finally:
            end_actors(ray, self.actors)
            self.seconds = {"ray_start_s": t1 - t0, "ray_units_s": time.perf_counter() - t1}
        print(f"kvlib: Ray: {len(self.actors)} worker(s), {len(missing)} window(s) in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)


def actor_count(ray: Any, device: str, workers: int | None, cpus_per_worker: int, work: int) -> int:
    """How many actors: ``workers``, else one per GPU of the cluster on CUDA (each takes one), else
    one per ``cpus_per_worker`` CPUs; never more than the ``work`` items there are."""
    res = ray.cluster_resources()
    n = workers or (int(res.get("GPU", 0)) if device.startswith("cuda") else int(res.get("CPU", 1)) // cpus_per_worker)
    return max(1, min(n, work))


def start_actors(ray: Any, worker: type, job: Any, n: int, cpus_per_worker: int, max_restarts: int,
                 *args: Any) -> tuple[list[Any], list[int]]:
    """``n`` actors of ``worker(job, *args)`` (one GPU each on CUDA), and their pids once each has
    loaded (so the time to here is the start's)."""
    gpus = 1 if job.device.startswith("cuda") else 0
    remote = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus, max_restarts=max_restarts,
                        max_task_retries=max_restarts)(worker)
    actors = [remote.remote(job, *args) for _ in range(n)]  # they load the model concurrently
    return actors, ray.get([a.pid.remote() for a in actors])


def dispatch(ray: Any, actors: list[Any], todo: list[Any], submit: Callable[[Any, Any], Any],
             done: Callable[[Any, Any], None]) -> None:
    """``todo``'s items handed to ``actors`` one at a time as they free up (``submit(actor, item)``
    gives the task's ref), ``done(item, result)`` told as each finishes. On an error, the tasks in
    flight are waited for before it is raised, so that ``end_actors`` finds the actors idle."""
    todo, running, idle = list(todo), {}, list(actors)
    try:
        while todo or running:
            while todo and idle:
                actor, item = idle.pop(), todo.pop(0)
                running[submit(actor, item)] = (actor, item)
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                actor, item = running.pop(ref)
                idle.append(actor)
                done(item, ray.get(ref))
    except BaseException:
        if running:
            ray.wait(list(running), num_returns=len(running), timeout=60)
        raise


def end_actors(ray: Any, actors: list[Any]) -> None:
    """Each actor's work directory removed (``close``), then the actor killed."""
    try:
        ray.get([a.close.remote() for a in actors], timeout=30)
    except Exception:  # an actor that is gone has nothing left to remove
        pass
    for a in actors:
        ray.kill(a)

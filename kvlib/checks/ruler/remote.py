"""RULER's samples on Ray, behind the runner's one interface (``answer_all``): each actor loads the
model, tokenizer and codecs once and answers whole samples (one prefill, every cache asked of it);
the driver alone reads and writes the results store, so a run on Ray stores the units a run in
process stores, and a killed run resumes from either. A cell's samples go out a wave of one per
actor at a time, so the exact cache's early stop still applies. Prefills kept for a qualifying
cell's schemes do not cross machines: on Ray those samples are prefilled again.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kvlib.checks.ruler.run import Request, Runner, stop_tokens
from kvlib.codec.spec import resolve_codec
from kvlib.dtypes import torch_dtype
from kvlib.models.sources import load_model_and_tokenizer
from kvlib.scoring.executor import ray_init
from kvlib.scoring.units import CheckUnits
from kvlib.transforms.codec import cache_transforms


@dataclass(frozen=True)
class RulerJob:
    """What an actor needs to answer samples: the model to load and the codecs by (name, spec)."""

    model: str
    device: str
    dtype: str
    codecs: tuple[tuple[str, str], ...]
    model_name: str
    threads: int = 0


class _RulerWorker:
    """A Ray actor's state: the model, tokenizer, codecs' round trips and the presses, made once."""

    def __init__(self, job: RulerJob, presses: dict[str, Any]) -> None:
        if job.threads:
            torch.set_num_threads(job.threads)
        device = "cuda" if job.device.startswith("cuda") and torch.cuda.is_available() else job.device
        lm, tok = load_model_and_tokenizer(job.model, device=device, dtype=torch_dtype(job.dtype))
        self._tmp = tempfile.TemporaryDirectory(prefix="kvlib-ruler-worker-")
        made, _ = cache_transforms([resolve_codec(spec) for _, spec in job.codecs], self._tmp.name, job.model_name)
        every = {name: t for (name, _), t in zip(job.codecs, made.values())}
        self.runner = Runner(lm, tok, CheckUnits(None, None, "ruler"), {**every, **presses}, {},
                             stop_tokens(lm.config, tok), [])

    def close(self) -> None:
        self._tmp.cleanup()

    def compute(self, s: Any, names: list[str]) -> tuple[dict[str, dict], dict[str, str], list[str], float]:
        """The answers of ``names`` to ``s``, the presses refused on the way and their notes, and the seconds."""
        t0 = time.perf_counter()
        self.runner.refused.clear()
        self.runner.notes.clear()
        out = self.runner.compute(s, names)
        return out, dict(self.runner.refused), list(self.runner.notes), time.perf_counter() - t0


@dataclass
class RayRunner(Runner):
    """The runner whose missing answers are computed on Ray actors (``workers``, default one per
    ``cpus_per_worker`` CPUs of the cluster), ``width`` samples side by side."""

    job: RulerJob | None = None
    address: str | None = None
    workers: int | None = None
    cpus_per_worker: int = 1
    actors: list[Any] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    _ray: Any = None

    def start(self) -> Any:
        """The actors, started on first need (a run whose units are all stored starts none)."""
        ray = self._ray = ray_init(self.address)
        if not self.actors:
            t0 = time.perf_counter()
            n = self.workers or max(1, int(ray.cluster_resources().get("CPU", 1)) // self.cpus_per_worker)
            gpus = 1 if self.job.device.startswith("cuda") else 0
            Worker = ray.remote(num_cpus=self.cpus_per_worker, num_gpus=gpus, max_restarts=2,
                                max_task_retries=2)(_RulerWorker)
            presses = {k: t for k, t in self.every.items() if getattr(t, "kind", "") == "evict"}
            job = replace(self.job, threads=self.cpus_per_worker)
            self.actors = [Worker.remote(job, presses) for _ in range(n)]
            self.width = n
            self.seconds["ray_start_s"] = time.perf_counter() - t0
        return ray

    def answer_all(self, requests: list[Request]) -> list[dict[str, dict]]:
        out = [self.stored(s, names, known) for s, names, known, _, _ in requests]
        todo = [(i, [m for m in r[1] if m not in out[i] and m not in self.refused]) for i, r in enumerate(requests)]
        todo = [(i, names) for i, names in todo if names]
        if not todo:
            return out
        ray = self.start()
        idle, running = list(self.actors), {}
        while todo or running:
            while todo and idle:
                actor, (i, names) = idle.pop(), todo.pop(0)
                running[actor.compute.remote(requests[i][0], names)] = (actor, i)
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                actor, i = running.pop(ref)
                idle.append(actor)
                computed, refused, notes, seconds = ray.get(ref)
                self.refused.update(refused)
                self.notes.extend(n for n in notes if n not in self.notes)
                self.record(requests[i][0], computed, out[i], requests[i][3], seconds)
        return out

    def close(self) -> None:
        """End the actors, their work directories removed first."""
        if not self.actors:
            return
        ray = self._ray
        try:
            ray.get([a.close.remote() for a in self.actors], timeout=30)
        except Exception:  # an actor that is gone has nothing left to remove
            pass
        for a in self.actors:
            ray.kill(a)
        print(f"kvlib: Ray: {len(self.actors)} worker(s) answered RULER samples", file=sys.stderr, flush=True)
        self.actors = []

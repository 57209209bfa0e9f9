"""RULER's samples on Ray, behind the runner's one interface (``answer_all``): each actor loads the
model, tokenizer and codecs once (the sweep's worker) and answers whole samples (one prefill, every
cache asked of it); the driver alone reads and writes the results store, so a run on Ray stores the
units a run in process stores, and a killed run resumes from either. A cell's samples go out a wave
of one per actor at a time, and the cell keeps the answers up to where a run in process would have
stopped, so the exact cache's early stop gives the same cells. Prefills kept for a qualifying
cell's schemes do not cross machines: on Ray those samples are prefilled again.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

from kvlib.checks.ruler.run import Request, Runner, stop_tokens
from kvlib.scoring.executor import ScoringJob, _Worker, actor_count, dispatch, end_actors, ray_init, start_actors
from kvlib.scoring.units import CheckUnits


def ruler_job(model: str, device: str, dtype: str, codecs: list[Any], model_name: str) -> ScoringJob:
    """What an actor needs to answer samples: the model to load and the codecs (prefix mode, no peers)."""
    return ScoringJob(model, device, dtype, tuple(c.spec for c in codecs), False, 0, 1, None, model_name)


class _RulerWorker(_Worker):
    """A Ray actor's state: the sweep worker's model, tokenizer and codecs' round trips under the
    driver's names, and the presses, made once."""

    def __init__(self, job: ScoringJob, names: list[str], presses: dict[str, Any]) -> None:
        super().__init__(job)
        every = dict(zip(names, self.transforms.values()))  # in the codecs' order
        self.runner = Runner(self.lm, self.tok, CheckUnits(None, None, "ruler"), {**every, **presses}, {},
                             stop_tokens(self.lm.config, self.tok), [])

    def compute(self, s: Any, names: list[str]) -> tuple[dict[str, dict], dict[str, str], list[str], float]:
        """The answers of ``names`` to ``s``, the presses refused on the way and their notes, and the
        seconds its prefill took."""
        self.runner.refused.clear()
        self.runner.notes.clear()
        before = self.runner.prefill_s
        out = self.runner.compute(s, names)
        return out, dict(self.runner.refused), list(self.runner.notes), self.runner.prefill_s - before


@dataclass
class RayRunner(Runner):
    """The runner whose missing answers are computed on Ray actors (``workers``, default one per GPU
    on CUDA, else one per ``cpus_per_worker`` CPUs), ``width`` samples side by side."""

    job: ScoringJob | None = None
    address: str | None = None
    workers: int | None = None
    cpus_per_worker: int = 1
    actors: list[Any] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    _ray: Any = None

    def __post_init__(self) -> None:
        cuda = self.job.device.startswith("cuda")
        self.width = self.workers or (1 if cuda else max(1, (os.cpu_count() or 1) // self.cpus_per_worker))

    def start(self, work: int) -> Any:
        """The actors, started on first need (a run whose units are all stored starts none)."""
        ray = self._ray = ray_init(self.address)
        if not self.actors:
            t0 = time.perf_counter()
            n = actor_count(ray, self.job.device, self.workers, self.cpus_per_worker, max(work, self.width))
            presses = {k: t for k, t in self.every.items() if getattr(t, "kind", "") == "evict"}
            codecs = [k for k in self.every if k not in presses]
            self.actors, _ = start_actors(ray, _RulerWorker, replace(self.job, threads=self.cpus_per_worker), n,
                                          self.cpus_per_worker, 2, codecs, presses)
            self.width = n
            self.seconds["ray_start_s"] = time.perf_counter() - t0
        return ray

    def answer_all(self, requests: list[Request]) -> list[dict[str, dict]]:
        out = [self.stored(s, names, known) for s, names, known, _, _ in requests]
        todo = [(i, [m for m in r[1] if m not in out[i] and m not in self.refused]) for i, r in enumerate(requests)]
        todo = [(i, names) for i, names in todo if names]
        if not todo:
            return out
        t0 = time.perf_counter()

        def done(item: tuple[int, list[str]], got: tuple) -> None:
            computed, refused, notes, prefill_s = got
            self.refused.update(refused)
            self.notes.extend(n for n in notes if n not in self.notes)
            self.prefill_s += prefill_s
            s, _, _, label, _ = requests[item[0]]
            self.record(s, computed, out[item[0]], label, time.perf_counter() - t0)

        ray = self.start(len(todo))
        dispatch(ray, self.actors, todo, lambda actor, item: actor.compute.remote(requests[item[0]][0], item[1]), done)
        return out

    def close(self) -> None:
        """End the actors, their work directories removed first."""
        if self.actors:
            end_actors(self._ray, self.actors)
            self.actors = []

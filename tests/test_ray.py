"""Sweeps on Ray: a local cluster (started once for the module) runs the units on actors,
and the merged result is the serial run's to the byte (timings aside), also when a worker
is killed mid-run (its window is recomputed on the restarted actor). An unreachable cluster
is a one-line error naming its address."""

from __future__ import annotations

import os
import signal

import pytest

from test_store import numbers, sweep

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def serial(tiny_dir, tmp_path_factory):
    """The serial sweep's numbers, computed once: every Ray run below must give them."""
    return numbers(sweep(tiny_dir, tmp_path_factory.mktemp("serial")))


def test_ray_gives_the_serial_result(tiny_dir, tmp_path, cluster, serial):  # noqa: F811
    on_ray = sweep(tiny_dir, tmp_path / "ray", ray=True)
    assert on_ray.timing["units_computed"] == 6 and on_ray.timing["ray_units_s"] > 0
    assert numbers(on_ray) == serial
    assert sweep(tiny_dir, tmp_path / "ray", ray=True).timing["units_computed"] == 0  # nothing left to ship


def test_a_killed_worker_changes_nothing(tiny_dir, tmp_path, cluster, serial, monkeypatch):  # noqa: F811
    from kvlib.scoring import executor

    run, killed = executor.RayExecutor.run, []

    def run_and_kill(self, job, ids, missing, on_window):
        def told(index, outcomes):
            on_window(index, outcomes)
            if not killed:  # after the first window: kill a worker, busy or not
                os.kill(self.pids[0], signal.SIGKILL)
                killed.append(self.pids[0])
        return run(self, job, ids, missing, told)

    monkeypatch.setattr(executor.RayExecutor, "run", run_and_kill)
    killed_run = sweep(tiny_dir, tmp_path / "killed", ray=True)
    assert killed and killed_run.timing["units_computed"] == 6
    assert numbers(killed_run) == serial


def test_ruler_on_ray_stores_the_serial_answers(tmp_path, cluster):
    """RULER's samples on two actors: the answers (and so the units) are the serial run's, the
    exact cache's early stop still applies, and a rerun reads the store and starts no actor."""
    from kvlib.checks.ruler.run import RulerConfig
    from kvlib.codec.spec import resolve_codec
    from kvlib.runs.ruler import run_ruler_suite

    config = RulerConfig(tasks=("niah_single_1",), lengths=(512,), samples=2, presses=("knorm",))  # one per actor
    codecs = [resolve_codec("int8")]

    def answers(r):
        return {k: [(a.task, a.index, a.answer, a.score, a.cache_bytes) for a in v] for k, v in r.answers.items()}

    serial = run_ruler_suite(codecs, config, results=tmp_path / "serial", verbose=False)
    on_ray = run_ruler_suite(codecs, config, results=tmp_path / "ray", verbose=False, ray=True)
    assert set(on_ray.answers) == {"exact", "int8", "knorm@int8"} and on_ray.timing["ray_start_s"] > 0
    assert answers(on_ray) == answers(serial)
    again = run_ruler_suite(codecs, config, results=tmp_path / "ray", verbose=False, ray=True)
    assert answers(again) == answers(serial) and "ray_start_s" not in again.timing


def test_an_unreachable_cluster_is_one_line(tiny_dir, tmp_path):  # noqa: F811
    from kvlib.scoring.executor import RayUnavailable, ray_init

    if ray.is_initialized():
        ray.shutdown()
    with pytest.raises(RayUnavailable, match="127.0.0.1:1") as e:
        ray_init("127.0.0.1:1")
    assert "\n" not in str(e.value)

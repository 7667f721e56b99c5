"""What every backend does with a stage's tasks (``Backend.run_tasks``), variant by variant.

Which behaviour applies to which backend: tests/backends/variants.py (and docs/backends.md).
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from pathlib import Path

import pytest

from habitrun.engine.contract import FailureKind
from habitrun.engine.control import StopFlag
from habitrun.errors import OperatorBindError
from tests.backends.conftest import started, suite_op
from tests.backends.variants import for_backends, known_gap
from tests.conftest import wait_gone
from tests.process.conftest import run


@for_backends("success")
def test_every_subject_is_run_once_and_reported_with_its_result(variant, backends, tasks):
    backend = backends(variant)
    items = tasks(*[{"do": "ok"}] * 4)
    # the runner's own sys.stdout is not fd 1, as in a notebook or a program that redirects it
    with contextlib.redirect_stdout(io.StringIO()) as runner_out:
        got = run(backend, suite_op(), items)
    assert sorted(got) == ["S0", "S1", "S2", "S3"]
    for task in items:
        outcome = got[task.subject_id]
        assert outcome.ok and outcome.kind is None and outcome.error is None, outcome
        assert outcome.result["id"] == task.subject_id
        assert outcome.worker_pid == outcome.result["pid"]
        assert outcome.duration_sec >= 0
    assert "suite op" not in runner_out.getvalue()
    for task in items:  # what the subject printed is in its log (written only if there is something)
        log = Path(task.log_path)
        assert log.exists() and f"suite op runs {task.subject_id}: ok" in log.read_text()


@for_backends("raise")
def test_an_exception_fails_its_subject_only(variant, backends, tasks):
    backend = backends(variant)
    items = tasks({"do": "ok"}, {"do": "raise"}, {"do": "ok"})
    got = run(backend, suite_op(), items)
    failed = got["S1"]
    assert not failed.ok and failed.kind == FailureKind.EXCEPTION
    assert failed.error == "ValueError: subject S1 is broken on purpose"
    assert "Traceback" in (failed.traceback or "")
    assert got["S0"].ok and got["S2"].ok


@for_backends("timeout")
def test_a_subject_past_its_timeout_fails_and_its_worker_is_stopped(variant, backends, tasks):
    backend = backends(variant, subject_timeout_sec=1.0)
    got = run(backend, suite_op(), tasks({"do": "sleep"}, {"do": "ok"}, {"do": "ok"}))
    slow = got["S0"]
    assert not slow.ok and slow.kind == FailureKind.TIMEOUT and "subject_timeout_sec" in slow.error, slow
    assert got["S1"].ok and got["S2"].ok
    assert slow.worker_pid is not None and not wait_gone([slow.worker_pid], timeout=15)



@for_backends("bind_error")
def test_a_constructor_that_raises_is_one_stage_error_not_a_failure_per_subject(variant, backends, tasks):
    backend = backends(variant)
    reported = []
    with pytest.raises(OperatorBindError) as caught:
        backend.run_tasks(suite_op("Unbuildable"), tasks(*[{"do": "ok"}] * 4), reported.extend, StopFlag())
    assert caught.value.message == OperatorBindError.for_stage(
        "s", suite_op("Unbuildable").path, "ImportError: No module named 'nibabel'").message
    assert reported == []  # no subject failed: the stage did (and the run stops: the backend is closed)

DASK_DEATH_IS_VAGUE = (
    "dask reports a worker's death without how it ended (exit code, signal; only its nanny knows), and "
    "an exit with code 0 mid-subject as worker_died, which retry rounds rerun by default, where the "
    "process backend says no_report, which they do not")


@for_backends("death")
def test_a_worker_that_dies_fails_only_the_subject_it_ran(variant, backends, tasks):
    # os._exit and a SIGKILL of itself; the subjects after them still run, on replacement workers
    backend = backends(variant, own=True)
    items = tasks({"do": "ok"}, {"do": "exit3"}, {"do": "ok"}, {"do": "sigkill"}, {"do": "ok"},
                  {"do": "exit0"}, {"do": "ok"})
    got = run(backend, suite_op(), items)
    assert len(got) == 7
    for sid in ("S1", "S3"):
        assert not got[sid].ok and got[sid].kind == FailureKind.WORKER_DIED and got[sid].error, got[sid]
    assert not got["S5"].ok
    assert all(got[sid].ok for sid in ("S0", "S2", "S4", "S6"))
    assert all(o.worker_pid is not None for o in got.values()), got
    with known_gap(variant, {"dask": DASK_DEATH_IS_VAGUE}):
        assert got["S5"].kind == FailureKind.NO_REPORT, got["S5"]  # exit code 0: no result, no death
        assert "code 3" in got["S1"].error and "SIGKILL" in got["S3"].error, (got["S1"].error, got["S3"].error)


@for_backends("oom")
def test_a_subject_past_the_memory_cap_is_out_of_memory_and_workers_back_off(variant, backends, tasks):
    backend = backends(variant, worker_memory_limit_mb=400, oom_reduce_workers_by=1)
    assert backend.effective_workers == 2
    got = run(backend, suite_op(), tasks({"do": "hog"}, {"do": "ok"}, {"do": "ok"}))
    hog = got["S0"]
    assert not hog.ok and hog.kind == FailureKind.OOM and "worker_memory_limit_mb" in hog.error, hog
    assert got["S1"].ok and got["S2"].ok
    assert backend.effective_workers == 1


@for_backends("stop")
def test_a_stop_mid_stage_lets_started_subjects_finish_and_starts_no_more(variant, backends, tasks, marker_dir):
    backend = backends(variant)
    stop = StopFlag()
    items = tasks(*[{"do": "sleep", "sec": 0.4}] * 10)
    t0 = time.monotonic()
    try:
        got = run(backend, suite_op(marker_dir=str(marker_dir)), items, stop=stop,
                  on_batch=lambda batch: stop.set("SIGINT"))
    finally:
        stop.close()
    assert time.monotonic() - t0 < 30
    assert 1 <= len(got) < len(items) / 2, sorted(got)
    assert all(o.ok for o in got.values())
    assert set(started(marker_dir)) == set(got), "a subject started after the stop, or was lost in it"


def _two_stages(backend, tasks):
    first = run(backend, suite_op(stage="one"), tasks(*[{"do": "sleep", "sec": 0.2}] * 4, stage="one"))
    second = run(backend, suite_op("second", stage="two"), tasks(*[{"do": "ok"}] * 4, stage="two"))
    assert all(o.ok for o in [*first.values(), *second.values()])
    assert {o.result["stage"] for o in second.values()} == {2}  # the second stage's operator, never the first's
    return ({o.worker_pid for o in first.values()}, {o.worker_pid for o in second.values()})


@for_backends("reuse")
def test_persistent_workers_serve_the_next_stage(variant, backends, tasks):
    backend = backends(variant)
    one, two = _two_stages(backend, tasks)
    if variant.backend == "serial":
        assert one == two == {os.getpid()}
    assert one & two, "no worker of the first stage ran a subject of the second"
    assert len(one | two) <= variant.policy["workers"], (one, two)


@for_backends("isolation")
def test_isolated_workers_run_one_subject_each(variant, backends, tasks):
    backend = backends(variant)
    one, two = _two_stages(backend, tasks)
    assert len(one) == len(two) == 4 and not one & two

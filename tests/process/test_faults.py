"""Behaviours 2-7, 9, 12: timeouts, start hangs, shutdown, deaths, OOM, recycling, pickling."""

from __future__ import annotations

import time

import psutil
import pytest

from habitrun.engine.contract import FailureKind
from tests.process.conftest import op, run, wait_gone


def test_subject_timeout_stops_the_subject_and_gives_the_slot_a_fresh_worker(make_backend, tasks):
    # Short subjects take a sixth of the timeout (a busy machine cannot push one past it);
    # there are enough of them that some are still queued when S1 times out.
    b = make_backend(workers=2, subject_timeout_sec=2.0, graceful_shutdown_sec=0.5)
    short = {"do": "sleep", "sec": 0.3}
    got = run(b, op("act"), tasks(short, {"do": "sleep"}, *[short] * 11))
    slow = got["S1"]
    assert not slow.ok and slow.kind == FailureKind.TIMEOUT and "subject_timeout_sec" in slow.error
    assert all(o.ok for s, o in got.items() if s != "S1") and len(got) == 13
    assert len(b.started_pids) >= 3  # the timed-out worker was replaced
    assert not psutil.pid_exists(slow.worker_pid) or psutil.Process(slow.worker_pid).status() == psutil.STATUS_ZOMBIE


def test_worker_hanging_on_import_is_a_start_timeout_not_a_hang(make_backend, tasks):
    b = make_backend(workers=2, subject_spawn_timeout_sec=1.0, graceful_shutdown_sec=0.5)
    t0 = time.monotonic()
    got = run(b, op("never", module="hangs_on_import"), tasks({}, {}, {}, {}, {}))
    assert time.monotonic() - t0 < 20
    assert len(got) == 5
    assert {o.kind for o in got.values()} == {FailureKind.SPAWN_TIMEOUT}
    assert "subject_spawn_timeout_sec" in got["S0"].error


def test_stopping_a_worker_kills_its_process_group_after_the_grace_period(make_backend, tasks, tmp_path):
    pidfile = tmp_path / "child.pid"
    # the subject starts its child and writes the pidfile within 2.5 s even on a busy machine
    b = make_backend(workers=1, subject_timeout_sec=2.5, graceful_shutdown_sec=0.5)
    got = run(b, op("act"), tasks({"do": "child_then_hang", "pidfile": str(pidfile)}, {"do": "ok"}))
    assert got["S0"].kind == FailureKind.TIMEOUT and got["S1"].ok
    child = int(pidfile.read_text())
    assert not wait_gone([child, got["S0"].worker_pid], timeout=5)


def test_a_failure_is_isolated_in_its_subject(make_backend, tasks):
    b = make_backend(workers=2)
    got = run(b, op("act"), tasks({"do": "ok"}, {"do": "raise"}, {"do": "ok"}))
    assert got["S0"].ok and got["S2"].ok
    assert got["S1"].kind == FailureKind.EXCEPTION
    assert got["S1"].error == "ValueError: bad subject S1"
    assert "Traceback" in got["S1"].traceback


@pytest.mark.parametrize("do, kind, message", [
    ("exit3", FailureKind.WORKER_DIED, "worker exited with code 3"),
    ("sigkill", FailureKind.WORKER_DIED, "worker died with signal SIGKILL"),
    ("segv", FailureKind.WORKER_DIED, "worker died with signal SIGSEGV"),
    ("exit0", FailureKind.NO_REPORT, "worker exited with code 0 without reporting"),
    ("sysexit0", FailureKind.NO_REPORT, "sys.exit(0)"),
])
def test_worker_death_mid_subject_is_that_subjects_failure(make_backend, tasks, do, kind, message):
    b = make_backend(workers=2)
    got = run(b, op("act"), tasks({"do": "ok"}, {"do": do}, *[{"do": "ok"}] * 4))
    assert len(got) == 6
    assert got["S1"].kind == kind and message in got["S1"].error
    assert all(o.ok for s, o in got.items() if s != "S1")


def test_memory_watchdog_stops_a_worker_past_its_limit_and_backs_off(make_backend, tasks):
    b = make_backend(workers=2, worker_memory_limit_mb=150, oom_reduce_workers_by=1)
    got = run(b, op("act"), tasks({"do": "alloc", "mb": 400}, {"do": "ok"}, {"do": "ok"}))
    assert got["S0"].kind == FailureKind.OOM and "worker_memory_limit_mb of 150" in got["S0"].error
    assert got["S1"].ok and got["S2"].ok
    assert b.effective_workers == 1
    # retried (as the engine would) at the lower concurrency, it is stopped again
    again = run(b, op("act"), tasks({"do": "alloc", "mb": 400}, attempt=2))
    assert again["S0"].kind == FailureKind.OOM and b.effective_workers == 1


def test_an_unexplained_sigkill_at_high_memory_counts_as_oom(make_backend, tasks):
    # held for 2 s at 260 MB: the watchdog (a sample every 0.1 s) sees it even on a busy machine
    b = make_backend(workers=1, worker_memory_limit_mb=300)
    got = run(b, op("act"), tasks({"do": "alloc_then_sigkill", "mb": 260, "hold": 2.0}))
    assert got["S0"].kind == FailureKind.OOM and "SIGKILL" in got["S0"].error


def test_memory_error_is_oom_and_backoff_can_be_off(make_backend, tasks):
    b = make_backend(workers=2, oom_backoff=False)
    got = run(b, op("act"), tasks({"do": "memerror"}, {"do": "ok"}))
    assert got["S0"].kind == FailureKind.OOM and b.effective_workers == 2
    b2 = make_backend(workers=3, oom_reduce_workers_by=2)
    run(b2, op("act"), tasks({"do": "memerror"}, {"do": "memerror"}))
    assert b2.effective_workers == 1  # never below one


def test_consecutive_failures_restart_the_worker(make_backend, tasks):
    b = make_backend(workers=1, persistent_worker_max_consecutive_failures=2)
    got = run(b, op("act"), tasks({"do": "raise"}, {"do": "raise"}, {"do": "ok"}, {"do": "raise"}, {"do": "ok"}))
    pids = [got[f"S{i}"].worker_pid for i in range(5)]
    assert pids[0] == pids[1] and pids[2] != pids[1]
    assert pids[3] == pids[4] == pids[2]  # one failure after a success does not restart


def test_workers_are_recycled_after_that_many_tasks(make_backend, tasks):
    b = make_backend(workers=1, persistent_worker_recycle_after_tasks=2)
    got = run(b, op("act"), tasks(*[{"do": "ok"}] * 6))
    pids = [got[f"S{i}"].result["pid"] for i in range(6)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4] == pids[5]


def test_unpicklable_things_and_big_results(make_backend, tasks):
    b = make_backend(workers=2)
    items = tasks({"do": "unpicklable_result"}, {"do": "unpicklable_exc"}, {"do": "big"},
                  {"do": "ok"}, {"do": "ok"})
    items[4].inputs = {"up": lambda: None}  # cannot be sent to a worker
    got = run(b, op("act"), items)
    assert got["S0"].kind == FailureKind.UNPICKLABLE and "not picklable" in got["S0"].error
    assert got["S1"].kind == FailureKind.EXCEPTION and "weird failure" in got["S1"].error
    assert got["S2"].ok and got["S2"].result == b"x" * (50 * 1024 * 1024)
    assert got["S3"].ok
    assert got["S4"].kind == FailureKind.UNPICKLABLE and "task is not picklable" in got["S4"].error


def test_a_failed_subject_succeeds_in_a_later_round(make_backend, tasks):
    b = make_backend(workers=1)
    [first] = tasks({"do": "flaky"})
    assert run(b, op("act"), [first])["S0"].kind == FailureKind.EXCEPTION
    [retry] = tasks({"do": "flaky"}, attempt=2)
    again = run(b, op("act"), [retry])["S0"]
    assert again.ok and again.task.attempt == 2

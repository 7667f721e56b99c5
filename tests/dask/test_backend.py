"""Backend-level behaviour of DaskBackend on real local clusters."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from habitrun.engine.contract import FailureKind, OperatorRef
from habitrun.engine.control import StopFlag
from habitrun.engine.dask_backend import DaskBackend
from tests.dask.conftest import dask_policy, echo_op, make_tasks, run_all, worker_pids

pytestmark = [pytest.mark.dask]


@pytest.mark.timeout(120)
def test_failures_are_isolated_and_outputs_land_in_each_log(shared_backend: DaskBackend, ops_dir: Path,
                                                            tmp_path: Path) -> None:
    tasks = make_tasks(tmp_path, 30)
    op = echo_op(ops_dir, fail=["S004", "S017"], bad_result=["S009"])
    seen = run_all(shared_backend, op, tasks)

    assert set(seen) == {t.subject_id for t in tasks}
    failed = {sid: o for sid, o in seen.items() if not o.ok}
    assert set(failed) == {"S004", "S017", "S009"}
    assert failed["S004"].kind == FailureKind.EXCEPTION
    assert failed["S004"].error == "ValueError: subject S004 is broken on purpose"
    assert "Traceback" in (failed["S004"].traceback or "")
    assert failed["S009"].kind == FailureKind.UNPICKLABLE
    assert seen["S001"].result["id"] == "S001"
    assert seen["S001"].worker_pid in worker_pids(shared_backend)
    log = Path(tasks[4].log_path).read_text()
    assert "echo says hello from S004" in log and "broken on purpose" in log
    assert "echo says hello from S001" in Path(tasks[1].log_path).read_text()


@pytest.mark.timeout(120)
def test_class_operator_is_built_once_per_worker_and_stage(shared_backend: DaskBackend, ops_dir: Path,
                                                          tmp_path: Path) -> None:
    builds = tmp_path / "builds"
    builds.mkdir()
    op = OperatorRef(stage="count", path="dask_test_ops:Counter", params={"build_dir": str(builds)},
                     search_path=(str(ops_dir),))
    first = run_all(shared_backend, op, make_tasks(tmp_path, 40))
    second = run_all(shared_backend, op, make_tasks(tmp_path, 10, attempt=2, prefix="R"))
    assert all(o.ok for o in [*first.values(), *second.values()])
    pids = {o.result["pid"] for o in [*first.values(), *second.values()]}
    built = sorted(p.name for p in builds.iterdir())
    assert len(built) == len(pids) <= 2, built
    assert {int(name.split("-")[1]) for name in built} == pids
    assert sum(o.result["calls"] for o in first.values()) >= 40  # instances kept counting


@pytest.mark.timeout(120)
def test_stop_from_report_cancels_what_is_queued(shared_backend: DaskBackend, ops_dir: Path,
                                                 tmp_path: Path) -> None:
    tasks = make_tasks(tmp_path, 40)
    op = echo_op(ops_dir, sleep=0.15, fail=["S001"])

    def fail_fast(outcomes, stop: StopFlag) -> None:
        if any(not o.ok for o in outcomes):
            stop.set("fail_fast")

    start = time.monotonic()
    seen = run_all(shared_backend, op, tasks, on_report=fail_fast)
    assert not seen["S001"].ok
    assert len(seen) < len(tasks) / 2, "queued subjects were not cancelled"
    assert time.monotonic() - start < 60
    started = [t for t in tasks if Path(t.log_path).exists()]
    assert len(started) < len(tasks) / 2
    # the cluster is still usable afterwards
    again = run_all(shared_backend, echo_op(ops_dir), make_tasks(tmp_path, 3, prefix="A"))
    assert all(o.ok for o in again.values())


@pytest.mark.timeout(150)
def test_timeout_restarts_the_worker_and_the_others_finish(ops_dir: Path, tmp_path: Path) -> None:
    with DaskBackend.from_policy(dask_policy(subject_timeout_sec=1.5)) as backend:
        tasks = make_tasks(tmp_path, 16)
        backend._client()
        before = worker_pids(backend)
        seen = run_all(backend, echo_op(ops_dir, sleep=0.05, hang=["S003"]), tasks)
        assert set(seen) == {t.subject_id for t in tasks}
        assert seen["S003"].kind == FailureKind.TIMEOUT
        assert "subject_timeout_sec" in seen["S003"].error
        assert all(o.ok for sid, o in seen.items() if sid != "S003")
        hung_pid = seen["S003"].worker_pid
        assert hung_pid in before
        assert "exceeded subject_timeout_sec" in Path(tasks[3].log_path).read_text()
        assert wait_pid_gone(hung_pid), "the worker running the hung subject was not stopped"
        # the slot is free again: both workers serve the next stage
        backend.handle.client.wait_for_workers(2, timeout=60)
        more = run_all(backend, echo_op(ops_dir, stage="next", sleep=0.3), make_tasks(tmp_path, 6, prefix="N"))
        assert all(o.ok for o in more.values())
        assert len({o.worker_pid for o in more.values()}) == 2


def wait_pid_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.timeout(150)
def test_memory_kill_by_the_nanny_is_recorded_as_oom(ops_dir: Path, tmp_path: Path) -> None:
    with DaskBackend.from_policy(dask_policy(worker_memory_limit_mb=350, oom_reduce_workers_by=1)) as backend:
        tasks = make_tasks(tmp_path, 8)
        seen = run_all(backend, echo_op(ops_dir, sleep=0.05, hog=["S002"]), tasks)
        assert set(seen) == {t.subject_id for t in tasks}
        assert seen["S002"].kind == FailureKind.OOM, seen["S002"]
        assert "out of memory" in seen["S002"].error
        assert all(o.ok for sid, o in seen.items() if sid != "S002")
        assert backend.effective_workers == 1  # oom_backoff


@pytest.mark.timeout(150)
def test_worker_killed_by_a_signal_is_worker_died_and_nothing_else_is_lost(ops_dir: Path, tmp_path: Path) -> None:
    with DaskBackend.from_policy(dask_policy()) as backend:
        tasks = make_tasks(tmp_path, 10)
        seen = run_all(backend, echo_op(ops_dir, sleep=0.05, die=["S005"]), tasks)
        assert set(seen) == {t.subject_id for t in tasks}
        assert seen["S005"].kind == FailureKind.WORKER_DIED, seen["S005"]
        assert all(o.ok for sid, o in seen.items() if sid != "S005"), {s: (o.kind, o.error) for s, o in seen.items() if not o.ok}


@pytest.mark.timeout(180)
def test_each_worker_death_is_charged_to_its_killer_only(ops_dir: Path, tmp_path: Path) -> None:
    """Killers right after innocents on the same worker: an innocent's outcome must never die with the worker."""
    with DaskBackend.from_policy(dask_policy()) as backend:
        tasks = make_tasks(tmp_path, 12)
        killers = {"S002", "S006", "S010"}
        seen = run_all(backend, echo_op(ops_dir, sleep=0.12, die=sorted(killers)), tasks)
        assert set(seen) == {t.subject_id for t in tasks}
        failed = {s: (o.kind, o.error) for s, o in seen.items() if not o.ok}
        assert set(failed) == killers, failed
        assert all(kind == FailureKind.WORKER_DIED for kind, _ in failed.values()), failed


@pytest.mark.timeout(150)
def test_external_kill_mid_stage_and_soft_stop(ops_dir: Path, tmp_path: Path) -> None:
    with DaskBackend.from_policy(dask_policy()) as backend:
        backend._client()
        victims = sorted(worker_pids(backend))
        tasks = make_tasks(tmp_path, 12)
        killer = threading.Timer(1.5, os.kill, args=(victims[0], signal.SIGKILL))
        killer.start()
        try:
            seen = run_all(backend, echo_op(ops_dir, sleep=0.4), tasks)
        finally:
            killer.cancel()
        assert set(seen) == {t.subject_id for t in tasks}
        died = [sid for sid, o in seen.items() if not o.ok]
        assert len(died) <= 1 and all(seen[sid].kind == FailureKind.WORKER_DIED for sid in died)
        def hellos(sid: str) -> int:
            log = Path(tmp_path / "logs" / f"{sid}.log")
            return log.read_text().count("echo says hello") if log.exists() else 0

        # the one whose worker was killed started at most once; every other subject ran exactly once
        assert all(hellos(sid) <= 1 for sid in died)
        ran_to_end = [t for t in tasks if t.subject_id not in died and hellos(t.subject_id) == 1]
        assert len(ran_to_end) == len(tasks) - len(died), "a finished subject was run twice or not at all"


@pytest.mark.timeout(60)
def test_local_cluster_listens_on_loopback_only(shared_backend: DaskBackend) -> None:
    procs = [psutil.Process(), *(psutil.Process(pid) for pid in worker_pids(shared_backend))]
    listening = [c.laddr for p in procs for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening, "found no listening sockets at all"
    assert all(addr.ip in ("127.0.0.1", "::1") for addr in listening), listening
    info = shared_backend.describe()
    assert info["address"].startswith("tcp://127.0.0.1:")
    assert info["cluster"] == "local" and info["workers"] == 2
    assert info["versions_on_workers"]["distributed"]

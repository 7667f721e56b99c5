"""Isolated mode's warm spares: used, never anybody's failure, gone at a stop, pinned to their slot."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from habitrun.engine.contract import FailureKind
from habitrun.engine.control import StopFlag
from tests.cli.test_interrupt import wait_for
from tests.process.conftest import alive, op, run


def _timed(*secs: float, tasks) -> list:
    return tasks(*[{"sec": s} for s in secs])


def _spares(b) -> list:
    return [w for w in list(b.pool.workers) if w.spare and not w.leaving]


def test_the_next_subject_runs_in_a_spare_forked_while_the_previous_ran(make_backend, tasks):
    b = make_backend(workers=1, parallel_mode="isolated")
    got = run(b, op("timed", module="spare_ops"), _timed(0.8, 0.0, tasks=tasks))
    first, second = got["S0"].result, got["S1"].result
    assert first["pid"] != second["pid"]
    assert second["forked"] < first["ended"] - 0.2  # forked (and set up) while S0 ran
    assert len(b.started_pids) == 2  # no spare forked at the stage's tail


def test_a_subjects_timeout_counts_from_its_own_start_not_its_spares_fork(make_backend, tasks):
    b = make_backend(workers=1, parallel_mode="isolated", subject_timeout_sec=1.5)
    got = run(b, op("timed", module="spare_ops"), _timed(1.0, 1.0, tasks=tasks))
    assert all(o.ok for o in got.values()), {k: o.error for k, o in got.items()}
    assert got["S1"].result["ended"] - got["S1"].result["forked"] > 1.5  # from its fork it ran too long


def test_a_spare_killed_before_its_subject_is_nobodys_failure(make_backend, tasks):
    b = make_backend(workers=1, parallel_mode="isolated")
    killed: list[int] = []

    def kill_the_spare() -> None:
        if wait_for(lambda: any(w.phase.value == "ready" for w in _spares(b)), 30):
            pid = _spares(b)[0].pid
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_the_spare)
    killer.start()
    got = run(b, op("timed", module="spare_ops"), _timed(2.0, 0.0, 0.0, tasks=tasks))
    killer.join()
    assert killed and killed[0] in b.started_pids
    assert all(o.ok for o in got.values()), {k: o.error for k, o in got.items()}
    assert killed[0] not in {o.worker_pid for o in got.values()}
    assert len(b.started_pids) == 4  # the slot got a new spare


@pytest.mark.parametrize("hard", [False, True])
def test_a_stop_while_spares_wait_leaves_none_behind(make_backend, tasks, hard):
    b = make_backend(workers=2, parallel_mode="isolated", graceful_shutdown_sec=0.5)
    stop = StopFlag()
    spares: list[int] = []

    def stop_once_spares_wait() -> None:
        if wait_for(lambda: len([w for w in _spares(b) if w.phase.value == "ready"]) == 2, 30):
            spares.extend(w.pid for w in _spares(b))
        stop.set("signal SIGINT", signum=signal.SIGINT, hard=hard)

    stopper = threading.Thread(target=stop_once_spares_wait)
    stopper.start()
    got = run(b, op("timed", module="spare_ops"), _timed(*[30.0] * 6, tasks=tasks), stop=stop)
    stopper.join()
    assert len(spares) == 2
    assert alive(spares) == []  # gone when the stage ends, not at close()
    assert not [o for o in got.values() if not o.ok]  # a stop charges nobody


def test_a_spare_is_pinned_to_the_gpu_of_the_slot_it_serves(make_backend, tasks, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    b = make_backend(workers=2, parallel_mode="isolated", cap_workers_to_gpu_pool=True)
    got = run(b, op("timed", module="spare_ops"), _timed(0.3, 0.1, 0.2, 0.3, 0.1, 0.2, 0.1, 0.1, tasks=tasks))
    runs = [o.result for o in got.values()]
    assert {r["device"] for r in runs} == {"3", "5"}
    for a in runs:  # two subjects running at once never share a device
        for c in runs:
            if a is not c and a["started"] < c["ended"] and c["started"] < a["ended"]:
                assert a["device"] != c["device"]


def test_a_slot_whose_worker_still_imports_the_operator_gets_no_spare(make_backend, tasks):
    b = make_backend(workers=2, parallel_mode="isolated", subject_spawn_timeout_sec=1.0, graceful_shutdown_sec=0.5)
    got = run(b, op("never", module="hangs_on_import"), tasks({}, {}, {}, {}, {}))
    assert {o.kind for o in got.values()} == {FailureKind.SPAWN_TIMEOUT} and len(got) == 5
    assert len(b.started_pids) == 2  # two starts timed out, the rest failed at once: no spare importing too

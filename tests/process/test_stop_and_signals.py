"""Stops charge nothing to subjects, workers live outside the runner's group, signals never
reach a recycled PID, and what cannot start fails before (or instead of) any subject."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import spawn
from pathlib import Path

import pytest

from habitrun.engine.contract import FailureKind
from habitrun.engine.control import StopFlag
from habitrun.errors import WorkerStartError
from tests.process.conftest import alive, op, run, wait_gone


def test_a_worker_dying_once_a_stop_is_asked_for_is_not_run_never_failed(make_backend, tasks):
    # S0 finishes; the stop comes, and S1's worker dies (as a Ctrl-C to its group would kill it).
    def on_batch(batch):
        if not stop.is_set():
            stop.set("signal SIGINT", signum=signal.SIGINT)
            for pid in alive(list(b.started_pids)):
                if pid != batch[0].worker_pid:
                    os.kill(pid, signal.SIGKILL)

    b = make_backend(workers=2, graceful_shutdown_sec=30, parallel_mode="isolated")
    stop = StopFlag()
    got = run(b, op("act"), tasks({"do": "ok"}, {"do": "sleep", "sec": 20}, *[{"do": "sleep", "sec": 20}] * 4),
              stop=stop, on_batch=on_batch)
    assert all(o.ok for o in got.values()), {k: o.error for k, o in got.items()}
    assert "S1" not in got


@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_workers_and_the_fork_server_are_outside_the_runners_process_group(make_backend, tasks, method):
    b = make_backend(workers=2, start_method=method)
    got = run(b, op("act"), tasks(*[{"do": "ok"}] * 4))
    assert all(o.ok for o in got.values())
    mine = os.getpgrp()
    for pid in alive(list(b.started_pids)):
        assert os.getpgid(pid) not in (mine, 0)
    servers = b.pool.spawner.servers()
    assert servers or method != "forkserver"
    for server in servers:
        assert os.getpgid(server.pid) != mine
        assert os.getsid(server.pid) != os.getsid(0)


def _take_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """Start ``setsid sleep 60`` on exactly ``pid`` (root: ns_last_pid); None if another process won it."""
    for _ in range(200):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(["setsid", "sleep", "60"])
        if proc.pid == pid:
            deadline = time.monotonic() + 5
            while os.getpgid(pid) != pid and time.monotonic() < deadline:
                time.sleep(0.005)  # until setsid(1) has made its session
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.timeout(60)
def test_burying_a_reaped_worker_never_signals_the_group_now_on_its_pid(make_backend, tasks):
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("needs root to choose the next PID (/proc/sys/kernel/ns_last_pid); "
                    "without it a PID cannot be made to recycle on purpose")
    b = make_backend(workers=1)
    assert run(b, op("act"), tasks({"do": "ok"}))["S0"].ok
    worker = b.pool.workers[0]
    os.kill(worker.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while worker.proc.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.01)  # the fork server reaps it: its PID is free from then on
    assert worker.proc.exitcode == -signal.SIGKILL
    squatter = _take_pid(worker.pid)
    if squatter is None:
        pytest.skip(f"another process took PID {worker.pid} first (a busy machine); nothing to test")
    try:
        assert os.getpgid(squatter.pid) == squatter.pid  # a group of its own, led by the recycled PID
        b.close()  # buries the dead worker: killpg(its pid) would kill the sleep
        time.sleep(0.2)
        assert squatter.poll() is None, "the runner signalled a recycled PID's process group"
    finally:
        squatter.kill()
        squatter.wait()


def test_unpicklable_params_fail_the_stage_before_any_process_starts_naming_the_parameter(make_backend, tasks):
    b = make_backend(workers=2)
    got = run(b, op("act", params={"sec": 1, "lock": threading.Lock()}), tasks({"do": "ok"}, {"do": "ok"}))
    assert b.started_pids == []
    assert {o.kind for o in got.values()} == {FailureKind.UNPICKLABLE}
    assert all("parameter 'lock'" in (o.error or "") for o in got.values()), got["S0"].error


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_no_worker_can_start_is_a_run_level_error_and_no_subject_fails(make_backend, tasks, tmp_path,
                                                                       monkeypatch, method):
    not_executable = tmp_path / "python"
    not_executable.write_text("#!/bin/sh\n")
    not_executable.chmod(0o644)
    monkeypatch.setattr(spawn, "_python_exe", str(not_executable))
    b = make_backend(workers=2, start_method=method)
    reported = []
    with pytest.raises(WorkerStartError, match="Permission denied") as err:
        b.run_tasks(op("act"), tasks(*[{"do": "ok"}] * 6), reported.extend, StopFlag())
    assert reported == []
    assert "cannot start a worker process" in str(err.value)



DYING_RUNNER = """
import os, signal, socket, sys
from habitrun.engine.contract import OperatorRef, SubjectTask
from habitrun.engine.control import StopFlag
from habitrun.engine.process import ProcessBackend
from habitrun.spec.policy import RunPolicy

if __name__ == "__main__":
    ops, root = sys.argv[1:3]
    b = ProcessBackend.from_policy(RunPolicy(workers=1))
    task = SubjectTask(key="k", subject_id="S", fields={"do": "ok"}, inputs={}, workdir=root, log_path=root + "/l.log")
    b.run_tasks(OperatorRef("s", "faults:act", {}, search_path=(ops,)), [task], lambda batch: None, StopFlag())
    server = b.pool.spawner.servers()[0]
    print(server.pid, flush=True)
    r, w = os.pipe()
    socket.send_fds(server.control, [b"not a request"], [r, w])  # a request sent...
    os.kill(os.getpid(), signal.SIGKILL)  # ...and the runner killed before reading the answer
"""


@pytest.mark.timeout(60)
def test_sigkill_of_the_runner_in_the_middle_of_a_fork_request_prints_no_traceback(tmp_path):
    from tests.process.conftest import OPS_DIR

    script = tmp_path / "runner.py"
    script.write_text(DYING_RUNNER)
    err = tmp_path / "stderr.txt"
    with err.open("wb") as stderr:
        runner = subprocess.run([sys.executable, str(script), OPS_DIR, str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=stderr, timeout=50)
    assert runner.returncode == -signal.SIGKILL
    server = int(runner.stdout.split()[0])
    assert not wait_gone([server], timeout=5), "the fork server outlived the runner"
    assert b"Traceback" not in err.read_bytes(), err.read_text()

"""Behaviours 5 (fail_fast at the backend), 14 (no orphans) and 15 (stop requests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from habitrun.engine.control import StopFlag
from tests.process.conftest import OPS_DIR, alive, op, run, wait_gone


def test_graceful_stop_lets_running_subjects_finish_and_dispatches_nothing_more(make_backend, tasks):
    # S0 is short, everything else long: S0's outcome asks to stop while the other worker
    # is on its first subject and S0's worker has at most just started the next one.
    # Those finish (a 30 s grace); nothing queued or not yet sent ever starts.
    b = make_backend(workers=2, graceful_shutdown_sec=30)
    stop = StopFlag()
    items = tasks({"do": "sleep", "sec": 0.2}, *[{"do": "sleep", "sec": 2.5}] * 9)

    def on_batch(batch):
        stop.set("SIGINT", signum=signal.SIGINT)

    got = run(b, op("act"), items, stop=stop, on_batch=on_batch)
    assert "S0" in got and all(o.ok for o in got.values()), sorted(got)
    per_worker = Counter(o.worker_pid for o in got.values())
    first = got["S0"].worker_pid
    # S0, and the run queued behind it if it started before the stop reached the worker
    assert per_worker[first] in (1, 2), sorted(got)
    # the other worker: the one subject it was running, none after it
    assert len(per_worker) == 2 and [n for pid, n in per_worker.items() if pid != first] == [1], sorted(got)
    assert not wait_gone(list(b.started_pids), timeout=5)


def test_graceful_stop_kills_subjects_that_outlast_the_grace_period(make_backend, tasks):
    b = make_backend(workers=2, graceful_shutdown_sec=0.5)
    stop = StopFlag()
    t0 = time.monotonic()
    got = run(b, op("act"), tasks({"do": "ok"}, {"do": "sleep"}, *[{"do": "ok"}] * 6),
              stop=stop, on_batch=lambda batch: stop.set("SIGTERM"))
    assert time.monotonic() - t0 < 15
    assert "S1" not in got  # not reported: it never finished
    # the busy worker was terminated, the other retired: none is left, even before close()
    assert not wait_gone(list(b.started_pids), timeout=5)


def test_fail_fast_from_report_stops_dispatching(make_backend, tasks):
    b = make_backend(workers=1)
    stop = StopFlag()

    def on_batch(batch):
        if any(not o.ok for o in batch):
            stop.set("fail_fast: subject failed")

    got = run(b, op("act"), tasks({"do": "raise"}, *[{"do": "sleep", "sec": 0.2}] * 10),
              stop=stop, on_batch=on_batch)
    assert not got["S0"].ok and len(got) <= 3


def test_hard_stop_kills_running_subjects_at_once(make_backend, tasks):
    b = make_backend(workers=2, graceful_shutdown_sec=30)
    stop = StopFlag()
    stop.set("SIGINT")
    stop.set("SIGINT again", hard=True)
    t0 = time.monotonic()
    got = run(b, op("act"), tasks(*[{"do": "sleep"}] * 4), stop=stop)
    assert got == {} and time.monotonic() - t0 < 10


RUNNER = textwrap.dedent("""
    import json, sys, time
    from habitrun.engine.contract import OperatorRef, SubjectTask
    from habitrun.engine.control import StopFlag
    from habitrun.engine.process import ProcessBackend
    from habitrun.spec.policy import RunPolicy

    if __name__ == "__main__":
        ops, root, method, pidfile, mode = sys.argv[1:6]
        b = ProcessBackend.from_policy(RunPolicy(workers=2, start_method=method, parallel_mode=mode))
        tasks = [SubjectTask(key=f"k{i}", subject_id=f"S{i}", fields={"do": "sleep", "sec": 0.3},
                             inputs={}, workdir=f"{root}/w{i}", log_path=f"{root}/l{i}.log")
                 for i in range(200)]

        def report(batch):
            with open(pidfile, "w") as f:
                json.dump(b.started_pids, f)

        b.run_tasks(OperatorRef("s", "faults:act", {}, search_path=(ops,)), tasks, report, StopFlag())
""")


@pytest.mark.timeout(60)  # not `slow`: about 1.5 s a start method, and the start methods are what differ between Pythons
@pytest.mark.parametrize("method, mode", [("forkserver", "persistent"), ("spawn", "persistent"),
                                          ("fork", "persistent"), ("forkserver", "isolated")])
def test_workers_exit_by_themselves_when_the_runner_is_sigkilled(tmp_path: Path, method, mode):
    # isolated: the pids include the waiting spares (forked once the first subjects run)
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    pidfile = tmp_path / "pids.json"
    runner = subprocess.Popen([sys.executable, str(script), OPS_DIR, str(tmp_path), method, str(pidfile), mode])
    try:
        deadline = time.monotonic() + 30
        pids: list[int] = []
        while time.monotonic() < deadline:
            if pidfile.exists():
                try:
                    pids = json.loads(pidfile.read_text())
                except ValueError:
                    pids = []
                if len(pids) >= (2 if mode == "persistent" else 6):
                    break
            time.sleep(0.05)
        assert len(pids) >= 2, "the runner never started its workers"
        assert alive(pids)
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(timeout=10)
        left = wait_gone(pids, timeout=5)
        assert not left, f"workers outlived the runner: {left}"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()

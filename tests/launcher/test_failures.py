"""One rank crashing stops the others and restarts the group; stubborn, hung and orphaned ranks die."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from habitrun.launcher import launch
from tests.launcher import ranks
from tests.launcher.conftest import is_alive

REPO = str(Path(__file__).resolve().parents[2])


def _wait_for(paths, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(Path(p).exists() and Path(p).read_text() for p in paths):
            return
        time.sleep(0.02)
    raise AssertionError(f"never appeared: {[str(p) for p in paths if not Path(p).exists()]}")


EXPECTED = {
    "exception": (1, None, "RuntimeError: rank 1 broke on attempt"),
    "exit": (3, None, "exited with code 3"),
    "sigkill": (-9, 9, "was killed by SIGKILL"),
    "segfault": (-11, 11, "was killed by SIGSEGV"),
}


@pytest.mark.parametrize(("kind", "method"), [("exception", "spawn"), ("exit", "forkserver"),
                                            ("sigkill", "forkserver"), ("segfault", "spawn")])
def test_a_crashing_rank_stops_the_others_and_the_group_restarts(tmp_path, console, kind, method):
    result = launch(ranks.crash_one, nprocs=2, log_dir=tmp_path, args=(kind, 1, str(tmp_path)),
                    max_restarts=1, grace=10, console=console, start_method=method)
    code, sig, text = EXPECTED[kind]
    assert result.status == "failed"
    assert len(result.attempts) == 2
    for n, attempt in enumerate(result.attempts):
        assert attempt.attempt == n
        failed, survivor = attempt.ranks[1], attempt.ranks[0]
        assert failed.exitcode == code and failed.signal == sig and not failed.stopped
        assert survivor.stopped and survivor.signal == signal.SIGTERM
        assert attempt.root_cause() is failed
        for rank in (0, 1):  # both ranks ran in both attempts, in fresh folders
            assert (tmp_path / f"a{n}_r{rank}.pid").exists()
            assert (tmp_path / f"attempt_{n}" / str(rank) / "stdout.log").exists()
    assert text in result.error
    assert result.root_cause.local_rank == 1
    if kind == "segfault":  # faulthandler (enabled by record) leaves the Python stack in stderr
        assert "Segmentation fault" in result.traceback
    assert any("restarting (1/1)" in line for line in console.lines)
    for n in range(2):
        assert not is_alive(int((tmp_path / f"a{n}_r0.pid").read_text()))


def test_command_rank_crash_is_reported_and_restarted(tmp_path, console):
    code = f"from tests.launcher.ranks import crash_one; crash_one('sigkill', 0, {str(tmp_path)!r})"
    result = launch([sys.executable, "-c", code], nprocs=2, log_dir=tmp_path, max_restarts=1, grace=10,
                    cwd=REPO, env={"PYTHONPATH": REPO}, console=console)
    assert result.status == "failed" and len(result.attempts) == 2
    assert result.root_cause.local_rank == 0 and result.root_cause.signal == signal.SIGKILL
    assert all(a.ranks[1].stopped for a in result.attempts)


def test_restart_count_increments_until_the_group_succeeds(tmp_path, console):
    result = launch(ranks.fail_until, nprocs=2, log_dir=tmp_path, args=(str(tmp_path), 2),
                    max_restarts=3, grace=10, console=console, start_method="forkserver")
    assert result.ok and len(result.attempts) == 3
    assert result.return_values == {0: 2, 1: 2}  # TORCHELASTIC_RESTART_COUNT seen by the ranks
    assert [a.failed for a in result.attempts] == [True, True, False]
    assert "ValueError: not yet (attempt 1)" in (result.attempts[1].ranks[1].error.message)


def test_a_rank_ignoring_sigterm_is_killed_after_the_grace(tmp_path, console):
    result = launch(ranks.stubborn, nprocs=2, log_dir=tmp_path, args=(str(tmp_path),), grace=0.5,
                    console=console)
    assert result.status == "failed"
    assert result.root_cause.local_rank == 1
    rank0 = result.last.ranks[0]
    assert rank0.stopped and rank0.signal == signal.SIGKILL
    assert not is_alive(rank0.pid)


def test_a_hung_rank_is_stopped_at_the_attempt_timeout(tmp_path, console):
    result = launch(ranks.hang, nprocs=2, log_dir=tmp_path, args=(str(tmp_path),), timeout=1.5,
                    grace=5, console=console, start_method="forkserver")
    assert result.status == "timeout"
    assert result.error.startswith("timeout")
    assert all(r.stopped and r.signal == signal.SIGTERM for r in result.last.ranks.values())
    assert all(not is_alive(r.pid) for r in result.last.ranks.values())


def test_a_wake_fd_interrupts_the_group_and_its_children(tmp_path, console):
    read_fd, write_fd = os.pipe()

    def stop_when_ready():
        _wait_for([tmp_path / "r0.pids", tmp_path / "r1.pids"])
        os.write(write_fd, b"x")

    thread = threading.Thread(target=stop_when_ready)
    thread.start()
    try:
        result = launch(ranks.with_grandchild, nprocs=2, log_dir=tmp_path, args=(str(tmp_path),),
                        grace=5, console=console, wake=[read_fd])
    finally:
        thread.join()
        os.close(read_fd)
        os.close(write_fd)
    assert result.status == "interrupted" and result.error == "interrupted"
    assert result.root_cause is None
    pids = [pid for r in (0, 1) for pid in json.loads((tmp_path / f"r{r}.pids").read_text())]
    deadline = time.monotonic() + 10
    while any(is_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if is_alive(p)], "a rank's child outlived the group"


LAUNCHER_SCRIPT = """
import sys
sys.path.insert(0, {repo!r})
from habitrun.launcher import launch
from tests.launcher import ranks
if __name__ == "__main__":
    out = {out!r}
    if {command!r}:
        code = "from tests.launcher.ranks import with_grandchild; with_grandchild(%r)" % out
        launch([sys.executable, "-c", code], nprocs=2, log_dir=out + "/logs", env={{"PYTHONPATH": {repo!r}}})
    else:
        launch(ranks.with_grandchild, nprocs=2, log_dir=out + "/logs", args=(out,), start_method={method!r})
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("entry", ["spawn", "forkserver", "command"])
def test_sigkill_of_the_launcher_leaves_no_rank_alive(tmp_path, entry):
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER_SCRIPT.format(repo=REPO, out=str(tmp_path), command=entry == "command",
                                             method=entry if entry != "command" else "spawn"))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for([tmp_path / "r0.pids", tmp_path / "r1.pids"])
    finally:
        proc.kill()
        proc.wait()
    pids = [pid for r in (0, 1) for pid in json.loads((tmp_path / f"r{r}.pids").read_text())]
    deadline = time.monotonic() + 15
    while any(is_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [p for p in pids if is_alive(p)]
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, "ranks or their children outlived a SIGKILLed launcher"


def test_keyboard_interrupt_in_a_library_caller_leaves_no_rank(tmp_path, console):
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    ready = [tmp_path / "r0.ready", tmp_path / "r1.ready"]

    def interrupt_when_ready():
        # interrupt once both ranks run (a fixed delay may come before they start on a busy machine)
        try:
            _wait_for(ready)
        finally:
            os.kill(os.getpid(), signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, interrupt)
    thread = threading.Thread(target=interrupt_when_ready)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(ranks.hang, nprocs=2, log_dir=tmp_path, args=(str(tmp_path),), grace=5, console=console,
                   start_method="forkserver")
    finally:
        thread.join()
        signal.signal(signal.SIGALRM, previous)
    pids = [int(p.read_text()) for p in ready]
    assert not [p for p in pids if is_alive(p)]


WAITING_SCRIPT = """
import os, sys
sys.path.insert(0, {repo!r})
from habitrun.launcher import start_processes
from tests.launcher import ranks
if __name__ == "__main__":
    out = {out!r}
    envs = {{r: {{**os.environ, "RANK": str(r)}} for r in range(2)}}
    ctx = start_processes("w", ranks.hang, {{r: (out,) for r in range(2)}}, envs, out + "/logs", grace=3)
    ctx.wait()
"""


@pytest.mark.timeout(90)
def test_sigint_to_a_script_waiting_on_function_ranks_closes_them_within_the_grace(tmp_path):
    script = tmp_path / "waiting.py"
    script.write_text(WAITING_SCRIPT.format(repo=str(REPO), out=str(tmp_path)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for([tmp_path / "r0.ready", tmp_path / "r1.ready"])
        pids = [int((tmp_path / f"r{r}.ready").read_text()) for r in (0, 1)]
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        proc.wait(timeout=15)  # before: the interpreter's exit joined the ranks (120 s)
        assert time.monotonic() - started < 3 + 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5
    while any(is_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if is_alive(p)]

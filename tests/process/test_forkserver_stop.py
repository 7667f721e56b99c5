"""habitrun's fork server: its stop runs its exit handlers and reaps it; each child comes with a pidfd
the server opened, which the worker's handle signals through."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from habitrun.engine.process import children
from habitrun.engine.process.forkserver import REPLY, ForkServer, ForkServerGone
from tests.process.conftest import op, run

PRELOADED = '''
import atexit, os

def _bye():
    with open(os.environ["HABITRUN_TEST_BYE"], "w") as f:
        f.write(str(os.getpid()))

atexit.register(_bye)
'''


def _wait_ready(server: ForkServer) -> None:
    deadline = time.monotonic() + 30
    while not server.ready():
        assert time.monotonic() < deadline, "the fork server never said it was ready"
        time.sleep(0.01)


@pytest.mark.timeout(60)
def test_a_stopped_server_runs_its_exit_handlers_and_leaves_no_process(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "bye_on_exit.py").write_text(PRELOADED)
    bye = tmp_path / "bye.txt"
    monkeypatch.setenv("HABITRUN_TEST_BYE", str(bye))
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    server = ForkServer(["bye_on_exit"])
    server.start()
    pid = server.pid
    _wait_ready(server)
    server.stop()
    assert bye.read_text() == str(pid)  # atexit ran in the server, as a normal exit runs it
    assert not psutil.pid_exists(pid)  # gone and reaped: not even a zombie is left
    assert server.pid is None and not server.alive()
    with pytest.raises(ForkServerGone):
        server.fork(os.getpid, (), [])


def _sleeper(fds: list[int], seconds: float) -> None:
    """A fork server child: sleeps (so it can be signalled)."""
    time.sleep(seconds)


def _exits(fds: list[int], code: int) -> None:
    os._exit(code)


@pytest.mark.timeout(60)
def test_a_child_comes_with_the_servers_pidfd_and_its_exit_code(monkeypatch) -> None:
    server = ForkServer(["tests.process.test_forkserver_stop"])
    server.start()
    try:
        child = server.fork(_sleeper, (30.0,), [])
        # the pidfd was opened by the server (another process) and passed over the socket
        assert child.pidfd is not None
        fdinfo = Path(f"/proc/self/fdinfo/{child.pidfd}").read_text()
        assert f"Pid:\t{child.pid}\n" in fdinfo
        assert psutil.Process(child.pid).ppid() == server.pid
        signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
        os.close(child.pidfd)
        child.close()
        other = server.fork(_exits, (7,), [])
        other.join(10)
        assert other.exitcode == 7
        other.close()
        os.close(other.pidfd)
        assert server.control is not None
        socket.send_fds(server.control, [b"not a pickle"], [])  # what no runner sends: refused, not forked
        reply, fds, _, _ = socket.recv_fds(server.control, 4096, 2)
        assert fds == [] and reply.startswith(REPLY.pack(-1)) and b"cannot read the request" in reply
        assert server.alive()
    finally:
        server.stop()


@pytest.mark.timeout(90)
def test_the_worker_handle_signals_through_the_pidfd_the_fork_server_sent(make_backend, tasks, monkeypatch):
    """The runner never opens a pidfd itself for a forkserver worker: with pidfd_open failing
    here, each worker still has one (the server's), and a kill through it ends the worker."""

    def refused(pid: int, flags: int = 0) -> int:
        raise OSError("pidfd_open refused in the runner")

    monkeypatch.setattr(os, "pidfd_open", refused)
    monkeypatch.setattr(children.os, "pidfd_open", refused)
    b = make_backend(workers=1, start_method="forkserver")
    assert run(b, op("act"), tasks({"do": "ok"}))["S0"].ok
    [worker] = b.pool.workers
    assert worker.pidfd is not None and worker.pidfd == worker.proc.pidfd
    assert f"Pid:\t{worker.pid}\n" in Path(f"/proc/self/fdinfo/{worker.pidfd}").read_text()
    sent: list[tuple[int, int]] = []
    real_send = signal.pidfd_send_signal

    def watched(pidfd: int, sig: int, *rest: object) -> None:
        sent.append((pidfd, sig))
        real_send(pidfd, sig, *rest)

    monkeypatch.setattr(signal, "pidfd_send_signal", watched)
    worker.kill()
    worker.proc.join(10)
    assert worker.proc.exitcode == -signal.SIGKILL
    assert sent and {fd for fd, _ in sent} == {worker.pidfd}, sent  # through the server's pidfd, never a number
    assert signal.SIGKILL in {sig for _, sig in sent}

"""The private fork server's stop: it ends at once, runs its exit handlers, and is reaped."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from habitrun.engine.process.forkserver import PrivateForkServer

PRELOADED = '''
import atexit, os

def _bye():
    with open(os.environ["HABITRUN_TEST_BYE"], "w") as f:
        f.write(str(os.getpid()))

atexit.register(_bye)
'''


@pytest.mark.timeout(60)
def test_a_stopped_server_runs_its_exit_handlers_and_leaves_no_process(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "bye_on_exit.py").write_text(PRELOADED)
    bye = tmp_path / "bye.txt"
    monkeypatch.setenv("HABITRUN_TEST_BYE", str(bye))
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    server = PrivateForkServer()
    server.set_forkserver_preload(["bye_on_exit"])
    server.ensure_running()
    pid = server._forkserver_pid
    address = server._forkserver_address
    deadline = time.monotonic() + 30
    while not server.ready():
        assert time.monotonic() < deadline, "the fork server never said it was ready"
        time.sleep(0.01)
    server._stop()
    assert bye.read_text() == str(pid)  # atexit ran in the server, as a normal exit runs it
    assert not psutil.pid_exists(pid)  # gone and reaped: not even a zombie is left
    assert server._forkserver_pid is None and server._forkserver_alive_fd is None
    assert not Path(address).exists()

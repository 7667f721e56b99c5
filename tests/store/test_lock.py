"""The store lock: a second run is refused with the holder named; a killed holder frees it."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import psutil
import pytest

from habitrun.errors import LockHeldError, StoreError
from habitrun.store.lock import StoreLock, default_lock_path, holder_alive, read_holder
from tests.conftest import wait_gone

HOLDER = """
import os, sys, time
from pathlib import Path
from habitrun.store.lock import StoreLock
lock = StoreLock(Path(sys.argv[1]), what="the test store")
lock.acquire()
if len(sys.argv) > 2:  # leave a forked child behind that inherited the descriptor
    pid = os.fork()
    if pid == 0:  # the fork hooks have run: say so from here, not from the parent
        os.write(1, f"child {os.getpid()}\\n".encode())  # one write: the parent writes too
        time.sleep(120)
        os._exit(0)
os.write(1, f"locked {os.getpid()}\\n".encode())
time.sleep(120)
"""


def wait_locked(proc, *words: str) -> dict[str, int]:
    seen: dict[str, int] = {}
    while not {"locked", *words} <= seen.keys():
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        word, pid = line.split()
        seen[word] = int(pid)
    return seen


@pytest.mark.timeout(60)
def test_second_process_is_refused_then_succeeds_after_sigkill(tmp_path: Path, child) -> None:
    path = tmp_path / "store.lock"
    proc = child(HOLDER, str(path))
    pid = wait_locked(proc)["locked"]
    with pytest.raises(LockHeldError) as info:
        StoreLock(path, what="the test store").acquire()
    message = str(info.value)
    assert f"pid {pid}" in message and socket.gethostname() in message and "since" in message
    assert "wait for it to finish or stop it" in message and "habitrun" in message
    info_now = read_holder(path)
    assert info_now and info_now["pid"] == pid and holder_alive(info_now) is True
    os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    with StoreLock(path) as lock:  # no manual step: the kernel released it
        assert lock.held
        assert read_holder(path)["pid"] == os.getpid()
    assert read_holder(path) is None  # released cleanly: holder info cleared


@pytest.mark.timeout(120)
def test_a_forked_child_does_not_keep_the_store_locked(tmp_path: Path, child) -> None:
    path = tmp_path / "store.lock"
    proc = child(HOLDER, str(path), "fork")
    seen = wait_locked(proc, "child")
    try:
        os.kill(seen["locked"], signal.SIGKILL)
        proc.wait(timeout=30)
        assert psutil.pid_exists(seen["child"])  # the inheriting child is still there...
        with StoreLock(path):  # ...and the lock is free anyway
            pass
    finally:
        try:
            os.kill(seen["child"], signal.SIGKILL)
        except ProcessLookupError:
            pass
        assert not wait_gone([seen["child"]], timeout=10)


def test_same_process_twice_is_refused_and_release_is_idempotent(tmp_path: Path) -> None:
    first = StoreLock(tmp_path / "x.lock")
    first.acquire()
    first.acquire()  # re-entrant on the same object
    with pytest.raises(LockHeldError, match=f"pid {os.getpid()}"):
        StoreLock(tmp_path / "x.lock").acquire()
    first.release()
    first.release()
    with StoreLock(tmp_path / "x.lock"):
        pass


def test_unusable_lock_location_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot create the lock file"):
        StoreLock(blocker / "store.lock").acquire()


def test_default_lock_path_sits_beside_the_store(tmp_path: Path) -> None:
    assert default_lock_path(tmp_path / "store") == tmp_path / "store.lock"


@pytest.mark.timeout(60)
def test_the_recorded_process_start_is_psutils_create_time(tmp_path: Path, child) -> None:
    """Read from /proc without importing psutil, the start time still equals psutil's, so a lock
    file written by an earlier release (which used psutil) is judged the same way."""
    path = tmp_path / "store.lock"
    proc = child(HOLDER, str(path))
    pid = wait_locked(proc)["locked"]
    info = read_holder(path)
    assert info is not None
    assert abs(info["process_start"] - psutil.Process(pid).create_time()) < 0.01
    assert holder_alive(info) is True
    assert holder_alive({**info, "process_start": info["process_start"] - 5}) is False  # pid reused
    proc.kill()
    proc.wait(timeout=30)
    assert holder_alive(info) is False
    assert holder_alive({**info, "pid": -1}) is False

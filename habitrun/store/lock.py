"""The store lock: one run writes a store at a time.

``flock`` on an open descriptor, so the kernel drops the lock the moment its
holder dies: no stale lock after a crash and never a manual unlock step.
The file is never deleted (deleting a lock file lets two processes lock two
different inodes) and never truncated before it is held; once held, the
holder writes who it is (pid, host, since, command) for the message the
next run shows. Forked children close their inherited copy, so a worker
that outlives a killed runner cannot keep the store locked.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from habitrun.errors import LockHeldError, StoreError
from habitrun.store.folders import folder_error

log = logging.getLogger(__name__)
_HELD: set[int] = set()


def _close_inherited() -> None:
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_inherited)


def _process_start(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch, as psutil's ``create_time``), None if it is gone.

    On Linux it is read from ``/proc`` as psutil does: importing psutil was 6-10 ms of every
    `run` (its own start goes in the lock file) and of a `status` that checks a holder.
    """
    if sys.platform.startswith("linux"):
        try:
            return _linux_process_start(pid)
        except (OSError, ValueError, IndexError):
            return None
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def _linux_process_start(pid: int) -> float:
    """psutil's formula: field 22 of ``/proc/<pid>/stat`` (clock ticks after boot) plus the boot time."""
    if pid <= 0:
        raise ValueError(pid)
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    ticks = float(data[data.rfind(b")") + 2:].split()[19])
    with open("/proc/stat", "rb") as f:
        boots = [float(line.split()[1]) for line in f if line.startswith(b"btime")]
    return ticks / os.sysconf("SC_CLK_TCK") + boots[0]


def _parse(text: str) -> dict[str, Any] | None:
    try:
        info = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return None
    return info if isinstance(info, dict) and "pid" in info else None


def holder_alive(info: dict[str, Any]) -> bool | None:
    """Whether the process named in holder info still runs (None: it runs on another host)."""
    if info.get("host") != socket.gethostname():
        return None
    started = _process_start(int(info.get("pid", -1)))
    if started is None:
        return False
    recorded = info.get("process_start")
    return recorded is None or abs(started - float(recorded)) < 1.0


def read_holder(path: Path) -> dict[str, Any] | None:
    """The holder info written in the lock file, without locking (for `status`)."""
    try:
        return _parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def live_holder(path: Path) -> dict[str, Any] | None:
    """Who holds the lock now, read without locking (`plan` and `status` must never keep a run from
    taking it): the holder's info while its process runs (or runs on another host, where it cannot
    be checked), None when nobody does. A released lock is empty; a dead holder's info stays behind.
    """
    holder = read_holder(path)
    if holder is None or holder_alive(holder) is False:
        return None
    return holder


class StoreLock:
    """Exclusive, crash-safe lock on a store (a context manager)."""

    def __init__(self, path: Path, *, what: str | None = None) -> None:
        self.path = Path(path)
        self.what = what or str(self.path.parent)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise LockHeldError naming the holder."""
        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            reason = folder_error(self.path.parent, exc).message
            raise StoreError(f"cannot create the lock file {self.path}: {reason}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = self._holder_info(fd)
            os.close(fd)
            raise LockHeldError(self._held_message(info)) from None
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"cannot lock {self.path}: {exc.strerror or exc}") from None
        _HELD.add(fd)
        self._fd = fd
        self._write_holder(fd)
        log.debug("lock: %s taken by pid %d", self.path, os.getpid())

    def release(self) -> None:
        """Drop the lock (the kernel does the same if the process dies)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _HELD.discard(fd)
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> StoreLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- holder info ---------------------------------------------------------------------------
    @staticmethod
    def _write_holder(fd: int) -> None:
        now = time.time()
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.fromtimestamp(now).astimezone().isoformat(timespec="seconds"),
            "since_ts": now,
            "process_start": _process_start(os.getpid()),
            "command": " ".join(["habitrun", *sys.argv[1:]]) if sys.argv else "habitrun",
        }
        data = json.dumps(info).encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except OSError:  # a full disk: the lock holds all the same, only the holder's name is missing
            pass

    @staticmethod
    def _holder_info(fd: int) -> dict[str, Any] | None:
        # The holder writes its info right after locking; give it a moment to appear.
        for _ in range(25):
            try:
                size = os.fstat(fd).st_size
                info = _parse(os.pread(fd, max(size, 1), 0).decode("utf-8", "replace"))
            except OSError:
                info = None
            if info is not None:
                return info
            time.sleep(0.02)
        return None

    def _held_message(self, info: dict[str, Any] | None) -> str:
        if info is None:
            return (
                f"{self.what} is in use by another habitrun process (lock {self.path}); "
                "wait for it to finish or stop it"
            )
        who = f"pid {info.get('pid')} on {info.get('host')} since {info.get('since')}"
        cmd = info.get("command")
        if cmd:
            who += f" (`{cmd}`)"
        if holder_alive(info) is False:
            return (
                f"{self.what} is locked; the run that took the lock, {who}, has exited, but a "
                f"process it started still holds {self.path}. Stop that process "
                f"(`fuser {self.path}` names it) and try again"
            )
        return f"{self.what} is in use by {who}; wait for it to finish or stop it"


def default_lock_path(store_dir: Path) -> Path:
    """Where a store's lock lives: beside the store folder, so it works (and the folder stays
    untouched) even when the store path holds something else."""
    store_dir = Path(store_dir)
    return store_dir.parent / f"{store_dir.name}.lock"

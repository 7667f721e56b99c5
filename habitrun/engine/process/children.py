"""A started worker process as the runner sees it: its PID, its pidfd, a sentinel fd, its exit code.

One interface for the three ways a worker starts, so the pool never asks how:
forked by habitrun's fork server (:class:`ServedChild`: the server reaps it and
writes its exit code down a pipe), spawned by the runner (:class:`SpawnedChild`,
a ``subprocess.Popen``), or forked by the runner through multiprocessing's
public ``Process`` (:class:`ForkedChild`). Each comes with a pidfd obtained
before the process could be reaped (by the fork server right after its fork,
or by the runner, its parent, before it waits), which the worker's handle uses
for every signal; ``sentinel`` turns readable when the process has ended.
"""

from __future__ import annotations

import math
import os
import select
import struct
import subprocess
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

STATUS = struct.Struct("i")  # an exit code as the fork server writes it
UNKNOWN_EXIT = 255  # the fork server ended before it could say (as multiprocessing reports it)


def open_own_pidfd(pid: int) -> int | None:
    """A pidfd for a child of ours not waited for yet (so ``pid`` is still that child); None without pidfds."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def readable(fd: int, timeout: float | None) -> bool:
    """``fd`` has something to read (or is at end-of-file) within ``timeout`` seconds (None: no limit)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))))


class WorkerProcess:
    """What the pool needs of a worker process (``pidfd`` is handed to, and closed by, its handle)."""

    pid: int
    pidfd: int | None
    sentinel: int

    @property
    def exitcode(self) -> int | None:
        """None while it runs; its exit code, or minus the signal that killed it."""
        raise NotImplementedError

    def join(self, timeout: float | None = None) -> None:
        """Wait until it has ended, at most ``timeout`` seconds."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the sentinel (the process has ended, or is left to end alone)."""
        raise NotImplementedError


class ServedChild(WorkerProcess):
    """A worker forked by the fork server: ``status_fd`` gets its exit code when the server reaps it."""

    def __init__(self, pid: int, status_fd: int, pidfd: int | None) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.sentinel = status_fd
        self._code: int | None = None

    @property
    def exitcode(self) -> int | None:
        if self._code is None and self.sentinel >= 0 and readable(self.sentinel, 0):
            self._read_status()
        return self._code

    def _read_status(self) -> None:
        try:
            data = os.read(self.sentinel, STATUS.size)
        except OSError:
            data = b""
        self._code = STATUS.unpack(data)[0] if len(data) == STATUS.size else UNKNOWN_EXIT

    def join(self, timeout: float | None = None) -> None:
        if self._code is None and self.sentinel >= 0 and readable(self.sentinel, timeout):
            self._read_status()

    def close(self) -> None:
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1


class SpawnedChild(WorkerProcess):
    """A worker the runner started as a fresh interpreter; ``sentinel`` is a pidfd of its own, else a pipe
    whose other end only the worker holds."""

    def __init__(self, popen: subprocess.Popen[bytes], pidfd: int | None, life_fd: int | None) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.pidfd = pidfd
        self.sentinel = os.dup(pidfd) if pidfd is not None else life_fd  # type: ignore[assignment]
        if pidfd is not None and life_fd is not None:
            os.close(life_fd)

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1


class ForkedChild(WorkerProcess):
    """A worker the runner forked through ``multiprocessing``'s fork context."""

    def __init__(self, proc: BaseProcess) -> None:
        self.proc = proc
        self.pid = proc.pid  # type: ignore[assignment]
        self.pidfd = open_own_pidfd(self.pid)  # not joined yet: the PID is still this child's
        self.sentinel = proc.sentinel

    @property
    def exitcode(self) -> int | None:
        return self.proc.exitcode

    def join(self, timeout: float | None = None) -> None:
        self.proc.join(timeout)

    def close(self) -> None:
        """Nothing to do: multiprocessing closes the sentinel when the process object goes."""

"""Runner-side bookkeeping for one worker process."""

from __future__ import annotations

import os
import signal
from collections import deque
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from habitrun.engine.contract import OperatorRef, SubjectTask
from habitrun.engine.process.beacon import Beacon
from habitrun.engine.process.memory import Watched
from habitrun.engine.process.protocol import TERMINATE, FrameReader, dumps, frame, write_all
from habitrun.launcher import signalling as launcher_signalling

HAVE_PIDFD = hasattr(os, "pidfd_open")


def signal_group(worker: WorkerHandle, sig: int) -> None:
    """Signal the worker's process group (it and everything its subject started).

    Only through the worker's pidfd, so a recycled PID is never hit (see
    :mod:`habitrun.launcher.signalling`); a worker whose pidfd could not be
    opened had already gone, and is left alone.
    """
    if worker.pidfd is None and HAVE_PIDFD:
        return
    launcher_signalling.signal_group(worker.pid, sig, worker.pidfd)


class WorkerHandle:
    """One worker: its process, pipe, what it owes us and why it may be ending.

    ``outstanding`` holds the runs sent and not yet answered, oldest first
    (replies come back in order); the others are queued ahead so the worker
    never waits for the runner. Which of them runs now, the beacon says (the
    worker may hold the replies of some it finished): see :meth:`progress`.
    """

    def __init__(self, slot: int, proc: BaseProcess, conn: Connection, watched: Watched, now: float,
                 beacon: Beacon) -> None:
        self.slot = slot
        self.proc = proc
        self.conn = conn
        self.beacon = beacon
        self.replies = 0  # runs answered so far (the beacon counts the runs taken)
        self.fd = conn.fileno()
        self.frames = FrameReader()  # replies that arrived in part
        self.pid: int = proc.pid  # type: ignore[assignment]
        self.pidfd = launcher_signalling.open_pidfd(self.pid)  # the only way we signal it
        self.watched = watched
        self.op: OperatorRef | None = None
        self.binding = False
        self.bind_deadline: float | None = None
        self.outstanding: deque[SubjectTask] = deque()
        self.head_since = now
        self.sent = 0
        self.successes = 0
        self.consecutive_failures = 0
        self.leaving = False  # retired, told to exit, or done (isolated): its exit is expected
        self.stop_sent = False  # we signalled it
        self.kill_at: float | None = None
        self.conn_open = True
        self.can_send = True
        self.dead = False
        self.scratch_path: str | None = None  # its fds 1 and 2 (see invoke)
        self.log_owed: tuple[SubjectTask, int, str] | None = None  # (task, output start, what happened)

    def progress(self) -> tuple[int, int | None, float]:
        """``(ended, running, started_at)`` from the beacon.

        ``outstanding[:ended]`` finished, their replies still held in the worker;
        ``outstanding[running]`` has been running since ``started_at`` (``running`` is
        None when the worker runs nothing now, e.g. between two runs).
        """
        reading = self.beacon.read()
        ahead = min(reading.taken - self.replies, len(self.outstanding))
        if ahead <= 0:
            return 0, None, 0.0
        if reading.running:
            return ahead - 1, ahead - 1, reading.started_at
        return ahead, None, 0.0

    def terminate(self, now: float, kill_after: float) -> None:
        """SIGTERM to the group now, SIGKILL at ``now + kill_after`` if still alive.

        TERMINATE down the pipe as well: the worker's reader thread acts on it
        even when the subject ignores SIGTERM.
        """
        if self.can_send:
            try:
                write_all(self.fd, frame(dumps((TERMINATE,))))
            except OSError:
                pass
        self.stop_sent = True
        self.leaving = True
        self.can_send = False
        if kill_after <= 0:
            self.kill()
            return
        signal_group(self, signal.SIGTERM)
        self.kill_at = now + kill_after

    def kill(self) -> None:
        self.stop_sent = True
        self.leaving = True
        self.can_send = False
        self.kill_at = None
        signal_group(self, signal.SIGKILL)

    def close_pidfd(self) -> None:
        if self.pidfd is not None:
            try:
                os.close(self.pidfd)
            except OSError:
                pass
            self.pidfd = None

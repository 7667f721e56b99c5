"""Runner-side bookkeeping for one worker process."""

from __future__ import annotations

import os
import signal
from collections import deque
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from habitrun.engine.backend import OperatorRef, SubjectTask
from habitrun.engine.process.beacon import Beacon
from habitrun.engine.process.memory import Watched
from habitrun.engine.process.protocol import FrameReader


def signal_group(pid: int, sig: int, *, may_be_leader_only: bool = True) -> None:
    """Signal the worker's process group (it and everything its subject started).

    A worker that has not yet made itself a group leader is signalled alone;
    ``may_be_leader_only=False`` skips that fallback once the worker is known
    dead, so a recycled pid is never hit.
    """
    try:
        os.killpg(pid, sig)
        return
    except ProcessLookupError:
        pass
    except PermissionError:
        return
    if may_be_leader_only:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Worker:
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
        """SIGTERM to the group now, SIGKILL at ``now + kill_after`` if still alive."""
        self.stop_sent = True
        self.leaving = True
        self.can_send = False
        if kill_after <= 0:
            self.kill()
            return
        signal_group(self.pid, signal.SIGTERM)
        self.kill_at = now + kill_after

    def kill(self) -> None:
        self.stop_sent = True
        self.leaving = True
        self.can_send = False
        self.kill_at = None
        signal_group(self.pid, signal.SIGKILL)

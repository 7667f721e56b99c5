"""Runner-side handle of one worker process: its phase, pipe, and the runs it owes."""

from __future__ import annotations

import logging
import os
import signal
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from habitrun.engine.contract import OperatorRef, SubjectTask
from habitrun.engine.process.beacon import Beacon
from habitrun.engine.process.children import WorkerProcess
from habitrun.engine.process.memory import Watched
from habitrun.engine.process.phases import WorkerPhase, check_move
from habitrun.engine.process.protocol import TERMINATE, FrameReader, dumps, frame, write_all
from habitrun.launcher import signalling as launcher_signalling

HAVE_PIDFD = hasattr(os, "pidfd_open")
log = logging.getLogger(__name__)

STARTING = WorkerPhase.STARTING
READY = WorkerPhase.READY
RETIRING = WorkerPhase.RETIRING
STOPPING = WorkerPhase.STOPPING
DEAD = WorkerPhase.DEAD


def signal_group(worker: WorkerHandle, sig: int) -> None:
    """Signal the worker's process group (it and everything its subject started).

    Only through the pidfd the worker came with (opened before it could be
    reaped: see :mod:`~habitrun.engine.process.children`), so a recycled PID is
    never hit (see :mod:`habitrun.launcher.signalling`); a worker without one
    on a system that has pidfds is left alone.
    """
    if worker.pidfd is None and HAVE_PIDFD:
        return
    launcher_signalling.signal_group(worker.pid, sig, worker.pidfd)


class WorkerHandle:
    """One worker: its process, pipe, phase, and what it owes us.

    ``outstanding`` holds the runs sent and not yet answered, oldest first
    (replies come back in order): what the worker owes. Which of them runs
    now, the beacon says (the worker may hold the replies of some it
    finished): see :meth:`progress`. The phase changes only through
    :meth:`move`, along :data:`~habitrun.engine.process.phases.TRANSITIONS`.
    """

    def __init__(self, slot: int, proc: WorkerProcess, conn: Connection, watched: Watched, now: float,
                 beacon: Beacon) -> None:
        self.slot = slot
        self.proc = proc
        self.conn = conn
        self.beacon = beacon
        self.phase = STARTING
        self.replies = 0  # runs answered so far (the beacon counts the runs taken)
        self.fd = conn.fileno()
        self.frames = FrameReader()  # replies that arrived in part
        self.reading = True  # its replies are watched: the pipe has not ended
        self.writable = True  # no write to it has failed
        self.pid: int = proc.pid
        self.pidfd = proc.pidfd  # the only way we signal it; never re-opened from the bare PID
        self.watched = watched
        self.op: OperatorRef | None = None  # the operator of its last BIND
        self.bind_until: float | None = None  # a BIND awaits its answer until then (inf: no limit)
        self.outstanding: deque[SubjectTask] = deque()
        self.recalling = False  # a RECALL awaits its RECALLED: nothing more is sent to it until then
        self.head_since = now
        self.successes = 0
        self.consecutive_failures = 0
        self.kill_at: float | None = None  # SIGKILL then (set while STOPPING)
        self.scratch_path: str | None = None  # its fds 1 and 2 (see invoke)
        self.log_owed: tuple[SubjectTask, int, str] | None = None  # (task, output start, what happened)
        self.spare = False  # isolated mode: started ahead for its slot, waiting for a subject (see spares)

    # ------------------------------------------------------------ phase
    def move(self, phase: WorkerPhase) -> None:
        """The one place the phase changes; raises IllegalTransition off the table."""
        check_move(self.phase, phase, self.pid)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("worker %s: %s -> %s", self.pid, self.phase.value, phase.value)
        self.phase = phase

    @property
    def leaving(self) -> bool:
        """Its exit is expected: retiring, stopping or dead."""
        phase = self.phase
        return phase is not READY and phase is not STARTING

    @property
    def signalled(self) -> bool:
        """We sent it SIGTERM or SIGKILL (and it is not buried yet)."""
        return self.phase is STOPPING

    @property
    def dead(self) -> bool:
        return self.phase is DEAD

    @property
    def binding(self) -> bool:
        return self.bind_until is not None

    @property
    def can_send(self) -> bool:
        phase = self.phase
        return self.writable and phase is not STOPPING and phase is not DEAD

    def retire(self) -> None:
        """From now on its exit is expected (it was told to leave, or is done)."""
        if not self.leaving:
            self.move(RETIRING)

    def bound(self) -> None:
        """Its BIND was answered (BOUND or BIND_ERROR)."""
        self.bind_until = None
        if self.phase is STARTING:
            self.move(READY)

    # ------------------------------------------------------------- pipe
    def send(self, message: tuple[Any, ...]) -> bool:
        return self.send_bytes(dumps(message))

    def send_bytes(self, data: bytes) -> bool:
        """One message down the pipe; False when it cannot take it (its sentinel will say why)."""
        if not self.can_send:
            return False
        try:
            self.conn.send_bytes(data)
            return True
        except OSError:  # BrokenPipe/ConnectionReset: the worker is dying
            self.writable = False
            return False

    def write(self, data: bytes) -> bool:
        """Frames already made (several runs in one write); False when the pipe is broken."""
        try:
            write_all(self.fd, data)
            return True
        except OSError:  # BrokenPipe/ConnectionReset: the worker is dying; its sentinel will say how
            self.writable = False
            return False

    def unstarted(self) -> int:
        """How many of its runs it has not started yet (the beacon's view: it may start one any moment)."""
        ended, running, _ = self.progress()
        return len(self.outstanding) - ended - (running is not None)

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

    # ---------------------------------------------------------- signals
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
        self._to_stopping()
        if kill_after <= 0:
            self.kill()
            return
        signal_group(self, signal.SIGTERM)
        self.kill_at = now + kill_after

    def kill(self) -> None:
        self._to_stopping()
        self.kill_at = None
        signal_group(self, signal.SIGKILL)

    def _to_stopping(self) -> None:
        if self.phase is not STOPPING:
            self.move(STOPPING)

    def close_pidfd(self) -> None:
        if self.pidfd is not None:
            try:
                os.close(self.pidfd)
            except OSError:
                pass
            self.pidfd = None

"""How a run ends without its reply: its worker's death, its timeout, a start that hangs, a stop's grace.

Every such end is charged here, to the one subject it belongs to (the beacon
says which run was in hand); the runs the worker had finished but not
reported, and the ones queued behind, go back to the stage (or are dropped
once a stop is asked for). Also here: the nearest of these deadlines, which
is how long the stage's loop may sleep.
"""

from __future__ import annotations

import math
import signal
import time

from habitrun.engine.contract import FailureKind, OperatorRef
from habitrun.engine.control import StopFlag
from habitrun.engine.process.book import StageBook
from habitrun.engine.process.death import classify_exit
from habitrun.engine.process.handle import WorkerHandle
from habitrun.engine.process.memory import kernel_oom_note
from habitrun.engine.process.pool import WorkerPool
from habitrun.spec.policy import RunPolicy

KILL_AFTER_STOP_SEC = 1.0  # SIGTERM -> SIGKILL once a stop's grace period is over


class Endings:
    """Deaths and deadlines of one stage's workers."""

    def __init__(self, pool: WorkerPool, book: StageBook, policy: RunPolicy, stop: StopFlag,
                 op: OperatorRef) -> None:
        self.pool, self.book, self.policy, self.stop, self.op = pool, book, policy, stop, op
        self.grace_until: float | None = None  # a graceful stop's end: then whatever runs is stopped
        self.start_fail_streak = 0  # workers in a row that did not bind in time

    def started(self) -> None:
        """A worker bound the operator: starts do work."""
        self.start_fail_streak = 0

    def next_deadline(self, spawn_at: float | None) -> float | None:
        """The nearest moment something must happen (``spawn_at``: the next start attempt, if any)."""
        timeout = self.policy.subject_timeout_sec
        times: list[float] = []
        if self.grace_until is not None:
            times.append(self.grace_until)
        if spawn_at is not None:
            times.append(spawn_at)  # try another start then, even with no worker left to wake us
        for w in self.pool.live():
            if w.kill_at is not None:
                times.append(w.kill_at)
            if w.signalled:
                continue
            if w.bind_until is not None:
                if w.bind_until != math.inf:
                    times.append(w.bind_until)
            elif w.outstanding and timeout is not None:
                _, running, started_at = w.progress()
                # Nothing running yet: whatever starts next cannot time out before now + timeout.
                times.append(started_at + timeout if running is not None else time.monotonic() + timeout)
        return min(times) if times else None

    def on_death(self, w: WorkerHandle, now: float) -> None:
        """``w`` ended (what it sent before is read): charge its run in hand, send the rest again, bury it."""
        book = self.book
        exitcode = w.proc.exitcode
        ended, running, started_at = w.progress()
        book.requeue([w.outstanding.popleft() for _ in range(ended)])  # ran, but the replies died with it
        if w.outstanding and self.stop.is_set():
            book.give_back(w)  # a death once a stop is asked for is the stop's doing: not run
        if w.outstanding:
            # The one it was running; when it ran none, the next (so a worker that keeps
            # dying between subjects still uses them up).
            task = w.outstanding.popleft()
            since = started_at if running is not None else w.head_since
            kernel_note = None
            if exitcode == -signal.SIGKILL and not w.signalled:
                kernel_note = kernel_oom_note(w.watched, self.policy.worker_memory_limit_mb)
            death = classify_exit(exitcode, oom_note=w.watched.oom_note, kernel_oom_note=kernel_note)
            if w.binding:
                death_msg = f"{death.message} while starting (importing or building the operator)"
            else:
                death_msg = death.message
            book.fail(w, task, death.kind, death_msg, now - since)
            # its output: from the beacon's mark; a first bind's from the start; otherwise unknown
            first_bind = w.binding and w.replies == 0
            w.log_owed = (task, w.beacon.read().output_from if running is not None else (0 if first_bind else -1),
                          death_msg)
            book.give_back(w)
        self.pool.bury(w)

    def on_deadlines(self, now: float) -> None:
        """Act on every deadline passed: kills due, starts and subjects out of time, a stop's grace over."""
        timeout = self.policy.subject_timeout_sec
        spawn_timeout = self.policy.subject_spawn_timeout_sec
        for w in self.pool.live():
            if w.kill_at is not None and now >= w.kill_at:
                w.kill()
                continue
            if w.signalled:
                continue
            if w.bind_until is not None:
                if now >= w.bind_until:
                    self.start_timed_out(w, now, spawn_timeout or 0.0)
            elif w.outstanding and timeout is not None:
                self._subject_timed_out(w, now, timeout)
        if self.grace_until is not None and now >= self.grace_until:
            self.grace_until = None
            for w in self.pool.live():
                if (w.outstanding or w.binding) and not w.signalled:
                    self.book.give_back(w)
                    w.terminate(now, KILL_AFTER_STOP_SEC)

    def _subject_timed_out(self, w: WorkerHandle, now: float, timeout: float) -> None:
        ended, running, started_at = w.progress()
        if running is None or now < started_at + timeout:
            return
        self.book.requeue([w.outstanding.popleft() for _ in range(ended)])  # replies still held: lost with it
        task = w.outstanding.popleft()
        self.book.fail(w, task, FailureKind.TIMEOUT, f"subject exceeded its subject_timeout_sec of {timeout:g} s",
                       now - started_at)
        w.log_owed = (task, w.beacon.read().output_from,
                      f"timed out after {now - started_at:.1f} s (subject_timeout_sec {timeout:g}); stopped")
        self.book.give_back(w)
        w.terminate(now, self.policy.graceful_shutdown_sec)

    def start_timed_out(self, w: WorkerHandle, now: float, budget: float) -> None:
        error = (f"worker did not start and bind operator {self.op.path!r} within "
                 f"subject_spawn_timeout_sec of {budget:g} s")
        if w.outstanding:
            task = w.outstanding.popleft()
            self.book.fail(w, task, FailureKind.SPAWN_TIMEOUT, error, now - w.head_since)
            w.log_owed = (task, 0 if w.replies == 0 else -1, error)
        self.book.give_back(w)
        w.terminate(now, self.policy.graceful_shutdown_sec)
        self.start_fail_streak += 1
        # Every slot failed to start in a row: the operator's import hangs; do not pay
        # one start timeout per remaining subject.
        if self.start_fail_streak >= max(2, self.pool.effective) and not self.book.stopping:
            self.book.fail_queue(error + f" ({self.start_fail_streak} workers in a row)", FailureKind.SPAWN_TIMEOUT)

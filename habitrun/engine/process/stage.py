"""The event loop of one stage on the process backend (one ``run_tasks`` call).

It waits on the pool's selector (every worker's pipe and process sentinel,
and the stop flag) with the nearest deadline as its timeout (see
``endings``): it wakes on a result, a death or a deadline, never on a
polling tick.

Every worker the policy allows is started while subjects are pending, and
a subject of unknown or long duration goes to a worker only when that worker
is free: a subject never waits queued behind another while a worker is idle
or not started yet. Only once the stage's subjects are known to be short
(their durations so far, see ``book``) does a worker get subjects queued
ahead of the one it runs, sent together in one write and refilled at half
depth. Once nothing is queued, a worker that runs nothing takes back what
busy workers have queued and not started (RECALL, answered by RECALLED:
see ``inbox``), so queueing deep never holds a subject behind a long one
while a worker is idle. A worker is rebound (BIND) when the stage's
operator differs from the one it holds; the BIND precedes the stage's runs
on the same pipe, so it can never run the previous stage's operator.

Outcomes are reported (and so committed) before anything slow is started:
booting a fork server takes most of a second, which a finished subject must
not wait for.
"""

from __future__ import annotations

import logging
import math
import select
import time
from collections.abc import Sequence
from typing import Any

from habitrun.engine.contract import FailureKind, OperatorRef, ReportFn, SubjectTask
from habitrun.engine.control import StopFlag
from habitrun.engine.invoke import one_line
from habitrun.engine.process import protocol as P
from habitrun.engine.process.admission import Admission
from habitrun.engine.process.book import StageBook
from habitrun.engine.process.endings import Endings
from habitrun.engine.process.handle import WorkerHandle
from habitrun.engine.process.pool import WorkerPool
from habitrun.errors import OperatorBindError, WorkerStartError
from habitrun.spec.operators import split_import_path

log = logging.getLogger(__name__)

SPAWN_RETRY_SEC = 1.0  # after a failed start (other workers alive), try another start no sooner


def _unpicklable_param(op: OperatorRef) -> str:
    """Which of the operator's params cannot be pickled, in words (the first one found)."""
    for name, value in op.params.items():
        try:
            P.dumps((value,))
        except BaseException as exc:  # noqa: BLE001 - whatever pickling raises names the problem
            return f"parameter {name!r} of stage {op.stage!r} cannot be sent to a worker: {one_line(exc)}"
    return f"the operator of stage {op.stage!r} cannot be sent to a worker"


class StageRun:
    """The event loop of one ``run_tasks`` call, over the backend's pool."""

    def __init__(self, pool: WorkerPool, op: OperatorRef, tasks: Sequence[SubjectTask], report: ReportFn,
                 stop: StopFlag, scratch_dir: str | None, admission: tuple | None = None) -> None:
        self.pool = pool
        self.mode = pool.mode
        self.policy = pool.policy
        self.op = op
        self.module = split_import_path(op.path)[0]
        self.book = StageBook(tasks, pool)
        self.endings = Endings(pool, self.book, self.policy, stop, op)
        self.report = report
        self.stop = stop
        self.scratch_dir = scratch_dir
        self.hard_done = False
        self.debug = log.isEnabledFor(logging.DEBUG)  # checked once: the dispatch path pays nothing without it
        self.spawn_after = 0.0  # no start attempt before this (after a failed one)
        self.bind_data: bytes | None = None
        self.admission: Admission | None = None  # a memory budget's admission (see admission)
        if admission is not None:
            budget, model, stats = admission
            self.admission = self.book.admission = Admission(
                budget, model, stats, pool.live, lambda: self.book.mean_sec, recycles=self.mode.learns,
                slots=lambda: pool.effective)

    # -------------------------------------------------------------- loop
    def run(self) -> None:
        try:
            self.bind_data = P.dumps(P.bind_message(self.op))
        except BaseException:  # noqa: BLE001 - fail the stage's tasks before any process starts
            self.book.fail_queue(_unpicklable_param(self.op), FailureKind.UNPICKLABLE)
            self.flush()
            return
        self.pool.reap_finished()
        stop_fd = self.stop.fileno()
        self.pool.watch(stop_fd)
        try:
            self.loop()
        finally:
            self.pool.unwatch(stop_fd)

    def loop(self) -> None:
        book = self.book
        while True:
            now = time.monotonic()
            self.check_stop(now)
            if not book.stopping:
                self.shrink_to_effective()
                self.fill(now)  # keep the running workers busy first
            # Report (and so commit) what finished before starting anything: a start may be slow.
            if self.flush():
                continue
            if not book.stopping and self.spawn_as_needed(now):
                self.fill(now)
                if self.flush():
                    continue
            if self.mode.keeps_spares:  # isolated mode: the busy slots' next processes, ready (see spares)
                self.pool.keep_spares(self.op, self.module, 0 if book.stopping else len(book.queue),
                                      self.bind, now, self.scratch_dir)
            if self.done():
                return
            self.wait_and_handle()

    def flush(self) -> bool:
        """Report the outcomes gathered so far; True when the report asked to stop (fail_fast)."""
        if not self.book.batch:
            return False
        self.report(self.book.take_batch())
        # the report asked to stop: act on it before waiting
        return self.stop.is_set() and (not self.book.stopping or (self.stop.hard and not self.hard_done))

    def done(self) -> bool:
        live = self.pool.live()
        if any(w.signalled and w.proc.exitcode is None for w in live):
            return False
        if self.book.stopping:
            return not any(w.outstanding for w in live)
        return self.book.owed() <= 0

    def check_stop(self, now: float) -> None:
        if not self.stop.is_set():
            return
        if not self.book.stopping:
            self.book.drop_queue()
            if not self.stop.hard:
                self.endings.grace_until = now + self.policy.graceful_shutdown_sec
                for w in self.pool.live():  # idle ones too: a stop ends the run, nothing more will come
                    if w.can_send and not w.leaving:
                        w.send((P.RETIRE,))
                        w.retire()
        if self.stop.hard and not self.hard_done:
            self.hard_done = True
            for w in self.pool.live():
                if w.outstanding or w.binding:
                    self.book.give_back(w)
                    w.kill()

    # ------------------------------------------------------------ workers
    def shrink_to_effective(self) -> None:
        active = self.pool.active()
        excess = len(active) - self.pool.effective
        if excess <= 0:
            return
        for w in sorted(active, key=lambda w: len(w.outstanding))[:excess]:
            w.retire()
            w.send((P.RETIRE,))

    def can_take(self, w: WorkerHandle) -> bool:
        if w.leaving or not w.can_send or w.recalling or len(w.outstanding) >= self.book.depth:
            return False
        return self.mode.may_take(w)

    def spawn_as_needed(self, now: float) -> bool:
        """Start workers up to the policy's number while subjects wait for a free one; True if any started.

        A slot to queue ahead in a busy worker does not count as free: the
        subject would wait for the one before it, a new worker would run it now.
        """
        started = False
        queue = self.book.queue
        active = self.pool.active()
        free = sum(1 for w in active if not w.outstanding and self.can_take(w))
        admission = self.admission
        while queue and len(active) < self.pool.effective and len(queue) > free and now >= self.spawn_after:
            if admission is not None and active and not admission.wants_worker():
                return started
            try:
                w = self.pool.spawn(self.op, self.module, now, self.scratch_dir)
            except Exception as exc:  # noqa: BLE001 - a failed start is never a subject's failure
                if self.stop.is_set():
                    return started  # the stop may have caused it; nothing more starts anyway
                if not self.pool.live():
                    raise WorkerStartError(
                        f"cannot start a worker process for stage {self.op.stage!r}: {one_line(exc)}; "
                        "no subject was run or recorded as failed") from exc
                self.spawn_after = time.monotonic() + SPAWN_RETRY_SEC  # go on with the workers there are
                return started
            if w.op != self.op:  # a spare comes bound
                self.bind(w, now)
            active.append(w)
            free += 1
            started = True
        return started

    def bind(self, w: WorkerHandle, now: float) -> None:
        w.op = self.op
        timeout = self.policy.subject_spawn_timeout_sec
        w.bind_until = now + timeout if timeout is not None else math.inf
        w.send_bytes(self.bind_data or P.dumps(P.bind_message(self.op)))

    def fill(self, now: float) -> None:
        book = self.book
        book.learn()
        queue = book.queue
        active = self.pool.active()
        if len(active) > 1:
            active.sort(key=lambda w: len(w.outstanding))  # the idlest first: what is left goes where it runs now
        for w in active:
            if w.op != self.op:
                if w.outstanding or not w.can_send:
                    continue
                self.bind(w, now)
            # Refill at half depth, in one write: a short subject then costs a
            # fraction of a wake-up on both sides.
            if not queue or len(w.outstanding) > book.depth // 2 or not self.can_take(w):
                continue
            # Near the end of the stage, share what is left rather than queue it all on one worker.
            room = self.mode.room(w, min(book.depth - len(w.outstanding), -(-len(queue) // len(active))))
            frames: list[bytes] = []
            while queue and len(frames) < room:
                task = queue.popleft() if self.admission is None else self.admission.take(queue, w, now)
                if task is None:  # no subject fits the memory budget on it now
                    break
                try:
                    data = P.run_frame(task)
                except BaseException as exc:  # noqa: BLE001 - an unpicklable task fails alone
                    book.fail(None, task, FailureKind.UNPICKLABLE, f"task is not picklable: {one_line(exc)}")
                    continue
                if not w.outstanding:
                    w.head_since = now
                w.outstanding.append(task)
                frames.append(data)
            if frames:
                w.write(frames[0] if len(frames) == 1 else b"".join(frames))
                if self.debug:
                    sent = list(w.outstanding)[-len(frames):]
                    log.debug("stage %s: dispatch %d run(s) to worker %s (%d queued there): %s", self.op.stage,
                              len(frames), w.pid, len(w.outstanding),
                              ", ".join(f"{t.subject_id}#{t.attempt}" for t in sent))
        if not queue:
            self.take_back(active)

    def take_back(self, active: list[WorkerHandle]) -> None:
        """A worker is idle and nothing is queued: recall the runs busy workers have not started.

        What comes back (RECALLED) is queued again and shared out by the next
        fill, so queueing deep never leaves a worker idle while a subject waits.
        """
        if self.book.stopping or not any(self.idle(w) for w in active):
            return
        for w in active:
            if not w.recalling and not w.leaving and w.can_send and w.unstarted() > 0:
                if self.admission is not None and w.unstarted() >= len(w.outstanding):
                    continue  # admission placed it there and it starts now: recalling would only move it
                w.recalling = w.send((P.RECALL,))

    def idle(self, w: WorkerHandle) -> bool:
        """Ready for this stage's runs and running none."""
        return not w.outstanding and not w.binding and w.op == self.op and self.can_take(w)

    # -------------------------------------------------------------- waiting
    def wait_and_handle(self) -> None:
        book = self.book
        spawn_at = self.spawn_after if book.queue and self.spawn_after and not book.stopping else None
        deadline = self.endings.next_deadline(spawn_at)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = self.pool.wait(timeout)
        now = time.monotonic()
        ended: list[WorkerHandle] = []
        for w, is_pipe in ready:
            if is_pipe:
                if w.reading:
                    self.read(w, now)
            else:
                ended.append(w)
        for w in ended:
            if not w.dead and w.proc.exitcode is not None:
                if w.reading:
                    self.drain(w, now)
                self.endings.on_death(w, now)
        self.endings.on_deadlines(now)

    def read(self, w: WorkerHandle, now: float) -> bool:
        """Handle every reply one read brings; False once the pipe has ended."""
        try:
            frames = w.frames.read(w.fd)
        except OSError:
            frames = None
        if frames is None:
            self.pool.stop_reading(w)
            return False
        for data in frames:
            try:
                message = P.loads(data)
            except Exception as exc:  # noqa: BLE001 - a result the runner cannot rebuild fails its subject
                if w.outstanding:
                    w.replies += 1
                    self.book.fail(w, w.outstanding.popleft(), FailureKind.UNPICKLABLE,
                                   f"result could not be unpickled in the runner: {one_line(exc)}")
                    w.head_since = now
                continue
            self.on_message(w, message, now)
        return True

    def drain(self, w: WorkerHandle, now: float) -> None:
        """Read what a dead worker sent before dying, without waiting for more."""
        poller = select.poll()
        poller.register(w.fd, select.POLLIN)
        while w.reading and poller.poll(0):
            if not self.read(w, now):
                return

    def on_message(self, w: WorkerHandle, msg: tuple[Any, ...], now: float) -> None:
        tag = msg[0]
        if tag == P.DONE:
            if not w.outstanding:
                return
            w.replies += 1
            outcome = P.read_done(msg, w.outstanding.popleft())
            if self.debug:
                log.debug("stage %s: worker %s: %s#%d %s%s", self.op.stage, w.pid, outcome.task.subject_id,
                          outcome.task.attempt, "done" if outcome.ok else f"failed ({outcome.kind})",
                          f" in {outcome.duration_sec:.6f} s")
            self.book.record(w, outcome)
            w.head_since = now
            if outcome.ok:
                w.successes += 1
                w.consecutive_failures = 0
            else:
                w.consecutive_failures += 1
            if self.mode.after_done(w, outcome.ok):
                w.retire()
                w.send((P.RETIRE,))
        elif tag == P.BOUND:
            w.bound()
            w.head_since = now
            self.endings.started()
            if w.op is not None:
                self.pool.prove(w.op, split_import_path(w.op.path)[0])
        elif tag == P.BIND_ERROR:
            w.bound()
            w.head_since = now
            if w.spare:  # nobody's failure: the slot's next fresh worker binds (and reports) again
                w.kill()
            elif not self.book.stopping:  # the stage's error, not its subjects' (see OperatorBindError)
                self.flush()
                raise OperatorBindError.for_stage(self.op.stage, self.op.path, P.read_bind_error(msg))
        elif tag == P.RECALLED:
            w.recalling = False
            self.book.take_back(w, P.read_recalled(msg))
        elif tag == P.SKIPPED and w.outstanding:
            w.replies += 1
            task = w.outstanding.popleft()
            if not self.book.stopping:
                self.book.queue.appendleft(task)

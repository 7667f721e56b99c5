"""ProcessBackend: subjects run in worker processes, persistent or one per subject.

One event loop per ``run_tasks`` call waits (one selector, kept for the
backend's life, every worker's pipe and process sentinel registered once)
on the workers and on the stop flag, with the nearest deadline (subject
timeout, start timeout, kill escalation, shutdown grace) as its timeout: it
wakes on a result, a death or a deadline, never on a polling tick.

Every worker the policy allows is started while subjects are pending, and
a subject of unknown or long duration goes to a worker only when that worker
is free: a subject never waits queued behind another while a worker is idle
or not started yet. Only once the stage's subjects are known to be short
(their durations so far) does a worker get subjects queued ahead of the one
it runs, so it never waits for the runner: about ``TARGET_QUEUED_SEC`` of
work, sent together in one write and refilled at half depth, so a short
subject costs a fraction of a wake-up on each side. What is queued ahead is
at most that much work, so a worker left idle at a stage's tail waits for no
more than that. Replies come back in
order, one per subject; a worker holds successes up to ``REPLY_HOLD_SEC``
while more runs wait behind them, so several share one write and one
wake-up of the runner (see ``outbox``). What a worker runs right now, and
since when, its beacon says (shared memory, see ``beacon``): a subject's
timeout counts from its own start, a death is charged to the subject that
was running, the ones it finished but had not reported yet are run again,
and the queued ones are simply sent again.

Workers live as long as the backend, so consecutive stages reuse them; a
worker is rebound (BIND) when the stage's operator differs from the one it
holds, and the BIND precedes the stage's runs on the same pipe, so it can
never run the previous stage's operator.

Shutdown on a stop request: stop dispatching at once; when not ``hard``,
running subjects get ``graceful_shutdown_sec`` to finish (and are reported),
then the rest get SIGTERM and, one second later, SIGKILL (the grace was
already given). A ``hard`` stop SIGKILLs the running subjects at once. Once a
stop is requested, no worker's death and no failed start is charged to a
subject: those subjects are simply not run (a resume runs them).

Outcomes are reported (and so committed) before anything slow is started:
booting a fork server takes most of a second, which a finished subject must
not wait for.

A worker that cannot be started is never a subject's failure: with other
workers alive the stage goes on with fewer; with none, the stage ends with a
run-level :class:`~habitrun.errors.WorkerStartError` naming the cause.
"""

from __future__ import annotations

import itertools
import os
import select
import selectors
import signal
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait
from typing import Any

from habitrun.engine.contract import (
    Backend,
    FailureKind,
    OperatorRef,
    ReportFn,
    SubjectOutcome,
    SubjectTask,
)
from habitrun.engine.control import StopFlag
from habitrun.engine.invoke import log_header, one_line, read_capped
from habitrun.engine.process import protocol as P
from habitrun.engine.process.beacon import Beacon
from habitrun.engine.process.death import classify_exit
from habitrun.engine.process.gpu import detect_gpus, device_for_slot
from habitrun.engine.process.handle import WorkerHandle, signal_group
from habitrun.engine.process.memory import MemoryWatchdog, kernel_oom_note
from habitrun.engine.process.spawner import WorkerSpawner
from habitrun.engine.process.worker import WorkerConfig
from habitrun.errors import WorkerStartError
from habitrun.spec.operators import split_import_path
from habitrun.spec.policy import RunPolicy

KILL_AFTER_STOP_SEC = 1.0  # SIGTERM -> SIGKILL once a stop's grace period is over
TARGET_QUEUED_SEC = 0.06  # work queued ahead per worker when subjects are short (5 ms: ~15% more runner CPU at w=1 ms)
REPLY_HOLD_SEC = 0.04  # a worker holds a success at most this long to send it with the next ones
MAX_DEPTH = 64  # runs a worker holds at most (running + queued)
PER_SUBJECT_COST_SEC = 50e-6  # a worker's own cost per subject, on top of the operator's
SPAWN_RETRY_SEC = 1.0  # after a failed start (other workers alive), try another start no sooner


def _unpicklable_param(op: OperatorRef) -> str:
    """Which of the operator's params cannot be pickled, in words (the first one found)."""
    for name, value in op.params.items():
        try:
            P.dumps((value,))
        except BaseException as exc:  # noqa: BLE001 - whatever pickling raises names the problem
            return f"parameter {name!r} of stage {op.stage!r} cannot be sent to a worker: {one_line(exc)}"
    return f"the operator of stage {op.stage!r} cannot be sent to a worker"


def _ignore_sigpipe() -> None:
    """A vanished worker must surface as BrokenPipeError, never kill the runner."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGPIPE) == signal.SIG_DFL:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)


class ProcessBackend(Backend):
    """Runs tasks in worker processes on this machine, honouring every RunPolicy field it owns."""

    name = "process"

    def __init__(self, policy: RunPolicy) -> None:
        self.policy = policy
        self._isolated = policy.parallel_mode == "isolated"
        self._devices = detect_gpus() if policy.cap_workers_to_gpu_pool else []
        self._requested = policy.workers
        self._effective = min(policy.workers, len(self._devices)) if self._devices else policy.workers
        self._launcher = WorkerSpawner(policy.start_method, policy.worker_threads)
        self._watchdog = MemoryWatchdog(policy.worker_memory_limit_mb, self._watchdog_kill)
        self._workers: list[WorkerHandle] = []
        self._sel = selectors.DefaultSelector()  # every live worker's pipe and sentinel
        self._oom_events = 0
        self._closed = False
        self._scratch_ids = itertools.count()
        _ignore_sigpipe()
        self.started_pids: list[int] = []  # every worker pid ever started (tests, provenance)

    @classmethod
    def from_policy(cls, policy: RunPolicy) -> ProcessBackend:
        return cls(policy)

    @property
    def effective_workers(self) -> int:
        return self._effective

    def warm(self) -> None:
        if not self._closed:
            self._launcher.warm()

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "workers": self._effective,
            "requested_workers": self._requested,
            "parallel_mode": self.policy.parallel_mode,
            "start_method": self.policy.start_method,
            "worker_threads": self.policy.worker_threads,
            "gpus": list(self._devices),
            "worker_memory_limit_mb": self.policy.worker_memory_limit_mb,
            "oom_events": self._oom_events,
            "workers_started": len(self.started_pids),
        }

    # ------------------------------------------------------------------ run
    def run_tasks(self, op: OperatorRef, tasks: Sequence[SubjectTask], report: ReportFn, stop: StopFlag) -> None:
        if self._closed:
            raise RuntimeError("ProcessBackend is closed")
        if not tasks:
            return
        _StageRun(self, op, tasks, report, stop).run()

    def running(self) -> int:
        """Workers with a subject in hand (pipelined ones wait behind it and are not counted)."""
        return sum(1 for w in list(self._workers) if not w.dead and w.outstanding)

    # ------------------------------------------------------------ workers
    def _live(self) -> list[WorkerHandle]:
        return [w for w in self._workers if not w.dead]

    def _active(self) -> list[WorkerHandle]:
        return [w for w in self._workers if not w.dead and not w.leaving]

    def _spawn(self, op: OperatorRef, module: str, now: float) -> WorkerHandle:
        used = {w.slot for w in self._active()}
        slot = next(i for i in range(len(used) + 1) if i not in used)
        config = WorkerConfig(
            slot=slot,
            threads=self.policy.worker_threads,
            cuda_device=device_for_slot(self._devices, slot),
            max_tasks=1 if self._isolated else 0,
            max_consecutive_failures=0 if self._isolated else self.policy.persistent_worker_max_consecutive_failures,
            reply_hold_sec=0.0 if self._isolated else REPLY_HOLD_SEC,
            scratch_path=os.path.join(self.scratch_dir or tempfile.gettempdir(),
                                      f"habitrun-worker-{os.getpid()}-{next(self._scratch_ids)}.out"),
            log_max_bytes=self._log_max_bytes(),
        )
        close_fds = [w.conn.fileno() for w in self._workers if w.conn_open]
        beacon = Beacon()
        proc, conn = self._launcher.start(config, module, op.search_path, close_fds, beacon)
        worker = WorkerHandle(slot, proc, conn, self._watchdog.watch(proc.pid), now, beacon)
        worker.scratch_path = config.scratch_path
        self._workers.append(worker)
        self._sel.register(worker.fd, selectors.EVENT_READ, (worker, True))
        self._sel.register(proc.sentinel, selectors.EVENT_READ, (worker, False))
        self.started_pids.append(worker.pid)
        return worker

    def _log_max_bytes(self) -> int:
        return int(self.policy.log_max_mb * (1 << 20))

    def _write_death_log(self, worker: WorkerHandle) -> None:
        """The subject a dead or timed-out worker was running: what it printed, then what happened."""
        if worker.log_owed is None:
            return
        task, start, what = worker.log_owed
        worker.log_owed = None
        output = b""
        if start >= 0 and worker.scratch_path:
            try:
                fd = os.open(worker.scratch_path, os.O_RDONLY)
                try:
                    output = read_capped(fd, start, os.fstat(fd).st_size, self._log_max_bytes())
                finally:
                    os.close(fd)
            except OSError:
                output = b""
        code = worker.proc.exitcode
        ended = classify_exit(code).message if code is not None else "worker did not end"
        memory = f"; its memory last seen at {worker.watched.last_rss_mb:.0f} MB" if worker.watched.last_rss_mb else ""
        if output and not output.endswith(b"\n"):
            output += b"\n"
        line = f"--- habitrun: {what} (pid {worker.pid}: {ended}{memory}) ---\n"
        try:
            os.makedirs(os.path.dirname(task.log_path), exist_ok=True)
            with open(task.log_path, "ab") as log:
                log.write(log_header(task, worker.pid) + output + line.encode())
        except OSError:
            pass  # a log that cannot be written changes nothing about the outcome

    def _watchdog_kill(self, pid: int) -> None:
        for w in list(self._workers):  # the watchdog's thread: a snapshot of the list
            if w.pid == pid and not w.dead:
                signal_group(w, signal.SIGKILL)

    def _note_oom(self) -> None:
        self._oom_events += 1
        if self.policy.oom_backoff:
            self._effective = max(1, self._effective - self.policy.oom_reduce_workers_by)

    def _forget_fd(self, fd: int) -> None:
        try:
            self._sel.unregister(fd)
        except (KeyError, ValueError):
            pass

    def _close_conn(self, worker: WorkerHandle) -> None:
        """No more replies will come: stop watching the pipe (an ended pipe is always 'ready')."""
        if worker.conn_open:
            worker.conn_open = False
            self._forget_fd(worker.fd)

    def _bury(self, worker: WorkerHandle) -> None:
        """The worker is gone: kill what it left in its group, release everything of it."""
        worker.dead = True
        signal_group(worker, signal.SIGKILL)  # through its pidfd: never a recycled PID's group
        worker.close_pidfd()
        self._watchdog.forget(worker.pid)
        self._close_conn(worker)
        self._forget_fd(worker.proc.sentinel)
        try:
            worker.conn.close()
        except OSError:
            pass
        worker.proc.join(timeout=1.0)
        self._write_death_log(worker)
        if worker.scratch_path:
            try:
                os.unlink(worker.scratch_path)
            except OSError:
                pass
        self._workers.remove(worker)

    def _reap_finished(self) -> None:
        """Forget workers that ended between calls (nothing was owed by them)."""
        for w in list(self._workers):
            if w.proc.exitcode is not None and not w.outstanding:
                self._bury(w)

    # ------------------------------------------------------------- close
    def close(self, graceful: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        now = time.monotonic()
        for w in self._live():
            if graceful and not w.outstanding and w.can_send:
                w.leaving = True
                try:
                    w.conn.send_bytes(P.dumps((P.EXIT,)))
                except OSError:
                    w.kill()
            elif graceful:
                w.terminate(now, self.policy.graceful_shutdown_sec)
            else:
                w.kill()
        deadline = now + (self.policy.graceful_shutdown_sec if graceful else 0.0) + 0.5
        killed_all = False
        while True:
            pending = [w for w in self._live() if w.proc.exitcode is None]
            if not pending:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                if killed_all:
                    break
                for w in pending:
                    w.kill()
                killed_all = True
                deadline = time.monotonic() + 5.0
                continue
            wait([w.proc.sentinel for w in pending], timeout=left)
        for w in self._live():
            self._bury(w)
        self._sel.close()
        self._watchdog.close()
        self._launcher.close()
        if self.scratch_dir:
            try:
                os.rmdir(self.scratch_dir)  # only when empty: a SIGKILLed run's leftovers stay to be seen
            except OSError:
                pass


class _StageRun:
    """The event loop of one ``run_tasks`` call."""

    def __init__(self, backend: ProcessBackend, op: OperatorRef, tasks: Sequence[SubjectTask],
                 report: ReportFn, stop: StopFlag) -> None:
        self.b = backend
        self.policy = backend.policy
        self.op = op
        self.module = split_import_path(op.path)[0]
        self.queue: deque[SubjectTask] = deque(tasks)
        self.owed = len(tasks)
        self.report = report
        self.stop = stop
        self.batch: list[SubjectOutcome] = []
        self.stopping = False
        self.hard_done = False
        self.grace_until: float | None = None
        self.start_fail_streak = 0
        self.spawn_after = 0.0  # no start attempt before this (after a failed one)
        self.bind_data: bytes | None = None
        recycle = self.policy.persistent_worker_recycle_after_tasks
        self.recycle = 0 if backend._isolated else recycle
        self.depth = 1  # one to a worker until subjects are known to be short (learn)
        self.mean_sec: float | None = None  # running mean of this stage's subject durations
        self.unlearned = [0.0, 0]  # (sum, count) of durations not yet in mean_sec

    # -------------------------------------------------------------- outcomes
    def finish(self, worker: WorkerHandle | None, task: SubjectTask, ok: bool, *, result: Any = None,
               error: str | None = None, kind: str | None = None, traceback: str | None = None,
               duration: float = 0.0, usage: tuple | None = None) -> None:
        # positional: keyword arguments cost more than the object, once per subject
        self.batch.append(SubjectOutcome(task, ok, result, error, None if ok else kind, traceback, duration,
                                         worker.pid if worker else None, usage))
        self.owed -= 1
        if not ok and kind == FailureKind.OOM:
            self.b._note_oom()
        if worker is not None and not self.b._isolated:
            unlearned = self.unlearned
            unlearned[0] += duration
            unlearned[1] += 1

    def learn(self) -> None:
        """Queue ahead only when subjects are short: about TARGET_QUEUED_SEC of work per worker.

        Subjects longer than half of that go one to a worker (depth 1): a second one
        queued behind would wait while another worker may be idle. Called once per
        batch of replies (before refilling), with the batch's mean duration.
        """
        total, count = self.unlearned
        if not count:
            return
        self.unlearned = [0.0, 0]
        duration = total / count
        mean = duration if self.mean_sec is None else 0.8 * self.mean_sec + 0.2 * duration
        self.mean_sec = mean
        self.depth = max(1, min(MAX_DEPTH, int(TARGET_QUEUED_SEC / (mean + PER_SUBJECT_COST_SEC))))

    def fail_queue(self, error: str, kind: str) -> None:
        while self.queue:
            self.finish(None, self.queue.popleft(), False, error=error, kind=kind)

    def give_back(self, worker: WorkerHandle) -> None:
        """Runs sent to a worker that will not run them: send them again, or drop them when stopping."""
        rest = list(worker.outstanding)
        worker.outstanding.clear()
        self.requeue(rest)

    def requeue(self, tasks: list[SubjectTask]) -> None:
        """Run these again (first), or drop them when stopping (a resume runs them)."""
        if self.stopping:
            self.owed -= len(tasks)
        else:
            self.queue.extendleft(reversed(tasks))

    # -------------------------------------------------------------- loop
    def run(self) -> None:
        try:
            self.bind_data = P.dumps((P.BIND, self.op))
        except BaseException:  # noqa: BLE001 - fail the stage's tasks before any process starts
            self.fail_queue(_unpicklable_param(self.op), FailureKind.UNPICKLABLE)
            self.flush()
            return
        self.b._reap_finished()
        stop_fd = self.stop.fileno()
        self.b._sel.register(stop_fd, selectors.EVENT_READ, None)
        try:
            self.loop()
        finally:
            self.b._forget_fd(stop_fd)

    def loop(self) -> None:
        while True:
            now = time.monotonic()
            self.check_stop(now)
            if not self.stopping:
                self.shrink_to_effective()
                self.fill(now)  # keep the running workers busy first
            # Report (and so commit) what finished before starting anything: a start may be slow.
            if self.flush():
                continue
            if not self.stopping and self.spawn_as_needed(now):
                self.fill(now)
                if self.flush():
                    continue
            if self.done():
                return
            self.wait_and_handle()

    def flush(self) -> bool:
        """Report the outcomes gathered so far; True when the report asked to stop (fail_fast)."""
        if not self.batch:
            return False
        batch, self.batch = self.batch, []
        self.report(batch)
        # the report asked to stop: act on it before waiting
        return self.stop.is_set() and (not self.stopping or (self.stop.hard and not self.hard_done))

    def done(self) -> bool:
        live = self.b._live()
        if any(w.stop_sent and w.proc.exitcode is None for w in live):
            return False
        if self.stopping:
            return not any(w.outstanding for w in live)
        return self.owed <= 0

    def check_stop(self, now: float) -> None:
        if not self.stop.is_set():
            return
        if not self.stopping:
            self.stopping = True
            self.owed -= len(self.queue)
            self.queue.clear()
            if not self.stop.hard:
                self.grace_until = now + self.policy.graceful_shutdown_sec
                for w in self.b._live():  # idle ones too: a stop ends the run, nothing more will come
                    if w.can_send and not w.leaving:
                        self.send(w, (P.RETIRE,))
                        w.leaving = True
        if self.stop.hard and not self.hard_done:
            self.hard_done = True
            for w in self.b._live():
                if w.outstanding or w.binding:
                    self.give_back(w)
                    w.kill()

    def shrink_to_effective(self) -> None:
        active = self.b._active()
        excess = len(active) - self.b._effective
        if excess <= 0:
            return
        for w in sorted(active, key=lambda w: len(w.outstanding))[:excess]:
            w.leaving = True
            self.send(w, (P.RETIRE,))

    def can_take(self, w: WorkerHandle) -> bool:
        if w.leaving or not w.can_send or len(w.outstanding) >= self.depth:
            return False
        if self.b._isolated:
            return w.sent == 0
        if self.recycle and w.successes + len(w.outstanding) >= self.recycle:
            return False
        return True

    def spawn_as_needed(self, now: float) -> bool:
        """Start workers up to the policy's number while subjects wait for a free one; True if any started.

        A slot to queue ahead in a busy worker does not count as free: the
        subject would wait for the one before it, a new worker would run it now.
        """
        started = False
        active = self.b._active()
        free = sum(1 for w in active if not w.outstanding and self.can_take(w))
        while self.queue and len(active) < self.b._effective and len(self.queue) > free \
                and now >= self.spawn_after:
            try:
                w = self.b._spawn(self.op, self.module, now)
            except Exception as exc:  # noqa: BLE001 - a failed start is never a subject's failure
                if self.stop.is_set():
                    return started  # the stop may have caused it; nothing more starts anyway
                if not self.b._live():
                    raise WorkerStartError(
                        f"cannot start a worker process for stage {self.op.stage!r}: {one_line(exc)}; "
                        "no subject was run or recorded as failed") from exc
                self.spawn_after = time.monotonic() + SPAWN_RETRY_SEC  # go on with the workers there are
                return started
            self.bind(w, now)
            active.append(w)
            free += 1
            started = True
        return started

    def bind(self, w: WorkerHandle, now: float) -> None:
        w.op = self.op
        w.binding = True
        timeout = self.policy.subject_spawn_timeout_sec
        w.bind_deadline = now + timeout if timeout is not None else None
        self.send_bytes(w, self.bind_data or P.dumps((P.BIND, self.op)))

    def fill(self, now: float) -> None:
        self.learn()
        active = self.b._active()
        for w in active:
            if w.op != self.op:
                if w.outstanding or not w.can_send:
                    continue
                self.bind(w, now)
            # Refill at half depth, in one write: a short subject then costs a
            # fraction of a wake-up on both sides.
            if not self.queue or len(w.outstanding) > self.depth // 2 or not self.can_take(w):
                continue
            # Near the end of the stage, share what is left rather than queue it all on one worker.
            room = min(self.depth - len(w.outstanding), -(-len(self.queue) // len(active)))
            if self.recycle:
                room = min(room, self.recycle - w.successes - len(w.outstanding))
            if self.b._isolated:
                room = 1
            frames: list[bytes] = []
            while self.queue and len(frames) < room:
                task = self.queue.popleft()
                try:
                    data = P.dumps((P.RUN, P.task_tuple(task)))
                except BaseException as exc:  # noqa: BLE001 - an unpicklable task fails alone
                    self.finish(None, task, False, kind=FailureKind.UNPICKLABLE,
                                error=f"task is not picklable: {one_line(exc)}")
                    continue
                if not w.outstanding:
                    w.head_since = now
                w.outstanding.append(task)
                w.sent += 1
                frames.append(P.frame(data))
            if frames:
                self.write(w, frames[0] if len(frames) == 1 else b"".join(frames))

    def write(self, w: WorkerHandle, data: bytes) -> bool:
        try:
            P.write_all(w.fd, data)
            return True
        except OSError:  # BrokenPipe/ConnectionReset: the worker is dying; its sentinel will say how
            w.can_send = False
            return False

    def send(self, w: WorkerHandle, message: tuple[Any, ...]) -> bool:
        return self.send_bytes(w, P.dumps(message))

    def send_bytes(self, w: WorkerHandle, data: bytes) -> bool:
        if not w.can_send:
            return False
        try:
            w.conn.send_bytes(data)
            return True
        except OSError:  # BrokenPipe/ConnectionReset: the worker is dying; its sentinel will say how
            w.can_send = False
            return False

    # -------------------------------------------------------------- waiting
    def next_deadline(self) -> float | None:
        timeout = self.policy.subject_timeout_sec
        times: list[float] = []
        if self.grace_until is not None:
            times.append(self.grace_until)
        if self.queue and self.spawn_after and not self.stopping:
            times.append(self.spawn_after)  # try another start then, even with no worker left to wake us
        for w in self.b._live():
            if w.kill_at is not None:
                times.append(w.kill_at)
            if w.stop_sent:
                continue
            if w.binding:
                if w.bind_deadline is not None:
                    times.append(w.bind_deadline)
            elif w.outstanding and timeout is not None:
                _, running, started_at = w.progress()
                # Nothing running yet: whatever starts next cannot time out before now + timeout.
                times.append(started_at + timeout if running is not None else time.monotonic() + timeout)
        return min(times) if times else None

    def wait_and_handle(self) -> None:
        deadline = self.next_deadline()
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        events = self.b._sel.select(timeout)
        now = time.monotonic()
        ended: list[WorkerHandle] = []
        for key, _ in events:
            if key.data is None:
                try:
                    os.read(key.fd, 4096)
                except OSError:
                    pass
                continue
            w, is_conn = key.data
            if is_conn:
                if w.conn_open:
                    self.read(w, now)
            else:
                ended.append(w)
        for w in ended:
            if not w.dead and w.proc.exitcode is not None:
                self.on_death(w, now)
        self.on_deadlines(now)

    def read(self, w: WorkerHandle, now: float) -> bool:
        """Handle every reply one read brings; False once the pipe has ended."""
        try:
            frames = w.frames.read(w.fd)
        except OSError:
            frames = None
        if frames is None:
            self.b._close_conn(w)
            return False
        for data in frames:
            try:
                message = P.loads(data)
            except Exception as exc:  # noqa: BLE001 - a result the runner cannot rebuild fails its subject
                if w.outstanding:
                    w.replies += 1
                    self.finish(w, w.outstanding.popleft(), False, kind=FailureKind.UNPICKLABLE,
                                error=f"result could not be unpickled in the runner: {one_line(exc)}")
                    w.head_since = now
                continue
            self.on_message(w, message, now)
        return True

    def drain(self, w: WorkerHandle, now: float) -> None:
        """Read what a dead worker sent before dying, without waiting for more."""
        poller = select.poll()
        poller.register(w.fd, select.POLLIN)
        while w.conn_open and poller.poll(0):
            if not self.read(w, now):
                return

    def on_message(self, w: WorkerHandle, msg: tuple[Any, ...], now: float) -> None:
        tag = msg[0]
        if tag == P.BOUND:
            w.binding, w.bind_deadline = False, None
            w.head_since = now
            self.start_fail_streak = 0
            if w.op is not None:
                self.b._launcher.prove(split_import_path(w.op.path)[0], w.op.search_path)
        elif tag == P.BIND_ERROR:
            w.binding, w.bind_deadline = False, None
            w.head_since = now
            if not self.stopping:
                self.fail_queue(f"cannot bind operator: {msg[1]}", FailureKind.EXCEPTION)
        elif tag == P.SKIPPED:
            if w.outstanding:
                w.replies += 1
                task = w.outstanding.popleft()
                if self.stopping:
                    self.owed -= 1
                else:
                    self.queue.appendleft(task)
        elif tag == P.DONE and w.outstanding:
            _, ok, result, error, kind, tb, duration, usage = msg
            w.replies += 1
            task = w.outstanding.popleft()
            self.finish(w, task, ok, result=result, error=error, kind=kind, traceback=tb, duration=duration,
                        usage=usage)
            w.head_since = now
            if ok:
                w.successes += 1
                w.consecutive_failures = 0
            else:
                w.consecutive_failures += 1
            if self.b._isolated:
                w.leaving = True
            elif w.leaving:
                pass
            elif (not ok and w.consecutive_failures >= self.policy.persistent_worker_max_consecutive_failures) \
                    or (self.recycle and w.successes >= self.recycle):
                w.leaving = True
                self.send(w, (P.RETIRE,))

    def on_death(self, w: WorkerHandle, now: float) -> None:
        if w.conn_open:
            self.drain(w, now)
        exitcode = w.proc.exitcode
        ended, running, started_at = w.progress()
        lost = [w.outstanding.popleft() for _ in range(ended)]  # ran, but the replies died with it
        self.requeue(lost)
        if w.outstanding and self.stop.is_set():
            self.give_back(w)  # a death once a stop is asked for is the stop's doing: not run
        if w.outstanding:
            # The one it was running; when it ran none, the next (so a worker that keeps
            # dying between subjects still uses them up).
            task = w.outstanding.popleft()
            since = started_at if running is not None else w.head_since
            kernel_note = None
            if exitcode == -signal.SIGKILL and not w.stop_sent:
                kernel_note = kernel_oom_note(w.watched, self.policy.worker_memory_limit_mb)
            death = classify_exit(exitcode, oom_note=w.watched.oom_note, kernel_oom_note=kernel_note)
            if w.binding:
                death_msg = f"{death.message} while starting (importing or building the operator)"
            else:
                death_msg = death.message
            self.finish(w, task, False, kind=death.kind, error=death_msg, duration=now - since)
            # its output: from the beacon's mark; a first bind's from the start; otherwise unknown
            first_bind = w.binding and w.replies == 0
            w.log_owed = (task, w.beacon.read().output_from if running is not None else (0 if first_bind else -1),
                          death_msg)
            self.give_back(w)
        self.b._bury(w)

    def on_deadlines(self, now: float) -> None:
        timeout = self.policy.subject_timeout_sec
        spawn_timeout = self.policy.subject_spawn_timeout_sec
        for w in self.b._live():
            if w.kill_at is not None and now >= w.kill_at:
                w.kill()
                continue
            if w.stop_sent:
                continue
            if w.binding and w.bind_deadline is not None and now >= w.bind_deadline:
                self.start_timed_out(w, now, spawn_timeout or 0.0)
            elif not w.binding and w.outstanding and timeout is not None:
                ended, running, started_at = w.progress()
                if running is None or now < started_at + timeout:
                    continue
                self.requeue([w.outstanding.popleft() for _ in range(ended)])  # replies still held: lost with it
                task = w.outstanding.popleft()
                self.finish(w, task, False, kind=FailureKind.TIMEOUT, duration=now - started_at,
                            error=f"subject exceeded its subject_timeout_sec of {timeout:g} s")
                w.log_owed = (task, w.beacon.read().output_from,
                              f"timed out after {now - started_at:.1f} s (subject_timeout_sec {timeout:g}); stopped")
                self.give_back(w)
                w.terminate(now, self.policy.graceful_shutdown_sec)
        if self.grace_until is not None and now >= self.grace_until:
            self.grace_until = None
            for w in self.b._live():
                if (w.outstanding or w.binding) and not w.stop_sent:
                    self.give_back(w)
                    w.terminate(now, KILL_AFTER_STOP_SEC)

    def start_timed_out(self, w: WorkerHandle, now: float, budget: float) -> None:
        error = (f"worker did not start and bind operator {self.op.path!r} within "
                 f"subject_spawn_timeout_sec of {budget:g} s")
        if w.outstanding:
            task = w.outstanding.popleft()
            self.finish(w, task, False, kind=FailureKind.SPAWN_TIMEOUT, error=error, duration=now - w.head_since)
            w.log_owed = (task, 0 if w.replies == 0 else -1, error)
        self.give_back(w)
        w.terminate(now, self.policy.graceful_shutdown_sec)
        self.start_fail_streak += 1
        # Every slot failed to start in a row: the operator's import hangs; do not pay
        # one start timeout per remaining subject.
        if self.start_fail_streak >= max(2, self.b._effective) and not self.stopping:
            self.fail_queue(error + f" ({self.start_fail_streak} workers in a row)", FailureKind.SPAWN_TIMEOUT)

"""What runs inside a Dask worker: a micro-batch of subjects, one at a time, under a watchdog.

A Dask task costs milliseconds of scheduler work, so subjects travel in small
batches; each subject still gets its own outcome, timeout and log. The Dask
task thread is the watchdog: it hands one subject at a time to a long-lived
*subject thread* (which binds the operator once per worker and stage) and
waits for it with the subject's deadline. A subject past its deadline cannot
be stopped inside the process, so the batch returns what it has, the worker
pauses (the scheduler sends it nothing more) and asks the client to restart
it through its nanny.

Markers (events on a per-call topic) tell the client which subject is
running when a worker dies: a subject is announced only once it has run for
``mark_after_sec`` (or at once in *suspect* batches), so fast subjects cost
no messages. A long subject's finished outcome rides along with its "done"
marker, so it survives a worker dying later in the same batch.

Every marker is *confirmed*: sent as a request to the scheduler and awaited,
not dropped into the worker's buffered stream. Once the scheduler has
handled it, it is queued for the client ahead of any news of this worker's
death, so the client's picture is exact: a batch announced as started ran
its first subject, a subject announced running and not done was running,
and a subject never announced never started. A buffered marker can still be
sitting in the worker when a subject kills it (a loaded machine delays the
flush), and the client would then blame the wrong subject.
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from habitrun.engine.contract import FailureKind, OperatorRef, SubjectOutcome, SubjectTask
from habitrun.engine.dask_backend.crashfile import CrashFile
from habitrun.engine.invoke import BoundOperator, bind_operator, execute, one_line
from habitrun.engine.wire import OutcomeWire, outcome_wire

# Tokens of run_tasks calls the client has asked to stop (set through Client.run).
_STOPPED: set[str] = set()
_BATCH_LOCK = threading.Lock()  # one batch at a time even on a worker with nthreads > 1
_RUNNER: _SubjectThread | None = None
_RUNNER_LOCK = threading.Lock()

# One subject's outcome as a batch sends it: (its index in the batch, engine/wire.py's outcome tuple,
# the result in it pickled here).
WireOutcome = tuple[int, OutcomeWire]


@dataclass(frozen=True)
class BatchContext:
    """Per-batch settings sent with the batch (small, picklable)."""

    token: str
    topic: str
    batch_id: int
    timeout_sec: float | None
    recycle_after: int  # restart the worker after this many subjects (0: never)
    max_consecutive_failures: int
    suspect: bool = False  # announce each subject at once (a worker died during this batch before)
    mark_after_sec: float = 0.1


class _SubjectThread:
    """The one thread per worker process that runs operators; owns the bound operator."""

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue[tuple[OperatorRef, SubjectTask]] = queue.SimpleQueue()
        self.outbox: queue.SimpleQueue[SubjectOutcome] = queue.SimpleQueue()
        self._bound: tuple[OperatorRef, BoundOperator] | None = None
        self.subjects_run = 0
        self.consecutive_failures = 0
        self.retiring: str | None = None  # why this worker waits for its restart
        self.bind_error: str | None = None  # why the last bind failed, in one line (see OperatorBindError)
        self.crash_file = CrashFile()  # a subject that kills the process leaves its stack there
        thread = threading.Thread(target=self._loop, name="habitrun-subject", daemon=True)
        thread.start()

    def submit(self, op: OperatorRef, task: SubjectTask) -> None:
        self._inbox.put((op, task))

    def _loop(self) -> None:
        while True:
            op, task = self._inbox.get()
            self.outbox.put(self._run(op, task))

    def _run(self, op: OperatorRef, task: SubjectTask) -> SubjectOutcome:
        self.crash_file.arm(task.log_path)
        if self._bound is None or self._bound[0] != op:
            self._bound = None
            try:
                self._bound = (op, bind_operator(op))
                self.bind_error = None
            except BaseException as exc:  # noqa: BLE001 - a bad operator fails its stage, not the worker
                self.bind_error = one_line(exc)
                return SubjectOutcome(task=task, ok=False, error=f"cannot load operator {op.path!r}: {one_line(exc)}",
                                      kind=FailureKind.EXCEPTION, worker_pid=os.getpid())
        return execute(self._bound[1], task, capture="fd")


def _runner() -> _SubjectThread:
    global _RUNNER
    with _RUNNER_LOCK:
        if _RUNNER is None:
            _RUNNER = _SubjectThread()
        return _RUNNER


def _wire(index: int, outcome: SubjectOutcome) -> WireOutcome:
    """Pickle the result here, so an unpicklable one fails its subject instead of the batch."""
    if outcome.ok:
        try:
            payload = pickle.dumps(outcome.result, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - any pickling failure means the same to the user
            error = f"result of type {type(outcome.result).__name__} cannot be pickled: {one_line(exc)}"
            outcome = replace(outcome, ok=False, result=None, error=error, kind=FailureKind.UNPICKLABLE)
        else:
            outcome = replace(outcome, result=payload)
    else:
        outcome = replace(outcome, result=None)
    return (index, outcome_wire(outcome))


def _pause_worker(worker: Any) -> None:
    """Stop the scheduler from sending this worker more work until it is restarted."""
    from distributed.core import Status

    def pause() -> None:
        if worker.status == Status.running:
            worker.status = Status.paused

    worker.loop.add_callback(pause)


def _mark(worker: Any, ctx: BatchContext, msg: dict[str, Any], confirm_sec: float = 120.0) -> None:
    """Send one marker to the client through the scheduler and wait until the scheduler has it.

    The scheduler forwards it to the client on the same ordered stream as the
    news of a task's end or of a worker's death, so whatever happens to this
    worker next, the client learns it after this marker. Only if the
    scheduler cannot be reached for ``confirm_sec`` does the marker go the
    buffered way (the worker is then being lost anyway).
    """
    from distributed.utils import sync

    msg = {"b": ctx.batch_id, "w": worker.address, **msg}
    try:
        sync(worker.loop, worker.scheduler.log_event, topic=ctx.topic, msg=msg, callback_timeout=confirm_sec)
    except Exception:  # noqa: BLE001 - best effort beats losing the marker
        worker.log_event(ctx.topic, msg)


def _cancelled(worker: Any) -> bool:
    try:
        ts = worker.state.tasks.get(worker.get_current_task())
    except Exception:  # noqa: BLE001 - not inside a task (direct call in tests)
        return False
    return ts is not None and ts.state == "cancelled"


def run_batch(op: OperatorRef, tasks: Sequence[SubjectTask], ctx: BatchContext) -> None:
    """Run ``tasks`` in order on this worker; send every outcome and what was not run as an "E" event.

    Event ``r``: pickled ``{"worker", "done": [WireOutcome], "not_run": [index], "restart": reason | None,
    "bind_error": why the operator could not be bound | None}`` (then the stage stops: OperatorBindError).
    """
    from distributed import get_worker

    worker = get_worker()
    address = worker.address
    with _BATCH_LOCK:
        runner = _runner()
        done: list[WireOutcome] = []
        restart: str | None = None
        bind_error: str | None = None
        if runner.retiring is None and ctx.token not in _STOPPED:
            # the client knows this batch started (and under which nanny) before its first subject does
            _mark(worker, ctx, {"m": "B", "n": worker.nanny, "p": os.getpid()})
        unsent: list[WireOutcome] = []  # fast outcomes not yet sent: they ride along with the next "R"
        for i, task in enumerate(tasks):
            if runner.retiring is not None or ctx.token in _STOPPED or _cancelled(worker):
                break
            outcome, marked = _watch_one(runner, worker, op, task, i, ctx, unsent)
            if runner.bind_error is not None:  # the stage's error, not this subject's: ends the batch unrun
                bind_error = runner.bind_error
                break
            wire = _wire(i, outcome)
            done.append(wire)
            if marked:  # before the next subject starts: the client must not think this one still runs
                _mark(worker, ctx, {"m": "D", "i": i, "o": pickle.dumps(wire, protocol=pickle.HIGHEST_PROTOCOL)})
            else:
                unsent.append(wire)
            restart = _restart_reason(runner, outcome, ctx)
            if restart is not None:
                runner.retiring = restart
                _pause_worker(worker)
                break
        result = {"worker": address, "done": done, "not_run": list(range(len(done), len(tasks))),
                  "restart": restart, "bind_error": bind_error}
        # The result is confirmed by the scheduler before the task ends, so it reaches the client
        # before the task's "finished" (or its worker's death): nothing is left on this worker for a
        # later death to lose (or Dask to recompute).
        _mark(worker, ctx, {"m": "E", "r": pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)})
        return None


def _announce(worker: Any, ctx: BatchContext, index: int, unsent: list[WireOutcome]) -> None:
    """Subject ``index`` is running; the batch's finished, unsent outcomes go with it, so a
    worker lost during a long subject (killed, its job cancelled) loses none of them."""
    msg: dict[str, Any] = {"m": "R", "i": index}
    if unsent:
        msg["o"] = pickle.dumps(list(unsent), protocol=pickle.HIGHEST_PROTOCOL)
        unsent.clear()
    _mark(worker, ctx, msg)


def _watch_one(runner: _SubjectThread, worker: Any, op: OperatorRef, task: SubjectTask, index: int,
               ctx: BatchContext, unsent: list[WireOutcome]) -> tuple[SubjectOutcome, bool]:
    """Run one subject on the subject thread under its deadline; (outcome, was it announced)."""
    marked = ctx.suspect
    if marked:  # announce before starting: a subject that kills its worker at once is still named
        _announce(worker, ctx, index, unsent)
    start = time.monotonic()
    runner.submit(op, task)
    if not marked:
        first_wait = ctx.mark_after_sec if ctx.timeout_sec is None else min(ctx.mark_after_sec, ctx.timeout_sec)
        try:
            return runner.outbox.get(timeout=first_wait), False
        except queue.Empty:
            pass
        _announce(worker, ctx, index, unsent)
        marked = True
    remaining = None if ctx.timeout_sec is None else max(0.0, ctx.timeout_sec - (time.monotonic() - start))
    try:
        return runner.outbox.get(timeout=remaining), marked
    except queue.Empty:
        runner.retiring = "timeout"
        _note_in_log(task.log_path, f"--- habitrun: subject {task.subject_id} exceeded subject_timeout_sec="
                     f"{ctx.timeout_sec:g}; Dask worker {worker.address} (pid {os.getpid()}) is restarted ---\n")
        return SubjectOutcome(task=task, ok=False, error=f"subject exceeded its {ctx.timeout_sec:g} s wall-clock budget "
                              "(subject_timeout_sec); its Dask worker was restarted",
                              kind=FailureKind.TIMEOUT, duration_sec=time.monotonic() - start,
                              worker_pid=os.getpid()), marked


def _note_in_log(path: str, line: str) -> None:
    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write(line)
    except OSError:
        pass


def _restart_reason(runner: _SubjectThread, outcome: SubjectOutcome, ctx: BatchContext) -> str | None:
    if runner.retiring is not None:  # the subject thread is stuck in a timed-out subject
        return runner.retiring
    runner.subjects_run += 1
    if outcome.ok:
        runner.consecutive_failures = 0
    else:
        runner.consecutive_failures += 1
        if runner.consecutive_failures >= ctx.max_consecutive_failures:
            return f"{runner.consecutive_failures} failure(s) in a row"
    if ctx.recycle_after and runner.subjects_run >= ctx.recycle_after:
        return f"recycled after {runner.subjects_run} subject(s)"
    return None


def stop_token(token: str) -> None:
    """Run on every worker (Client.run) when a stage is stopped: batches end before their next subject."""
    _STOPPED.add(token)

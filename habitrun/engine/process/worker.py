"""The worker process: bind a stage's operator, run subjects, report each outcome.

A reader thread owns the pipe from the runner. It keeps the pipe drained
(so a large result being sent never deadlocks against a task being
received), handles RETIRE at once, and notices the runner's death as
end-of-file: the worker then kills its whole process group, so a SIGKILLed
runner leaves nothing behind. PR_SET_PDEATHSIG (Linux) backs that up for a
worker whose parent is the runner itself.

The worker leads its own process group, so the runner can stop a subject
together with every process the subject started (``os.killpg``), and is a
child subreaper, so it can also kill what left that group (see ``reaper``).
A TERMINATE from the runner is acted on by the reader thread, so a subject
that ignores SIGTERM still ends with everything it started.

``faulthandler`` is enabled on fd 2 once per worker: fd 2 is the scratch file
(see ``invoke``), pointed back at it before every subject, so a subject that
segfaults leaves ``Fatal Python error: Segmentation fault`` and its Python
stack after its own output there, and the runner copies both into that
subject's log with the death (``deathlog``). Nothing is paid per subject.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from habitrun.engine.contract import FailureKind, SubjectOutcome
from habitrun.engine.invoke import (
    DEFAULT_LOG_MAX_BYTES,
    BoundOperator,
    bind_operator,
    capture_output_in,
    execute,
    one_line,
    output_mark,
)
from habitrun.engine.process import protocol as P
from habitrun.engine.process import reaper
from habitrun.engine.process.beacon import Beacon
from habitrun.engine.process.inbox import Inbox
from habitrun.engine.process.outbox import Outbox
from habitrun.engine.process.reaper import after_subject, become_subreaper, kill_below, snapshot
from habitrun.engine.process.threads import apply_thread_caps
from habitrun.errors import HabitrunError

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerConfig:
    """How one worker sets itself up; small and picklable."""

    slot: int
    threads: int
    cuda_device: str | None
    parent_pid: int = 0  # filled in by the launcher; 0 or less: do not check
    max_tasks: int = 0  # 0: serve until told to exit; 1: isolated mode
    max_consecutive_failures: int = 0  # after this many failures in a row, start nothing more
    close_fds: tuple[int, ...] = ()  # runner-side fds a forked worker inherited
    reply_hold_sec: float = 0.0  # hold successes this long so several share a write (see outbox)
    scratch_path: str | None = None  # fds 1 and 2 go here (the runner reads it after a death)
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES  # a subject's log keeps head and tail past this


def _kill_own_group(*_: Any) -> None:
    kill_below(only_strays=False)  # what left the group too: a subreaper's orphans are ours
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux for SIGTERM when the parent goes; exit now if it already went."""
    try:
        reaper.LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # type: ignore[union-attr]
    except (OSError, AttributeError):
        return
    if parent_pid > 0 and os.getppid() != parent_pid:
        _kill_own_group()


def _prepare(config: WorkerConfig) -> None:
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    become_subreaper()
    # SIGTERM (from us, or from PDEATHSIG) ends the worker with all it started.
    signal.signal(signal.SIGTERM, _kill_own_group)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _die_with_parent(config.parent_pid)
    for fd in config.close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    apply_thread_caps(config.threads)
    if config.cuda_device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = config.cuda_device


def _outcome_message(outcome: SubjectOutcome) -> bytes:
    try:
        return P.dumps(P.done_message(outcome))
    except BaseException as exc:  # noqa: BLE001 - whatever pickling raises is the subject's error
        return P.dumps(P.failure_message(f"result is not picklable: {one_line(exc)}", FailureKind.UNPICKLABLE,
                                         traceback.format_exc(), outcome.duration_sec, outcome.usage))


def _failure(error: str, kind: str) -> bytes:
    return P.dumps(P.failure_message(error, kind))


_SKIPPED = P.dumps((P.SKIPPED,))
HOLD_WHILE_QUEUED = 2  # hold a success only while at least this many runs wait behind it
# ... and only a short one: a held reply dies with a SIGKILLed runner and its subject runs again.
# A write costs about 0.1 ms, under 2% of a subject this long: holding saves nothing there.
HOLD_MAX_SUBJECT_SEC = 0.005
NOT_BOUND = "no operator was bound"


def _bind(op: Any, outbox: Outbox) -> tuple[BoundOperator | None, str]:
    """Bind a stage's operator and answer BOUND, or BIND_ERROR; returns it and why it failed, if it did."""
    try:
        bound = bind_operator(op)
    except BaseException as exc:  # noqa: BLE001 - a bad operator fails its subjects, not us
        error = str(exc) if isinstance(exc, HabitrunError) else one_line(exc)
        outbox.send(P.dumps(P.bind_error_message(error, traceback.format_exc())))
        return None, error
    outbox.send(P.dumps((P.BOUND,)))
    return bound, NOT_BOUND


def _refusal(message: tuple[Any, ...], inbox: Inbox, bound: BoundOperator | None, bind_error: str) -> bytes | None:
    """The reply to a run answered without running it, or None when it is to run."""
    if message[0] == P.UNDECODABLE:
        return _failure(f"task could not be unpickled in the worker: {message[1]}", FailureKind.UNPICKLABLE)
    if inbox.retired:
        return _SKIPPED
    if bound is None:
        return _failure(f"cannot bind operator: {bind_error}", FailureKind.EXCEPTION)
    return None


def _run(bound: BoundOperator, message: tuple[Any, ...], config: WorkerConfig, beacon: Beacon,
         taken: int) -> SubjectOutcome:
    """Run one subject, the beacon saying so while it runs; what it started outside our group ends with it."""
    beacon.took(taken, running=True, output_from=output_mark())
    children = snapshot()
    outcome = execute(bound, P.task_from(message), capture="fd", log_max_bytes=config.log_max_bytes)
    beacon.ended()
    after_subject(children)
    return outcome


def _leave(conn: Connection, inbox: Inbox, outbox: Outbox) -> NoReturn:
    inbox.leaving = True
    outbox.flush()
    kill_below(only_strays=False)
    # Skip interpreter teardown: it can hang on an operator's threads, and nothing is left to flush.
    sys.stdout.flush()
    sys.stderr.flush()
    conn.close()
    os._exit(0)


def served_worker(fds: list[int], config: WorkerConfig) -> None:
    """Entry of a worker forked by the fork server or spawned: ``fds`` = its pipe to the runner, its beacon."""
    worker_main(Connection(fds[0]), config, Beacon.attach(fds[1]))


def worker_main(conn: Connection, config: WorkerConfig, beacon: Beacon) -> None:
    """Entry point of every worker process (persistent or isolated)."""
    _prepare(config)
    capture_output_in(config.scratch_path)
    # By number: whatever fd 2 is when the crash comes, which is the scratch file the subject's log is read from.
    faulthandler.enable(file=2, all_threads=False)  # the crashing thread: the subject's, not our reader's
    outbox = Outbox(conn.fileno(), 0.0 if config.max_tasks else config.reply_hold_sec)
    inbox = Inbox(conn, outbox, _kill_own_group)
    bound: BoundOperator | None = None
    bind_error = NOT_BOUND
    served = 0
    taken = 0  # runs taken from the queue: each gets exactly one reply, in order
    failures_in_row = 0
    while True:
        if inbox.empty():
            outbox.flush()  # never sit on replies while waiting for work
        message = inbox.get()
        tag = message[0]
        if tag == P.EXIT:
            break
        if tag == P.BIND:
            bound, bind_error = _bind(message[1], outbox)
            continue
        if outbox.broken or inbox.runner_gone:
            # The runner is gone (its pipe refused our last reply): a subject started now would only be
            # killed with us, and run again by the next run.
            _kill_own_group()
        taken += 1
        reply = _refusal(message, inbox, bound, bind_error)
        if reply is not None:  # answered without running
            beacon.took(taken, running=False)
            outbox.send(reply)
            continue
        outcome = _run(bound, message, config, beacon, taken)  # type: ignore[arg-type]  # bound: see _refusal
        failures_in_row = 0 if outcome.ok else failures_in_row + 1
        if config.max_consecutive_failures and failures_in_row >= config.max_consecutive_failures:
            # The runner retires this worker; the runs queued behind this one must not start here.
            inbox.retired = True
        outbox.send(_outcome_message(outcome),
                    hold=outcome.ok and outcome.duration_sec < HOLD_MAX_SUBJECT_SEC
                    and inbox.qsize() >= HOLD_WHILE_QUEUED)
        served += 1
        if config.max_tasks and served >= config.max_tasks:
            break
    _leave(conn, inbox, outbox)

"""The serial backend: subjects run one after another in the runner's own process.

For debugging an operator (a debugger and prints just work) and for tiny
studies. It has no process boundary, so the policy forbids combining it with
timeouts, isolation, memory limits or several workers (see RunPolicy).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

from habitrun.engine.contract import Backend, OperatorRef, ReportFn, RunningSubject, SubjectTask
from habitrun.engine.control import StopFlag
from habitrun.engine.invoke import BoundOperator, bind_operator, execute, one_line
from habitrun.errors import HabitrunError, OperatorBindError
from habitrun.spec.policy import RunPolicy

log = logging.getLogger(__name__)


class SerialBackend(Backend):
    """Runs tasks in-process, in order, reporting each outcome as it completes."""

    name = "serial"

    def __init__(self, policy: RunPolicy) -> None:
        self.policy = policy
        self._bound: tuple[OperatorRef, BoundOperator] | None = None
        self._now: RunningSubject | None = None  # the subject running (read by the running file's thread)

    @classmethod
    def from_policy(cls, policy: RunPolicy) -> SerialBackend:
        return cls(policy)

    @property
    def effective_workers(self) -> int:
        return 1

    def run_tasks(self, op: OperatorRef, tasks: Sequence[SubjectTask], report: ReportFn, stop: StopFlag) -> None:
        if self._bound is None or self._bound[0] != op:
            try:
                self._bound = (op, bind_operator(op))
            except HabitrunError:
                raise
            except Exception as exc:  # noqa: BLE001 - the stage's error, not its subjects' (see OperatorBindError)
                raise OperatorBindError.for_stage(op.stage, op.path, one_line(exc)) from exc
        bound = self._bound[1]
        debug = log.isEnabledFor(logging.DEBUG)  # checked once a stage: the subject loop pays nothing without it
        for task in tasks:
            if stop.is_set():
                return
            if debug:
                log.debug("stage %s: dispatch %s#%d in the runner's process", op.stage, task.subject_id, task.attempt)
            self._now = RunningSubject(task, os.getpid(), time.time())
            try:
                outcome = execute(bound, task, capture="python", log_max_bytes=int(self.policy.log_max_mb * (1 << 20)))
            finally:
                self._now = None
            report([outcome])

    def running_subjects(self) -> list[RunningSubject]:
        now = self._now
        return [now] if now is not None else []

    def close(self, graceful: bool = True) -> None:
        self._bound = None

"""ProcessBackend: subjects run in worker processes on this machine, persistent or one per subject.

The parts, one concern each: ``pool`` (the workers, their slots and the
selector watching them), ``handle`` and ``phases`` (one worker and its
lifecycle), ``modes`` (what differs between persistent and isolated
workers), ``stage`` (the event loop of one ``run_tasks`` call), ``book``
(a stage's queue, outcomes and pace), ``endings`` (deaths and deadlines).

Workers live as long as the backend, so consecutive stages reuse them.
Replies come back in order, one per subject; a worker holds successes up to
``REPLY_HOLD_SEC`` while more runs wait behind them, so several share one
write and one wake-up of the runner (see ``outbox``). What a worker runs
right now, and since when, its beacon says (shared memory, see ``beacon``):
a subject's timeout counts from its own start, a death is charged to the
subject that was running, the ones it finished but had not reported yet are
run again, and the queued ones are simply sent again.

Shutdown on a stop request: stop dispatching at once; when not ``hard``,
running subjects get ``graceful_shutdown_sec`` to finish (and are reported),
then the rest get SIGTERM and, one second later, SIGKILL (the grace was
already given). A ``hard`` stop SIGKILLs the running subjects at once. Once a
stop is requested, no worker's death and no failed start is charged to a
subject: those subjects are simply not run (a resume runs them).

A worker that cannot be started is never a subject's failure: with other
workers alive the stage goes on with fewer; with none, the stage ends with a
run-level :class:`~habitrun.errors.WorkerStartError` naming the cause.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from typing import Any

from habitrun.engine.contract import Backend, OperatorRef, ReportFn, RunningSubject, SubjectTask
from habitrun.engine.control import StopFlag
from habitrun.engine.process.budget import resolve_budget
from habitrun.engine.process.gpu import no_gpu_reason
from habitrun.engine.process.memstats import StageMemory
from habitrun.engine.process.modes import mode_for
from habitrun.engine.process.pool import WorkerPool
from habitrun.engine.process.stage import StageRun
from habitrun.spec.policy import RunPolicy


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
        self.pool = WorkerPool(policy, mode_for(policy))
        self._closed = False
        self.memory_budget_mb, self.budget_source = resolve_budget(policy.memory_budget_mb)
        self.memory: dict[str, StageMemory] = {}  # stage -> what admission did (see admission)
        _ignore_sigpipe()

    @classmethod
    def from_policy(cls, policy: RunPolicy) -> ProcessBackend:
        return cls(policy)

    @property
    def effective_workers(self) -> int:
        return self.pool.effective

    def notes(self) -> list[str]:
        if self.policy.cap_workers_to_gpu_pool and not self.pool.devices:
            return [f"cap_workers_to_gpu_pool is true but no GPU was detected ({no_gpu_reason()}): "
                    f"{self.pool.effective} worker(s) run uncapped, none pinned to a GPU"]
        return []

    @property
    def started_pids(self) -> list[int]:
        """Every worker pid ever started (tests, provenance)."""
        return self.pool.started_pids

    def warm(self) -> None:
        if not self._closed:
            self.pool.spawner.warm()

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "workers": self.pool.effective,
            "requested_workers": self.policy.workers,
            "parallel_mode": self.policy.parallel_mode,
            "start_method": self.policy.start_method,
            "worker_threads": self.policy.worker_threads,
            "gpus": list(self.pool.devices),
            "worker_memory_limit_mb": self.policy.worker_memory_limit_mb,
            "oom_events": self.pool.oom_events,
            "workers_started": len(self.pool.started_pids),
            **({"memory": self.memory_facts()} if self.memory_budget_mb is not None else {}),
        }

    def memory_facts(self) -> dict[str, Any]:
        """The budget, how it was found, and per stage what admission did (status and the report show it)."""
        return {"budget_mb": round(self.memory_budget_mb or 0.0, 1), "source": self.budget_source,
                "stages": {name: stats.summary() for name, stats in self.memory.items()}}

    def run_tasks(self, op: OperatorRef, tasks: Sequence[SubjectTask], report: ReportFn, stop: StopFlag) -> None:
        if self._closed:
            raise RuntimeError("ProcessBackend is closed")
        if not tasks:
            return
        admission = None
        if self.memory_budget_mb is not None and self.forecast is not None:
            stats = self.memory.setdefault(op.stage, StageMemory())
            admission = (self.memory_budget_mb, self.forecast, stats)
        StageRun(self.pool, op, tasks, report, stop, self.scratch_dir, admission).run()

    def running(self) -> int:
        """Workers with a subject in hand (pipelined ones wait behind it and are not counted)."""
        return self.pool.running()

    def running_subjects(self) -> list[RunningSubject]:
        return self.pool.running_subjects()

    def close(self, graceful: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self.pool.close(graceful)
        if self.scratch_dir:
            try:
                os.rmdir(self.scratch_dir)  # only when empty: a SIGKILLed run's leftovers stay to be seen
            except OSError:
                pass

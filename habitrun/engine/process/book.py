"""One stage's subjects on the process backend: the queue, the outcomes not yet reported, the pace.

What a stage still owes is never counted by hand: it is the queue plus every
live worker's runs sent and not yet answered (:meth:`StageBook.owed`). A
run that will not be answered (its worker died or was stopped) goes back to
the queue, or, once a stop is asked for, is simply dropped: a resume runs it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from habitrun.engine.contract import FailureKind, SubjectOutcome, SubjectTask
from habitrun.engine.process.handle import WorkerHandle
from habitrun.engine.process.pool import WorkerPool

TARGET_QUEUED_SEC = 0.15  # work queued ahead per worker when subjects are short (take-back keeps it off the tail)
MAX_DEPTH = 64  # runs a worker holds at most (running + queued)
PER_SUBJECT_COST_SEC = 50e-6  # a worker's own cost per subject, on top of the operator's


class StageBook:
    """The stage's queue and gathered outcomes, and how deep runs are queued in a worker."""

    def __init__(self, tasks: Sequence[SubjectTask], pool: WorkerPool) -> None:
        self.queue: deque[SubjectTask] = deque(tasks)
        self.pool = pool
        self.learns = pool.mode.learns
        self.batch: list[SubjectOutcome] = []
        self.stopping = False  # a stop was asked for: runs given back are dropped, not queued again
        self.depth = 1  # one to a worker until subjects are known to be short (learn)
        self.mean_sec: float | None = None  # running mean of this stage's subject durations
        self.unlearned = [0.0, 0]  # (sum, count) of durations not yet in mean_sec
        self.admission: Any = None  # a memory budget's Admission: learns from outcomes, retries OOM kills alone

    def owed(self) -> int:
        """Subjects not yet reported nor dropped: queued, or sent to a live worker and unanswered."""
        return len(self.queue) + sum(len(w.outstanding) for w in self.pool.live())

    # ------------------------------------------------------------ outcomes
    def record(self, worker: WorkerHandle | None, outcome: SubjectOutcome) -> None:
        """An outcome to report with the next batch (``worker``: where it ran, if anywhere)."""
        admission = self.admission
        if admission is not None and admission.after(worker, outcome):
            self.requeue([outcome.task])  # killed for memory beside others: run again, alone, not charged
            return
        self.batch.append(outcome)
        if not outcome.ok and outcome.kind == FailureKind.OOM:
            self.pool.note_oom(backoff=admission is None)
        if worker is not None and self.learns:
            unlearned = self.unlearned
            unlearned[0] += outcome.duration_sec
            unlearned[1] += 1

    def fail(self, worker: WorkerHandle | None, task: SubjectTask, kind: str, error: str,
             duration: float = 0.0) -> None:
        """``task`` failed without a reply of its own (death, timeout, a pickling error...)."""
        self.record(worker, SubjectOutcome(task=task, ok=False, error=error, kind=kind, duration_sec=duration,
                                           worker_pid=worker.pid if worker else None))

    def fail_queue(self, error: str, kind: str) -> None:
        while self.queue:
            self.fail(None, self.queue.popleft(), kind, error)

    def take_batch(self) -> list[SubjectOutcome]:
        batch, self.batch = self.batch, []
        return batch

    # ------------------------------------------------------------ runs back
    def give_back(self, worker: WorkerHandle) -> None:
        """Runs sent to a worker that will not run them: send them again, or drop them when stopping."""
        rest = list(worker.outstanding)
        worker.outstanding.clear()
        self.requeue(rest)

    def take_back(self, w: WorkerHandle, count: int) -> None:
        """``w`` gave back its last ``count`` runs unstarted (RECALLED): queue them again, first."""
        count = min(count, len(w.outstanding))
        self.requeue([w.outstanding.pop() for _ in range(count)][::-1])

    def requeue(self, tasks: Iterable[SubjectTask]) -> None:
        """Run these again (first), or drop them when stopping (a resume runs them)."""
        if not self.stopping:
            self.queue.extendleft(reversed(list(tasks)))

    def drop_queue(self) -> None:
        """A stop: what was not sent yet is not run."""
        self.stopping = True
        self.queue.clear()

    # ---------------------------------------------------------------- pace
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

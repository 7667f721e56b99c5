"""The contract between the engine and the backends that run map work.

The engine owns the checkpoint store, retries across rounds, fail-fast and
events; a backend only turns tasks into outcomes, reporting each as soon as
it is known. Every backend (serial, process, dask) implements
:class:`Backend` and is exercised by the same behaviour tests.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from habitrun.engine.control import StopFlag
from habitrun.engine.usage import Usage
from habitrun.spec.failures import FailureKind

__all__ = ["Backend", "FailureKind", "OperatorRef", "ReportFn", "RunningSubject", "SubjectOutcome", "SubjectTask"]


@dataclass(frozen=True)
class OperatorRef:
    """What a worker needs to bind a stage's operator: picklable and small."""

    stage: str
    path: str
    params: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "map"  # "map" or "collect"
    search_path: tuple[str, ...] = ()  # folders put first on sys.path (the recipe's folder)


# slots: built and read once per subject on the dispatch path; keyword-only: a misplaced
# argument cannot type-check (the wire carries plain tuples, see process/protocol.py)
@dataclass(slots=True, kw_only=True)
class SubjectTask:
    """One subject's work in one stage (for a collect stage: the one task of the stage)."""

    key: str
    subject_id: str
    fields: dict[str, Any]
    inputs: dict[str, Any]
    workdir: str
    log_path: str
    attempt: int = 1


@dataclass(slots=True, kw_only=True)
class SubjectOutcome:
    """A task's result or failure, as reported by a backend."""

    task: SubjectTask
    ok: bool
    result: Any = None
    error: str | None = None  # one line, e.g. "ValueError: spacing must be positive"
    kind: str | None = None  # a FailureKind value when not ok
    traceback: str | None = None
    duration_sec: float = 0.0
    worker_pid: int | None = None
    usage: Usage | None = None  # measured where the subject ran; None if it died


ReportFn = Callable[[list[SubjectOutcome]], None]


class RunningSubject(NamedTuple):
    """A subject running now, as a backend sees it (the running file, `status` of a live run)."""

    task: SubjectTask
    pid: int  # the process running it
    started_at: float  # Unix seconds
    output: str | None = None  # the file its output goes to until it ends (then its log)


class Backend(abc.ABC):
    """Runs map (and collect) tasks; lives for a whole run so workers are reused across stages."""

    name: str = "abstract"
    scratch_dir: str | None = None  # where workers keep scratch files (the run folder); None: the temp dir
    forecast: Any = None  # the stage's peak-memory model (planner.memory_model), for a memory budget
    wants_durations: bool = False  # set typical_sec before each stage (the slurm backend sizes its chunks by it)
    typical_sec: float | None = None  # the stage's learned duration per subject (None: no history)
    left_running: list[str] = []  # a detached run's batch jobs left running for the stage (read after run_tasks)
    left_subjects: int = 0  # ... and how many of the stage's subjects they hold

    @abc.abstractmethod
    def run_tasks(
        self,
        op: OperatorRef,
        tasks: Sequence[SubjectTask],
        report: ReportFn,
        stop: StopFlag,
    ) -> None:
        """Run every task once and ``report`` outcomes in batches as they complete.

        Returns when every task has been reported, or promptly once ``stop``
        is set (tasks not reported by then are simply not reported). A
        backend never retries a failed task itself: the engine decides.
        Failures of a subject are outcomes, never exceptions; an exception
        from here means the backend itself is broken.
        """

    @property
    @abc.abstractmethod
    def effective_workers(self) -> int:
        """Slots in use now (after GPU capping or out-of-memory backoff)."""

    def running(self) -> int | None:
        """Subjects running right now, if the backend can tell (None: it cannot); read from another thread."""
        return None

    def running_subjects(self) -> list[RunningSubject]:
        """The subjects running right now, if the backend can tell (default: it cannot); read from
        another thread."""
        return []

    def warm(self) -> None:
        """Start booting what the first worker needs (a fork server), without waiting for it.

        Called once the run knows it has work, so the boot overlaps with the
        operator check and the run folder's creation. Best effort: a failure
        here surfaces when a worker is really started. Default: nothing.
        """
        return None

    def notes(self) -> list[str]:
        """What the user should hear about how this backend runs their policy (said once, as a warning).

        Default: nothing. The process backend says when ``cap_workers_to_gpu_pool`` found no GPU.
        """
        return []

    def describe(self) -> dict[str, Any]:
        """Facts for the run's provenance (backend name, workers, cluster...)."""
        return {"backend": self.name, "workers": self.effective_workers}

    @abc.abstractmethod
    def close(self, graceful: bool = True) -> None:
        """Stop every worker and whatever it started; idempotent."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""What a run says as it goes: one dataclass per event kind, turned into a JSON object in one place.

The runner, the recorder and the stop notices build these; the display
(cli/progress.py) and the recorder dispatch on their type. ``event_dict`` is
the only place an event becomes the object written to the run's
``events.jsonl`` (``{"event": <kind>, <field>: <value>, ...}``, the keys that
``status``, ``trace`` and ``report`` read back); ``parse_event`` reads one back.

A field left ``UNSET`` is not written at all: a train stage's ``subject_done``
has no measurements, the first ``stopping`` notice no ``now``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, fields
from operator import attrgetter
from typing import Any, ClassVar, TypeVar


class _Unset:
    """The value of a field an event does not carry (falsy, never written)."""

    _instance: ClassVar[_Unset | None] = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
EVENT_TYPES: dict[str, type[Event]] = {}  # kind -> class
_LAYOUT: dict[type, tuple[Callable[[Any], tuple], tuple[str, ...], bool]] = {}  # class -> see _layout
E = TypeVar("E", bound="Event")


def _layout(event_fields: tuple[Field, ...]) -> tuple[Callable[[Any], tuple], tuple[str, ...], bool]:
    """What ``event_dict`` needs of one class, worked out once: a getter of its kind and every field's
    value in one C call, the keys they are written under (``event`` first), and whether any field can
    be ``UNSET`` (a subject's event is turned into a dict per subject, on the dispatch thread)."""
    names = tuple(f.name for f in event_fields)
    return attrgetter("EVENT", *names), ("event", *names), any(f.default is UNSET for f in event_fields)


def _event(kind: str) -> Callable[[type[E]], type[E]]:
    """Register an event dataclass (kw-only and slotted, declared as such) under ``kind``."""

    def register(cls: type[E]) -> type[E]:
        if "__dataclass_fields__" not in vars(cls):
            raise TypeError(f"event {cls.__name__} must be declared @dataclass(slots=True, kw_only=True)")
        cls.EVENT = kind
        EVENT_TYPES[kind] = cls
        _LAYOUT[cls] = _layout(fields(cls))  # type: ignore[arg-type]  # a dataclass since the line above
        return cls

    return register


class Event:
    """Base of every event; ``EVENT`` is the value of the ``event`` key it is written under."""

    __slots__ = ()
    EVENT: ClassVar[str] = ""


@_event("warning")
@dataclass(slots=True, kw_only=True)
class RunWarning(Event):
    message: str


@_event("run_started")
@dataclass(slots=True, kw_only=True)
class RunStarted(Event):
    run_id: str
    recipe: str
    subjects: int
    stages: list[str]
    user: str
    resumed_from: str | None = None


@_event("run_finished")
@dataclass(slots=True, kw_only=True)
class RunFinished(Event):
    outcome: str
    exit_code: int
    stages: dict[str, dict[str, int]]
    failed_subjects: int
    stop_reason: str | None
    duration_sec: float
    backends: list[dict[str, Any]]


@_event("stage_started")
@dataclass(slots=True, kw_only=True)
class StageStarted(Event):
    stage: str
    kind: str  # the stage's: map, collect or train
    total: int
    cached: int
    to_run: int
    blocked: int = 0
    recorded_failures: int = 0


@_event("stage_detached")
@dataclass(slots=True, kw_only=True)
class StageDetached(Event):
    """A detached run (``--detach``) left the stage's subjects to the batch jobs it submitted."""

    stage: str
    subjects: int  # left running or queued in those jobs
    jobs: list[str]  # the batch system's job (array) ids


@_event("stage_finished")
@dataclass(slots=True, kw_only=True)
class StageFinished(Event):
    stage: str
    total: int
    done: int
    cached: int
    failed: int
    skipped: int
    not_run: int = 0


@_event("stage_published")
@dataclass(slots=True, kw_only=True)
class StagePublished(Event):
    """A stage's current result files were published into the study (engine/publish.py)."""

    stage: str
    folder: str
    files: int
    written: int
    removed: int


@dataclass(slots=True, kw_only=True)
class _Attempt(Event):
    """One subject's attempt; the measurements are those of its trace row (engine/tracing.py)."""

    stage: str
    subject: str
    attempt: int
    duration_sec: float = UNSET
    pid: int | None = UNSET
    queued_at: float | None = UNSET
    started_at: float | None = UNSET
    ended_at: float | None = UNSET
    cpu_sec: float | None = UNSET
    peak_rss_mb: float | None = UNSET
    read_bytes: int | None = UNSET
    write_bytes: int | None = UNSET
    host: str | None = UNSET
    gpu: str | None = UNSET


@_event("subject_done")
@dataclass(slots=True, kw_only=True)
class SubjectDone(_Attempt):
    pass


@_event("subject_failed")
@dataclass(slots=True, kw_only=True)
class SubjectFailed(_Attempt):
    kind: str | None
    error: str | None
    final: bool
    log: str | None


_ATTEMPT_FIELDS = tuple(f.name for f in fields(_Attempt))


def as_failed(done: SubjectDone, *, kind: str | None, error: str | None, log: str | None,
              final: bool = True) -> SubjectFailed:
    """The ``subject_failed`` of the same attempt, with the same measurements (a success whose
    result could not be stored becomes this)."""
    return SubjectFailed(**{name: getattr(done, name) for name in _ATTEMPT_FIELDS},
                         kind=kind, error=error, final=final, log=log)


@_event("subject_skipped")
@dataclass(slots=True, kw_only=True)
class SubjectSkipped(Event):
    stage: str
    subject: str
    reason: str


RETRY_NAMED = 5  # subjects a retry round names (the console says "and N more")


@_event("retry_round")
@dataclass(slots=True, kw_only=True)
class RetryRound(Event):
    stage: str
    subjects: int
    attempt: int
    subject_ids: list[str] = UNSET  # the first RETRY_NAMED of them (unset in runs before issue 32)
    kinds: dict[str, int] = UNSET  # failure kind -> how many of them failed so


@_event("checkpoint_cleared")
@dataclass(slots=True, kw_only=True)
class CheckpointCleared(Event):
    stage: str
    records: int
    retried: int = 0


@_event("large_result")
@dataclass(slots=True, kw_only=True)
class LargeResult(Event):
    """A stored result over ``limit_mb`` (engine/recorder.py): shown once per stage, for its first such subject."""

    stage: str
    subject: str
    size_mb: float
    limit_mb: float


@_event("train_started")
@dataclass(slots=True, kw_only=True)
class TrainStarted(Event):
    stage: str
    nproc_per_node: int
    nnodes: int = 1


@_event("stopping")
@dataclass(slots=True, kw_only=True)
class Stopping(Event):
    """What a stop signal waits for (engine/stopnotice.py); ``now`` only on the second signal's."""

    now: bool = UNSET
    signal: str | None = None
    stage: str | None = None
    kind: str | None = None  # the stage's kind
    running: int | None = None
    grace_sec: float = 0.0
    backend: str | None = None


@_event("console")
@dataclass(slots=True, kw_only=True)
class ConsoleLine(Event):
    """A line a train stage's rank printed (shown, never written to the events file)."""

    line: str


def event_dict(event: Event) -> dict[str, Any]:
    """The JSON object an event is written as: ``event`` first, then its set fields in order."""
    if event.__class__ is SubjectDone:
        return subject_done_dict(event)
    return fields_dict(event)


def subject_done_dict(e: SubjectDone) -> dict[str, Any]:
    """:func:`fields_dict` of the one event written per subject, written out: a dict display costs
    about 1 µs a subject less on the dispatch thread (``benchmarks/engine_cpu.py``);
    ``tests/engine/test_events.py`` checks the two agree."""
    d = {"event": "subject_done", "stage": e.stage, "subject": e.subject, "attempt": e.attempt,
         "duration_sec": e.duration_sec, "pid": e.pid, "queued_at": e.queued_at, "started_at": e.started_at,
         "ended_at": e.ended_at, "cpu_sec": e.cpu_sec, "peak_rss_mb": e.peak_rss_mb, "read_bytes": e.read_bytes,
         "write_bytes": e.write_bytes, "host": e.host, "gpu": e.gpu}
    if UNSET in d.values():  # a train stage's: no measurements
        return {k: v for k, v in d.items() if v is not UNSET}
    return d


def fields_dict(event: Event) -> dict[str, Any]:
    """``event`` first, then the event's fields in order, those left ``UNSET`` left out."""
    getter, keys, unsettable = _LAYOUT[type(event)]
    values = getter(event)  # as long as keys, by construction
    if unsettable and UNSET in values:  # identity first: _Unset has no __eq__ of its own
        return {k: v for k, v in zip(keys, values) if v is not UNSET}  # noqa: B905
    return dict(zip(keys, values))  # noqa: B905


def parse_event(data: dict[str, Any]) -> Event | None:
    """An event read back from ``event_dict`` form; None for an unknown kind.

    Extra keys (the log's ``ts``) are ignored; a missing field takes its
    default, or None when it has none.
    """
    cls = EVENT_TYPES.get(data.get("event", ""))
    if cls is None:
        return None
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]  # every registered event class is a dataclass
        if f.name in data:
            values[f.name] = data[f.name]
        elif f.default is MISSING:
            values[f.name] = None
    return cls(**values)

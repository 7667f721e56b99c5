"""Why a subject failed: the closed set of failure kinds a record, a trace row and `status` carry.

A kind is a ``str`` as much as a name: ``FailureKind.OOM == "oom"``, it
formats and JSON-encodes as ``oom``, SQLite stores it as that text, and it
pickles as the plain string (no class path in a worker's reply or a run's
journal; a kind read back is a ``str`` and compares equal to its member).
Which kinds the retry rounds retry is grouped in :data:`habitrun.spec.policy.RETRY_GROUP`,
one entry for every kind (``tests/spec/test_failure_kinds.py``).
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class FailureKind(str, Enum):
    """Why a subject failed; stored in its record and shown by `status`."""

    EXCEPTION = "exception"
    TIMEOUT = "timeout"
    SPAWN_TIMEOUT = "spawn_timeout"
    OOM = "oom"
    WORKER_DIED = "worker_died"
    NO_REPORT = "no_report"
    UNPICKLABLE = "unpicklable"
    DISK_FULL = "disk_full"  # the subject met a full disk: the machine's fault, never recorded
    SKIPPED = "skipped"  # upstream failed: not an error of its own
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        """Pickled as its text: a reply or a journal read back holds a plain ``str``, never a class path."""
        return str, (self.value,)

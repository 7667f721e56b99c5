"""Storage layer: checkpoint store, run folders, lock, events, provenance (imports spec, errors).

The names below are imported on first use, not with the package: every
``habitrun.store.<module>`` import runs this file first, and a command that
needs one of them (``plan`` reads the store, ``validate`` checks files) should
not pay for the others (psutil for the lock, git and package metadata for the
provenance).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from habitrun.store.checkpoint import (
        CheckpointStore,
        Record,
        StoredState,
        StoreNotFound,
        UnstorableResult,
    )
    from habitrun.store.events import EventLog
    from habitrun.store.lock import StoreLock, default_lock_path
    from habitrun.store.provenance import collect_provenance
    from habitrun.store.runs import RunFolder, latest_run, list_runs, work_dir

_WHERE = {
    "CheckpointStore": "checkpoint",
    "Record": "checkpoint",
    "StoredState": "checkpoint",
    "StoreNotFound": "checkpoint",
    "UnstorableResult": "checkpoint",
    "EventLog": "events",
    "StoreLock": "lock",
    "default_lock_path": "lock",
    "collect_provenance": "provenance",
    "RunFolder": "runs",
    "latest_run": "runs",
    "list_runs": "runs",
    "work_dir": "runs",
}

__all__ = [
    "CheckpointStore",
    "EventLog",
    "Record",
    "RunFolder",
    "StoreLock",
    "StoreNotFound",
    "StoredState",
    "UnstorableResult",
    "collect_provenance",
    "default_lock_path",
    "latest_run",
    "list_runs",
    "work_dir",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"habitrun.store.{module}"), name)

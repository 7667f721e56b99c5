"""Storage layer: checkpoint store, run folders, lock, events, provenance (imports spec, errors)."""

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

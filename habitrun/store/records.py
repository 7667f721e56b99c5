"""The records table, written once: each column, the Record field it stores, the format that added it.

:data:`COLUMNS` is what must agree on the table's columns: the ``CREATE
TABLE``, the upsert, the columns a migration adds
(:mod:`habitrun.store.migrations`) and the views a read-only command reads an
older format through are built from it. :class:`Record` and
:class:`StoredState` are written out by hand (no type is generated at run
time), and so are :func:`row_of` and :func:`state_of`, which turn them into a
row and back; ``tests/store/test_records.py`` checks that each agrees with
:data:`COLUMNS`. Adding a field to what a subject's outcome stores is a line
here, a field in :class:`Record`, a value in :func:`row_of` (and a migration
step, for the stores that exist).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from habitrun.store.jsontext import compact

RECORDS = "habitrun_record"


@dataclass(frozen=True)
class Column:
    """One column of the records table, and where its value comes from when a record is stored."""

    name: str
    sql: str  # type and constraint (a column added by a migration must allow NULL)
    field: str | None = None  # the Record field it stores; None: a value put() computes
    state: bool = False  # read back, without the result, into a StoredState
    since: int = 1  # the store format that added it


COLUMNS: tuple[Column, ...] = (
    Column("key", "TEXT PRIMARY KEY", "key", state=True),
    Column("stage", "TEXT NOT NULL", "stage", state=True),
    Column("subject_id", "TEXT NOT NULL", "subject_id", state=True),
    Column("ok", "INTEGER NOT NULL", "ok", state=True),  # 1 or 0
    Column("attempts", "INTEGER NOT NULL", "attempts", state=True),
    Column("error", "TEXT", "error", state=True),  # a success stores no error (nor kind)
    Column("kind", "TEXT", "kind", state=True),
    Column("log_path", "TEXT", "log_path", state=True),
    Column("run_id", "TEXT", "run_id", state=True),
    # What went into the key, for `plan --reason`: compact JSON.
    Column("components", "TEXT", "components"),
    Column("duration", "REAL", "duration_sec"),
    Column("written_at", "REAL NOT NULL"),
    # A success's result (Record.result), as diskcache's Disk serialises it, when small enough
    # to sit in the row (else in diskcache's Cache table and a file: mode and value NULL here).
    Column("mode", "INTEGER", since=2),
    Column("value", "BLOB", since=2),
    Column("digest", "BLOB", since=3),  # the result's checksum (store/integrity.py)
    Column("outside", "TEXT", since=3),  # the first path outside the study it names
)

NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)
STATE_COLUMNS = ", ".join(c.name for c in COLUMNS if c.state)

RECORDS_DDL = f"CREATE TABLE IF NOT EXISTS {RECORDS} (" + ", ".join(f"{c.name} {c.sql}" for c in COLUMNS) + ")"

# A success replaces anything; a failure never replaces a stored success for the same key
# (the key says the inputs are identical, so the stored result is still valid).
UPSERT = (
    f"INSERT INTO {RECORDS} ({', '.join(NAMES)}) VALUES ({','.join('?' * len(NAMES))})"
    " ON CONFLICT(key) DO UPDATE SET " + ", ".join(f"{n}=excluded.{n}" for n in NAMES if n != "key")
    + f" WHERE excluded.ok = 1 OR {RECORDS}.ok = 0"
)


# slots: one per subject on the recorder's path; keyword-only: a misplaced argument cannot
# land in the wrong field.
@dataclass(slots=True, kw_only=True)
class Record:
    """What the engine reports for one subject of one stage (stored as a row of :data:`COLUMNS`)."""

    key: str
    stage: str
    subject_id: str
    ok: bool
    attempts: int = 1
    error: str | None = None
    kind: str | None = None
    log_path: str | None = None
    run_id: str | None = None
    components: dict | str = field(default_factory=dict)  # a dict, or the same already as compact JSON
    duration_sec: float = 0.0
    result: Any = None  # stored in no column of its own: into mode, value, digest, outside


@dataclass(frozen=True)
class StoredState:
    """A stored record without its result (fields: the state columns of :data:`COLUMNS`, in order)."""

    key: str
    stage: str
    subject_id: str
    ok: bool
    attempts: int
    error: str | None
    kind: str | None
    log_path: str | None
    run_id: str | None


def row_of(rec: Record, now: float, mode: int | None, value: Any, digest: bytes | None,
           outside: str | None) -> tuple[Any, ...]:
    """The values of :data:`NAMES` for the upsert (runs once per stored record)."""
    ok = rec.ok
    components = rec.components
    return (rec.key, rec.stage, rec.subject_id, 1 if ok else 0, int(rec.attempts), None if ok else rec.error,
            None if ok else rec.kind, rec.log_path, rec.run_id,
            components if components.__class__ is str else compact(components), float(rec.duration_sec), now,
            mode, value, digest, outside)


def state_of(row: tuple[Any, ...]) -> StoredState:
    """The :class:`StoredState` of a row of :data:`STATE_COLUMNS`."""
    key, stage, subject_id, ok, attempts, error, kind, log_path, run_id = row
    return StoredState(key, stage, subject_id, bool(ok), attempts, error, kind, log_path, run_id)


def view_of_format(version: int) -> str:
    """A temporary view giving an older format's records table every column (the new ones NULL)."""
    columns = ", ".join(c.name if c.since <= version else f"NULL AS {c.name}" for c in COLUMNS)
    return f"CREATE TEMP VIEW {RECORDS} AS SELECT {columns} FROM main.{RECORDS}"

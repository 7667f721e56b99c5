"""The records table, written once: each column, the Record field it stores, the format that added it.

:data:`COLUMNS` generates everything that must agree on the table's columns:
the ``CREATE TABLE``, the upsert, the row a :class:`Record` becomes, the
state columns read back as a :class:`StoredState`, the columns a migration
adds (:mod:`habitrun.store.migrations`) and the views a read-only command
reads an older format through. Adding a field to what a subject's outcome
stores is one line here (and a migration step, for the stores that exist).
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field, make_dataclass
from typing import Any

from habitrun.store.jsontext import compact

RECORDS = "habitrun_record"
REQUIRED = object()  # a Record field without a default


@dataclass(frozen=True)
class Column:
    """One column of the records table, and where its value comes from when a record is stored."""

    name: str
    sql: str  # type and constraint (a column added by a migration must allow NULL)
    field: str | None = None  # the Record field it stores; None: a value put() computes
    type: Any = None  # that field's Python type
    default: Any = REQUIRED  # that field's default
    stored: str | None = None  # Python expression over ``rec`` stored (default: the field as it is)
    state: bool = False  # read back, without the result, into a StoredState
    read: str = "{}"  # how a state column's stored value is turned back ({} is the value)
    since: int = 1  # the store format that added it


_OK_ONLY = "None if rec.ok else rec.{}"  # a success stores no error (nor kind)

COLUMNS: tuple[Column, ...] = (
    Column("key", "TEXT PRIMARY KEY", "key", str, state=True),
    Column("stage", "TEXT NOT NULL", "stage", str, state=True),
    Column("subject_id", "TEXT NOT NULL", "subject_id", str, state=True),
    Column("ok", "INTEGER NOT NULL", "ok", bool, stored="1 if rec.ok else 0", state=True, read="bool({})"),
    Column("attempts", "INTEGER NOT NULL", "attempts", int, 1, stored="int(rec.attempts)", state=True),
    Column("error", "TEXT", "error", "str | None", None, stored=_OK_ONLY.format("error"), state=True),
    Column("kind", "TEXT", "kind", "str | None", None, stored=_OK_ONLY.format("kind"), state=True),
    Column("log_path", "TEXT", "log_path", "str | None", None, state=True),
    Column("run_id", "TEXT", "run_id", "str | None", None, state=True),
    # What went into the key, for `plan --reason`: a dict, or the same already as compact JSON.
    Column("components", "TEXT", "components", "dict | str", field(default_factory=dict),
           stored="rec.components if rec.components.__class__ is str else compact(rec.components)"),
    Column("duration", "REAL", "duration_sec", float, 0.0, stored="float(rec.duration_sec)"),
    Column("written_at", "REAL NOT NULL", stored="now"),
    # A success's result (Record.result), as diskcache's Disk serialises it, when small enough
    # to sit in the row (else in diskcache's Cache table and a file: mode and value NULL here).
    Column("mode", "INTEGER", stored="mode", since=2),
    Column("value", "BLOB", stored="value", since=2),
    Column("digest", "BLOB", stored="digest", since=3),  # the result's checksum (store/integrity.py)
    Column("outside", "TEXT", stored="outside", since=3),  # the first path outside the study it names
)
# Record fields stored in no column of their own: the result goes into mode, value, digest, outside.
RECORD_ONLY: tuple[tuple[str, Any, Field], ...] = (("result", Any, field(default=None)),)

NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)
STATE_COLUMNS = ", ".join(c.name for c in COLUMNS if c.state)
COMPUTED: tuple[str, ...] = tuple(c.stored or c.name for c in COLUMNS if c.field is None)  # put()'s values

RECORDS_DDL = f"CREATE TABLE IF NOT EXISTS {RECORDS} (" + ", ".join(f"{c.name} {c.sql}" for c in COLUMNS) + ")"

# A success replaces anything; a failure never replaces a stored success for the same key
# (the key says the inputs are identical, so the stored result is still valid).
UPSERT = (
    f"INSERT INTO {RECORDS} ({', '.join(NAMES)}) VALUES ({','.join('?' * len(NAMES))})"
    " ON CONFLICT(key) DO UPDATE SET " + ", ".join(f"{n}=excluded.{n}" for n in NAMES if n != "key")
    + f" WHERE excluded.ok = 1 OR {RECORDS}.ok = 0"
)


def _spec(c: Column) -> tuple:
    if c.default is REQUIRED:
        return (c.field, c.type)
    return (c.field, c.type, c.default if isinstance(c.default, Field) else field(default=c.default))


# slots: one per subject on the recorder's path; keyword-only: a misplaced argument cannot
# land in the wrong field.
Record = make_dataclass(
    "Record", [*(_spec(c) for c in COLUMNS if c.field), *RECORD_ONLY],
    slots=True, kw_only=True,
)
Record.__module__ = __name__  # (make_dataclass's own module= is Python 3.12+)
Record.__doc__ = "What the engine reports for one subject of one stage (fields: records.COLUMNS, RECORD_ONLY)."

StoredState = make_dataclass(
    "StoredState", [(c.name, c.type) for c in COLUMNS if c.state], frozen=True,
)
StoredState.__module__ = __name__
StoredState.__doc__ = "A stored record without its result (fields: the state columns of records.COLUMNS)."


def _compile(params: str, body: str, namespace: dict[str, Any]) -> Any:
    # Built once from COLUMNS, as dataclasses and namedtuple build their methods: the result
    # costs what a hand-written tuple does (it runs once per stored or read record).
    return eval(f"lambda {params}: {body}", namespace)  # constant text, from COLUMNS only


# row_of(rec, now, mode, value, digest, outside) -> the values of NAMES for the upsert.
row_of = _compile(
    ", ".join(("rec", *COMPUTED)),
    "(" + ", ".join(c.stored or f"rec.{c.field}" for c in COLUMNS) + ",)",
    {"compact": compact},
)
# state_of(row of STATE_COLUMNS) -> StoredState.
state_of = _compile(
    "row",
    "StoredState(" + ", ".join(c.read.format(f"row[{i}]") for i, c in enumerate(c for c in COLUMNS if c.state)) + ")",
    {"StoredState": StoredState},
)


def view_of_format(version: int) -> str:
    """A temporary view giving an older format's records table every column (the new ones NULL)."""
    columns = ", ".join(c.name if c.since <= version else f"NULL AS {c.name}" for c in COLUMNS)
    return f"CREATE TEMP VIEW {RECORDS} AS SELECT {columns} FROM main.{RECORDS}"

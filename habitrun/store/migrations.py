"""Store formats and the steps between them, applied in order (1 -> 2 -> 3).

Each step adds the records columns that :data:`~habitrun.store.records.COLUMNS`
marks with its format (``since``), then runs its own statements. `run`
applies the steps a store lacks inside the transaction that opens it (all or
nothing); a read-only command applies none and reads an older format through
temporary objects instead (:func:`read_only_shim`), without a byte written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from habitrun.store.guard import META_TABLE, STORE_VERSION
from habitrun.store.records import COLUMNS, RECORDS, view_of_format

log = logging.getLogger(__name__)

CHANGED = "habitrun_changed"
CHANGED_DDL = (f"CREATE TABLE IF NOT EXISTS {CHANGED} (key TEXT PRIMARY KEY, stage TEXT NOT NULL,"
               " subject_id TEXT NOT NULL, changed_at REAL NOT NULL)")

# A success replaced, under the same key, by a different result (force_rerun_subjects, a
# damaged result recomputed, resume off): downstream results computed from the old one
# are stale from that moment. A failure never replaces a success (see records.UPSERT).
TRIGGERS = (
    # Only the rare records naming paths outside the study are indexed: `plan` finds them
    # without reading the table, and storing any other record costs nothing more.
    f"CREATE INDEX IF NOT EXISTS {RECORDS}_outside ON {RECORDS} (stage) WHERE outside IS NOT NULL",
    f"CREATE TRIGGER IF NOT EXISTS {RECORDS}_changed AFTER UPDATE OF digest ON {RECORDS}"
    " WHEN old.ok = 1 AND new.ok = 1 AND old.digest IS NOT new.digest"
    # (a trigger's OR REPLACE would be overridden by the upsert's conflict handling: delete, then insert)
    f" BEGIN DELETE FROM {CHANGED} WHERE key = new.key;"
    f" INSERT INTO {CHANGED} VALUES (new.key, new.stage, new.subject_id, new.written_at); END",
)


@dataclass(frozen=True)
class Migration:
    """The step from format ``to - 1`` to format ``to``."""

    to: int
    why: str
    statements: tuple[str, ...] = ()  # after the columns of this format are added
    read_only: tuple[str, ...] = ()  # temporary objects a reader of an older format needs

    def upgrade_statements(self) -> list[str]:
        added = [f"ALTER TABLE {RECORDS} ADD COLUMN {c.name} {c.sql}" for c in COLUMNS if c.since == self.to]
        return added + list(self.statements)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(2, "a success's result may sit in its record (mode and value as diskcache's Disk writes them)",
              (f"DROP INDEX IF EXISTS {RECORDS}_subject",  # both replaced by {RECORDS}_stage (schema.SCHEMA)
               f"DROP INDEX IF EXISTS {RECORDS}_outcome")),
    Migration(3, "a checksum per result, the first path outside the study it names, changed results",
              read_only=(CHANGED_DDL.replace("CREATE TABLE IF NOT EXISTS", "CREATE TEMP TABLE"),)),
)
assert [m.to for m in MIGRATIONS] == list(range(2, STORE_VERSION + 1)), "one step per format, in order"


def read_version(con: Any) -> int:
    (version,) = con.execute(f"SELECT value FROM {META_TABLE} WHERE name = 'version'").fetchone()
    return int(version)


def upgrade(con: Any, to: int = STORE_VERSION) -> None:
    """Bring an older store to format ``to``, inside the opening transaction (all or nothing)."""
    version = read_version(con)
    for step in MIGRATIONS:
        if version < step.to <= to:
            log.debug("store: format %d -> %d", step.to - 1, step.to)
            for statement in step.upgrade_statements():
                con.execute(statement)
    if to == STORE_VERSION:
        for statement in TRIGGERS:
            con.execute(statement)
    if version < to:
        con.execute(f"UPDATE {META_TABLE} SET value = ? WHERE name = 'version'", (str(to),))


def read_only_shim(version: int) -> list[str]:
    """Temporary objects (shadowing the main ones by name, as SQLite resolves temp first) that
    give an older format the columns and tables it lacks."""
    if version >= STORE_VERSION:
        return []
    shim = [view_of_format(version)]
    for step in MIGRATIONS:
        if step.to > version:
            shim += step.read_only
    return shim

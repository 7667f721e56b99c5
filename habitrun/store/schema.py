"""The store's SQLite schema: creating it, upgrading older formats, opening it read-only.

Format 1 kept every result in diskcache's ``Cache`` table; format 2 keeps
small results in the record row; format 3 adds a checksum per result, the
first path outside the study it names, and ``habitrun_changed`` (see
:mod:`habitrun.store.checkpoint`). `run` upgrades a store in place when it
opens it (one transaction: all or nothing); read-only commands read any of
these formats through temporary views and never write.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from habitrun.errors import StoreError
from habitrun.store.damage import Damage, in_memory, open_for_reading, quick_check, repair_file
from habitrun.store.filetable import FILES_SCHEMA
from habitrun.store.guard import DB_NAME, META_TABLE, STORE_FORMAT, STORE_VERSION

RECORDS = "habitrun_record"
CHANGED = "habitrun_changed"

SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {META_TABLE} (name TEXT PRIMARY KEY, value TEXT)",
    f"CREATE TABLE IF NOT EXISTS {RECORDS} ("
    " key TEXT PRIMARY KEY, stage TEXT NOT NULL, subject_id TEXT NOT NULL, ok INTEGER NOT NULL,"
    " attempts INTEGER NOT NULL, error TEXT, kind TEXT, log_path TEXT, run_id TEXT,"
    " components TEXT, duration REAL, written_at REAL NOT NULL, mode INTEGER, value BLOB,"
    " digest BLOB, outside TEXT)",
    f"CREATE TABLE IF NOT EXISTS {CHANGED} (key TEXT PRIMARY KEY, stage TEXT NOT NULL,"
    " subject_id TEXT NOT NULL, changed_at REAL NOT NULL)",
    # One index serves every question by stage: a subject's latest record, and (covering ok
    # and key) which keys of a stage are done or failed. Its entries go in subject order,
    # mostly next to each other; a second index ordered by the (random) key would cost a
    # page written per record per commit.
    f"CREATE INDEX IF NOT EXISTS {RECORDS}_stage ON {RECORDS} (stage, subject_id, written_at, ok, key)",
    FILES_SCHEMA,  # input file digests (habitrun.store.filetable); added to older stores when opened
    f"INSERT OR IGNORE INTO {META_TABLE} VALUES ('format', '{STORE_FORMAT}')",
    f"INSERT OR IGNORE INTO {META_TABLE} VALUES ('version', '{STORE_VERSION}')",
)
# Format 1 -> 2: a success's result may sit in its record (mode and value as diskcache's Disk writes them).
UPGRADE_FROM_1 = (
    f"ALTER TABLE {RECORDS} ADD COLUMN mode INTEGER",
    f"ALTER TABLE {RECORDS} ADD COLUMN value BLOB",
    f"DROP INDEX IF EXISTS {RECORDS}_subject",  # both replaced by {RECORDS}_stage
    f"DROP INDEX IF EXISTS {RECORDS}_outcome",
)
# Format 2 -> 3: a checksum per result, the first path outside the study it names.
UPGRADE_FROM_2 = (
    f"ALTER TABLE {RECORDS} ADD COLUMN digest BLOB",
    f"ALTER TABLE {RECORDS} ADD COLUMN outside TEXT",
)
# A success replaced, under the same key, by a different result (force_rerun_subjects, a
# damaged result recomputed, resume off): downstream results computed from the old one
# are stale from that moment. A failure never replaces a success (see _UPSERT).
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
# Read-only opening of an older format: temporary objects (shadowing the main ones by name,
# as SQLite resolves temp first) give the columns and table it lacks, without a byte written.
RO_SHIM = {
    1: (
        f"CREATE TEMP VIEW {RECORDS} AS SELECT key, stage, subject_id, ok, attempts, error, kind,"
        " log_path, run_id, components, duration, written_at, NULL AS mode, NULL AS value,"
        f" NULL AS digest, NULL AS outside FROM main.{RECORDS}",
    ),
    2: (
        f"CREATE TEMP VIEW {RECORDS} AS SELECT key, stage, subject_id, ok, attempts, error, kind,"
        " log_path, run_id, components, duration, written_at, mode, value,"
        f" NULL AS digest, NULL AS outside FROM main.{RECORDS}",
    ),
}


def read_version(con: Any) -> int:
    (version,) = con.execute(f"SELECT value FROM {META_TABLE} WHERE name = 'version'").fetchone()
    return int(version)


def upgrade(con: Any) -> None:
    """Bring an older store to this format, inside the opening transaction (all or nothing)."""
    version = read_version(con)
    if version == 1:
        for statement in UPGRADE_FROM_1:
            con.execute(statement)
    if version in (1, 2):
        for statement in UPGRADE_FROM_2:
            con.execute(statement)
    for statement in TRIGGERS:
        con.execute(statement)
    if version != STORE_VERSION:
        con.execute(f"UPDATE {META_TABLE} SET value = ? WHERE name = 'version'", (str(STORE_VERSION),))


def mark_new_store(directory: Path) -> None:
    """Write our tables before diskcache writes its own, in one transaction.

    A process killed while creating a store then leaves either an empty file or a database
    marked as ours, never an unmarked diskcache that the next open would refuse as foreign.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(directory / DB_NAME, timeout=60, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot create the checkpoint store at {directory}: {exc}") from None
    try:
        con.execute("BEGIN IMMEDIATE")
        for statement in (*SCHEMA, *TRIGGERS):
            con.execute(statement)
        con.execute("COMMIT")
    except sqlite3.Error as exc:
        raise StoreError(f"cannot create the checkpoint store at {directory}: {exc}") from None
    finally:
        con.close()


def open_read_only(directory: Path) -> tuple[sqlite3.Connection, Damage | None]:
    """A ``mode=ro`` connection, with temporary views over an older format (nothing written).

    A damaged file is read record by record into memory (see :mod:`habitrun.store.damage`).
    """
    damage = None
    try:
        con, problem = open_for_reading(directory / DB_NAME)
        problem = problem or quick_check(con)
        if problem is not None:
            try:
                salvaged, damage = in_memory(con, problem, RECORDS)
            finally:
                con.close()
            con = salvaged
        version = read_version(con)
        for statement in RO_SHIM.get(version, ()):
            con.execute(statement)
        if version < 3:
            con.execute(f"CREATE TEMP TABLE {CHANGED} (key TEXT PRIMARY KEY, stage TEXT, subject_id TEXT,"
                        " changed_at REAL)")
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read the checkpoint store at {directory}: {exc}") from None
    return con, damage


def check_and_repair(directory: Path) -> Damage | None:
    """Before anything writes: a damaged file is salvaged into a new one (the old kept aside)."""
    try:
        con, problem = open_for_reading(directory / DB_NAME)
        try:
            problem = problem or quick_check(con)
        finally:
            con.close()
        if problem is None:
            return None
        return repair_file(directory, DB_NAME, problem, RECORDS)
    except (sqlite3.Error, OSError) as exc:
        raise StoreError(
            f"the checkpoint store at {directory} is damaged and cannot be salvaged ({exc}); "
            "nothing was deleted. Move the folder away (or point policy.checkpoint_dir at a new one) "
            "to start afresh."
        ) from None

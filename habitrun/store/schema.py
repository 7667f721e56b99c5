"""The store's SQLite schema: creating it, opening it read-only, salvaging a damaged file.

The records table's columns are in :mod:`habitrun.store.records`; older
formats and the steps up from them in :mod:`habitrun.store.migrations`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from habitrun.errors import StoreError
from habitrun.store.damage import Damage, in_memory, open_for_reading, quick_check, repair_file
from habitrun.store.filetable import FILES_SCHEMA
from habitrun.store.guard import DB_NAME, META_TABLE, STORE_FORMAT, STORE_VERSION
from habitrun.store.migrations import CHANGED_DDL, TRIGGERS, read_only_shim, read_version
from habitrun.store.records import RECORDS, RECORDS_DDL
from habitrun.store.seal import is_sealed

SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {META_TABLE} (name TEXT PRIMARY KEY, value TEXT)",
    RECORDS_DDL,
    CHANGED_DDL,
    # One index serves every question by stage: a subject's latest record, and (covering ok
    # and key) which keys of a stage are done or failed. Its entries go in subject order,
    # mostly next to each other; a second index ordered by the (random) key would cost a
    # page written per record per commit.
    f"CREATE INDEX IF NOT EXISTS {RECORDS}_stage ON {RECORDS} (stage, subject_id, written_at, ok, key)",
    FILES_SCHEMA,  # input file digests (habitrun.store.filetable); added to older stores when opened
    f"INSERT OR IGNORE INTO {META_TABLE} VALUES ('format', '{STORE_FORMAT}')",
    f"INSERT OR IGNORE INTO {META_TABLE} VALUES ('version', '{STORE_VERSION}')",
)


def mark_new_store(directory: Path) -> sqlite3.Connection:
    """Write our tables before diskcache writes its own, in one transaction; the connection,
    still open, for the caller to close (:func:`habitrun.store.diskcache_adapter.open_cache`).

    A process killed while creating a store then leaves either an empty file, a file with no
    table, or a database marked as ours, never an unmarked diskcache that the next open would
    refuse as foreign. The file is put in WAL mode first, the mode diskcache would switch it
    to: one switch on an empty file, and our transaction is then the WAL's first commit (made
    durable: the default ``synchronous=FULL``), instead of a rollback-journal commit followed
    by diskcache's switch, each with its four fsyncs.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(directory / DB_NAME, timeout=60, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot create the checkpoint store at {directory}: {exc}") from None
    try:
        con.execute("PRAGMA journal_mode=WAL").fetchall()
        con.execute("BEGIN IMMEDIATE")
        for statement in (*SCHEMA, *TRIGGERS):
            con.execute(statement)
        con.execute("COMMIT")
    except sqlite3.Error as exc:
        con.close()
        raise StoreError(f"cannot create the checkpoint store at {directory}: {exc}") from None
    return con


def open_read_only(directory: Path) -> tuple[sqlite3.Connection, Damage | None]:
    """A ``mode=ro`` connection, with temporary views over an older format (nothing written).

    A damaged file is read record by record into memory (see :mod:`habitrun.store.damage`).
    A file sealed at a clean close is not checked again (see :mod:`habitrun.store.seal`).
    """
    damage = None
    try:
        sealed = is_sealed(directory / DB_NAME)
        con, problem = open_for_reading(directory / DB_NAME)
        problem = problem or (None if sealed else quick_check(con))
        if problem is not None:
            try:
                salvaged, damage = in_memory(con, problem, RECORDS)
            finally:
                con.close()
            con = salvaged
        for statement in read_only_shim(read_version(con)):
            con.execute(statement)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read the checkpoint store at {directory}: {exc}") from None
    return con, damage


def check_and_repair(directory: Path) -> Damage | None:
    """Before anything writes: a damaged file is salvaged into a new one (the old kept aside).
    A file sealed at a clean close is not checked again (see :mod:`habitrun.store.seal`)."""
    try:
        sealed = is_sealed(directory / DB_NAME)
        con, problem = open_for_reading(directory / DB_NAME)
        try:
            problem = problem or (None if sealed else quick_check(con))
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

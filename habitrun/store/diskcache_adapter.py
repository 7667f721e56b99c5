"""Everything the store does with diskcache beyond its public API, in one place.

The store writes its records and diskcache's ``Cache`` rows in one SQLite
transaction, so it uses diskcache's connection (``Cache._con``) and its
transaction that removes replaced files after the commit (``Cache._transact``),
and reads and writes the ``Cache`` table directly: a large result is a
``Cache`` row plus a file, as diskcache itself would store it, and
diskcache's triggers keep its ``count`` and ``size`` settings in step.
tests/store/test_diskcache_adapter.py pins the columns, settings and
triggers relied on here, so a diskcache release that changes them fails
there first.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import diskcache

from habitrun.errors import StoreError
from habitrun.store.guard import DB_NAME
from habitrun.store.records import RECORDS

CACHE_TABLE = "Cache"
# The Cache columns read or written here (PRAGMA table_info order; rowid first).
CACHE_COLUMNS = ("rowid", "key", "raw", "store_time", "expire_time", "access_time", "access_count", "tag",
                 "size", "mode", "filename", "value")
# diskcache's settings as the store opens it: results are records, never evicted or culled.
SETTINGS = {"eviction_policy": "none", "cull_limit": 0, "statistics": 0, "tag_index": 0, "size_limit": 2**62}
# Settings diskcache's triggers keep in step when a Cache row is written directly.
COUNTED_SETTINGS = ("count", "size")
KEYS_PARAM = "(SELECT value FROM json_each(?))"  # one query for any number of keys

# (size, mode, filename, value): what Disk.store returns, and what a Cache row holds of it.
Stored = tuple[int, int, "str | None", Any]


def open_cache(directory: Path, held: sqlite3.Connection | None = None) -> diskcache.Cache:
    """diskcache's Cache on the store's folder (it writes its settings and tables on opening).

    diskcache ends its set-up by closing its connection and opening it again. Were that the
    only connection, SQLite would checkpoint the write-ahead log into the file and delete it,
    then create it anew: four fsyncs of a set-up that needs none. So a connection that has read
    the database (``held``, as :func:`~habitrun.store.schema.mark_new_store` leaves it; else
    one opened here) stays open meanwhile: the log is kept, and checkpointed at the store's close.
    """
    if held is None:
        try:
            held = _reader(directory)
        except sqlite3.Error:
            pass  # diskcache says what is wrong
    try:
        return diskcache.Cache(str(directory), timeout=60, **SETTINGS)
    except (OSError, diskcache.Timeout) as exc:
        raise StoreError(f"cannot open the checkpoint store at {directory}: {exc}") from None
    except Exception as exc:  # sqlite3.DatabaseError after the read-only check: a race or damage
        raise StoreError(f"cannot open the checkpoint store at {directory}: {exc}") from None
    finally:
        if held is not None:
            held.close()


def _reader(directory: Path) -> sqlite3.Connection:
    """A connection that has read the database: in WAL mode it holds the log open until closed."""
    con = sqlite3.connect(directory / DB_NAME, timeout=60, isolation_level=None)
    try:
        con.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.Error:
        con.close()
        raise
    return con


def connection(cache: diskcache.Cache) -> sqlite3.Connection:
    """This thread's connection (diskcache keeps one per thread; the recorder writes from its own)."""
    return cache._con


@contextmanager
def write_transaction(cache: diskcache.Cache) -> Iterator[tuple[Callable, Callable[[str | None], None]]]:
    """BEGIN IMMEDIATE on diskcache's connection: (sql, remove_after_commit(filename))."""
    with cache._transact(retry=True) as (sql, remove_after_commit):
        yield sql, remove_after_commit


def holds_results(con: sqlite3.Connection) -> bool:
    """Whether the Cache table holds any row (large results, or a format-1 store's); False when
    there is no such table (a store whose creation was cut short, or lost from its log: diskcache
    makes it after habitrun's tables, and a writer's open makes it again)."""
    try:
        return con.execute(f"SELECT 1 FROM {CACHE_TABLE} LIMIT 1").fetchone() is not None
    except sqlite3.OperationalError:
        if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (CACHE_TABLE,)).fetchone():
            raise
        return False


def replace_results(con: sqlite3.Connection, sql: Callable, keys: list[str], spilled: dict[str, Stored],
                    now: float, remove_after_commit: Callable[[str | None], None]) -> None:
    """Drop the Cache rows of ``keys`` (their files once committed), then add the ``spilled`` ones."""
    gone = []
    for rowid, filename in sql(
        f"SELECT rowid, filename FROM {CACHE_TABLE} WHERE raw = 1 AND key IN {KEYS_PARAM}", (json.dumps(keys),),
    ):
        remove_after_commit(filename)
        gone.append((rowid,))
    if gone:
        con.executemany(f"DELETE FROM {CACHE_TABLE} WHERE rowid = ?", gone)
    if spilled:
        con.executemany(
            f"INSERT INTO {CACHE_TABLE} (key, raw, store_time, expire_time, access_time, access_count, tag,"
            " size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, ?, ?, ?, ?)",
            [(key, now, now, size, mode, filename, value) for key, (size, mode, filename, value) in spilled.items()],
        )


def move_result(con: sqlite3.Connection, old: str, new: str) -> None:
    """The Cache row of key ``old``, if any, now under ``new``."""
    con.execute(f"UPDATE OR REPLACE {CACHE_TABLE} SET key = ? WHERE key = ? AND raw = 1", (new, old))


def large_results(con: sqlite3.Connection, wanted: str) -> list[tuple]:
    """(key, mode, filename, value, digest, stage, subject_id) of the keys in ``wanted`` (JSON)
    whose result is in the Cache table, not in their record."""
    return con.execute(
        f"SELECT c.key, c.mode, c.filename, c.value, r.digest, r.stage, r.subject_id FROM {CACHE_TABLE} c"
        f" LEFT JOIN {RECORDS} r ON r.key = c.key WHERE c.raw = 1 AND c.key IN {KEYS_PARAM}"
        f" AND c.key NOT IN (SELECT key FROM {RECORDS} WHERE key IN {KEYS_PARAM} AND mode IS NOT NULL)",
        (wanted, wanted),
    ).fetchall()


def result_files(con: sqlite3.Connection, where: str, params: tuple) -> list[tuple]:
    """(key, mode, filename, size, store_time, digest) of the records matching ``where`` (over
    the records table, aliased r) whose result is a file."""
    return con.execute(
        f"SELECT c.key, c.mode, c.filename, c.size, c.store_time, r.digest FROM {CACHE_TABLE} c"
        f" JOIN {RECORDS} r ON r.key = c.key WHERE {where} AND r.mode IS NULL AND c.filename IS NOT NULL",
        params,
    ).fetchall()


def record_sizes(con: sqlite3.Connection) -> list[tuple[str, str, str, int]]:
    """Every record as (key, stage, subject, bytes its result takes, in its row and in Cache)."""
    return con.execute(
        f"SELECT r.key, r.stage, r.subject_id, coalesce(length(r.value), 0) + coalesce(c.size, 0)"
        f" + coalesce(length(c.value), 0) FROM {RECORDS} r LEFT JOIN {CACHE_TABLE} c ON c.key = r.key AND c.raw = 1"
    ).fetchall()

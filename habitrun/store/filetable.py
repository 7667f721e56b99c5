"""The store's table of input files: path -> (size, mtime_ns, inode, content digest).

A file whose size, mtime and inode are what the table says was not changed
since its content was hashed, so planning costs one ``stat`` per file and no
read. The table is a cache of digests, not a record of work: losing it only
means the files are read once more.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from habitrun.store.checkpoint import CheckpointStore

FILES_TABLE = "habitrun_file"
FILES_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {FILES_TABLE} ("
    " path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,"
    " inode INTEGER NOT NULL, digest TEXT NOT NULL) WITHOUT ROWID"
)

FileStat = tuple[int, int, int, str]  # size, mtime_ns, inode, digest


def known_files(store: CheckpointStore | None) -> dict[str, FileStat]:
    """Every file the store has a digest for (empty without a store or table)."""
    if store is None:
        return {}
    try:
        rows = store._query(f"SELECT path, size, mtime_ns, inode, digest FROM {FILES_TABLE}")
    except sqlite3.Error:
        return {}
    return {path: (size, mtime, inode, digest) for path, size, mtime, inode, digest in rows}


def remember_files(store: CheckpointStore, rows: Iterable[tuple[str, int, int, int, str]]) -> bool:
    """Store (path, size, mtime_ns, inode, digest) rows; False when the store cannot be written.

    Best effort: a plan on a read-only store still works, it only hashes again next time.
    """
    rows = list(rows)
    if not rows:
        return True
    try:
        with store._transaction() as con:
            con.execute(FILES_SCHEMA)
            con.executemany(f"INSERT OR REPLACE INTO {FILES_TABLE} VALUES (?,?,?,?,?)", rows)
    except (sqlite3.Error, OSError):
        return False
    return True

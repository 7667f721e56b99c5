"""Decide, without writing a byte, whether a folder may be opened as a checkpoint store.

diskcache rewrites settings and switches the journal mode of any SQLite file
it opens, so a folder is inspected read-only first: a foreign diskcache, a
corrupt database or a plain file where the folder should be is refused with
a message, and left exactly as it was.
"""

from __future__ import annotations

import os
import sqlite3
from enum import Enum
from pathlib import Path
from urllib.parse import quote

from habitrun.errors import StoreError

DB_NAME = "cache.db"  # diskcache's database file name
STORE_FORMAT = "habitrun-checkpoint-store"
STORE_VERSION = 3
UPGRADABLE_VERSIONS = (1, 2)  # older formats: upgraded in place by `run`, read as they are by read-only commands
META_TABLE = "habitrun_meta"
LOCK_NAME = "habitrun.lock"
_SQLITE_HEADER = b"SQLite format 3\x00"
# files habitrun itself may put in a store folder before the database (or leave after it is deleted)
_HARMLESS = {LOCK_NAME, DB_NAME + ".seal", DB_NAME + ".seal-tmp"}


class StoreDirState(str, Enum):
    MISSING = "missing"  # nothing there yet: create it
    EMPTY = "empty"  # a folder without a database (or a database never written): initialise it
    HABITRUN = "habitrun"  # a store habitrun wrote


def _refuse(directory: Path, what: str) -> StoreError:
    return StoreError(
        f"{directory} is not a habitrun checkpoint store: {what}. It was left untouched; "
        "move it away, or point policy.checkpoint_dir (or the recipe's run_dir) at another folder."
    )


def inspect_store_dir(directory: Path) -> StoreDirState:
    """Classify ``directory``; raise StoreError for anything that is not (yet) a habitrun store."""
    if not directory.exists():
        if directory.is_symlink():
            raise _refuse(directory, "it is a dangling symbolic link")
        return StoreDirState.MISSING
    if not directory.is_dir():
        raise _refuse(directory, "it is a file, not a folder")
    db = directory / DB_NAME
    if not db.exists():
        others = sorted(set(os.listdir(directory)) - _HARMLESS)
        if others:
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            raise _refuse(directory, f"the folder holds other files ({shown}) and no {DB_NAME}")
        return StoreDirState.EMPTY
    if not db.is_file():
        raise _refuse(directory, f"{DB_NAME} is not a regular file")
    with open(db, "rb") as fh:
        header = fh.read(len(_SQLITE_HEADER))
    if not header:
        return StoreDirState.EMPTY  # created, never written (a crash right at creation)
    if header != _SQLITE_HEADER:
        raise _refuse(directory, f"{DB_NAME} is not an SQLite database (corrupt or foreign)")
    return _check_database(directory, db)


def _check_database(directory: Path, db: Path) -> StoreDirState:
    # Without a write-ahead log there is nothing but the file to read: open it immutable, so
    # not even -wal/-shm companions appear beside a foreign file. With one (a live or killed
    # habitrun writer), read-only mode is needed to see the log's committed pages.
    wal = db.with_name(db.name + "-wal")
    mode = "mode=ro" if wal.exists() else "immutable=1"
    uri = f"file:{quote(str(db))}?{mode}"
    try:
        con = sqlite3.connect(uri, uri=True, timeout=30)
    except sqlite3.Error as exc:
        raise _refuse(directory, f"{DB_NAME} cannot be opened ({exc})") from None
    try:
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if META_TABLE not in tables:
            if {"Cache", "Settings"} <= tables:
                raise _refuse(directory, f"{DB_NAME} is a diskcache that habitrun did not write")
            if not tables:
                return StoreDirState.EMPTY
            raise _refuse(directory, f"{DB_NAME} is an SQLite database of something else")
        meta: dict[str, str] | None = dict(con.execute(f"SELECT name, value FROM {META_TABLE}").fetchall())
    except sqlite3.DatabaseError as exc:
        meta = _meta_of_damaged(db)
        if meta is None:
            raise _refuse(directory, f"{DB_NAME} is damaged ({exc})") from None
    finally:
        con.close()
    assert meta is not None  # a damaged store without one was refused above
    if meta.get("format") != STORE_FORMAT:
        raise _refuse(directory, f"{DB_NAME} has an unknown format marker {meta.get('format')!r}")
    try:
        version = int(meta.get("version", "0"))
    except ValueError:
        version = -1
    if version != STORE_VERSION and version not in UPGRADABLE_VERSIONS:
        newer = version > STORE_VERSION
        raise StoreError(
            f"the checkpoint store at {directory} has format version {meta.get('version')!r}; "
            f"this habitrun reads versions {', '.join(map(str, UPGRADABLE_VERSIONS))} and {STORE_VERSION}. "
            + ("A newer habitrun wrote it: upgrade habitrun, " if newer else "Use the habitrun that wrote it, ")
            + "or point policy.checkpoint_dir at a new folder."
        )
    return StoreDirState.HABITRUN


def empty_store_file(directory: Path) -> str | None:
    """A message when the store's database file exists but is empty (0 bytes), else None.

    Such a file is treated as no store (a crash while creating one leaves it), but it may
    also be a store that was truncated: whatever it held is gone, and the user is told so.
    """
    db = Path(directory) / DB_NAME
    try:
        if not db.is_file() or db.stat().st_size != 0:
            return None
    except OSError:
        return None
    return (f"the checkpoint store file {db} is empty (0 bytes): nothing stored in it can be used "
            "(a crash while creating it, or a truncated file); every subject is treated as never run")


def _meta_of_damaged(db: Path) -> dict[str, str] | None:
    """The marker table of a file SQLite refuses (truncated), read from an in-memory copy."""
    from habitrun.store.damage import open_for_reading  # the damage tools, only when needed

    try:
        con, _ = open_for_reading(db, immutable=not db.with_name(db.name + "-wal").exists())
    except (sqlite3.Error, OSError):
        return None
    try:
        return dict(con.execute(f"SELECT name, value FROM {META_TABLE}").fetchall())
    except sqlite3.Error:
        return None
    finally:
        con.close()

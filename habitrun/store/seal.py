"""The seal of a store closed cleanly: what lets a later open skip SQLite's ``quick_check``.

``quick_check`` reads the whole file: 1.4 s of CPU for a million subjects x 3
stages, on every `plan`, `status` and `run`. It finds damage done to the file
from outside SQLite: bytes overwritten, a truncated or half-copied file, a
write torn by a crash. A store is sound when such a check passed and SQLite
alone has written the file since.

A writer that closes the store (its connection gone, the write-ahead log
checkpointed into the file and removed) writes ``cache.db.seal``: the file's
device, inode, size, mtime and ctime, once the file is on disk (fsync). An
open whose file still has exactly that stat, and no write-ahead log with
anything in it, skips the check; any other open runs it in full, as before.
Why that is sound:

* Anything that writes the file changes its mtime and ctime, and ctime cannot
  be set back (``os.utime`` or ``touch -d`` set it to now); a copy or a
  restore over it is a new inode or a new ctime; a truncation a new size.
* Timestamps tick coarsely (a few ms), so a write in the same tick as the
  seal's stat could leave them equal: the seal is kept only when its own
  file's mtime is later than the database's ctime, so any later write to the
  database stamps a time past the one sealed.
* A writer killed or crashed leaves a changed file (or a log with frames in
  it) and no new seal: the next open checks in full. A writer opening removes
  the seal before it writes a byte.
* A damaged store salvaged by `run` is a new file (a new inode): checked in
  full the next time only if it was not sealed at a clean close.

What a seal cannot see is damage without a write: a disk's own decay under an
unchanged stat. SQLite reports such a page when a query reads it, and every
result is checked against its checksum when read (:mod:`habitrun.store.integrity`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

SEAL_SUFFIX = ".seal"
_FIELDS = ("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")
_TICK_TRIES = 20  # 20 x 5 ms: a filesystem with coarser timestamps is just not sealed


def seal_path(db: Path) -> Path:
    """Where the seal of database file ``db`` is kept."""
    return db.with_name(db.name + SEAL_SUFFIX)


def _stamp(db: Path) -> list[int]:
    st = os.stat(db)
    return [getattr(st, name) for name in _FIELDS]


def _log_is_empty(db: Path) -> bool:
    try:
        return os.stat(f"{db}-wal").st_size == 0
    except FileNotFoundError:
        return True


def empty_log(con: sqlite3.Connection, wait_ms: int = 200) -> bool:
    """Move the write-ahead log into the file and empty it (other connections may stay open,
    idle); False when a reader or writer holds it past ``wait_ms`` (then no seal: never a
    closing run kept waiting on a reader)."""
    try:
        (waited,) = con.execute("PRAGMA busy_timeout").fetchone()
        con.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
        try:
            return con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        finally:
            con.execute(f"PRAGMA busy_timeout = {int(waited)}")
    except sqlite3.Error:
        return False


def break_seal(db: Path) -> None:
    """Remove the seal: a writer is about to change the file."""
    seal_path(db).unlink(missing_ok=True)


def is_sealed(db: Path) -> bool:
    """Whether ``db`` is exactly as a writer left it at a clean close (see the module docstring)."""
    try:
        sealed = json.loads(seal_path(db).read_text())
        return isinstance(sealed, dict) and sealed.get("stat") == _stamp(db) and _log_is_empty(db)
    except (OSError, ValueError):
        return False


def write_seal(db: Path) -> bool:
    """After a clean close: seal ``db`` (flushed to disk first); False when it cannot be sealed
    (a log still holds frames, as when another connection is open, or timestamps too coarse)."""
    try:
        if not _log_is_empty(db):
            return False
        fd = os.open(db, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        stamp = _stamp(db)
        seal, tmp = seal_path(db), seal_path(db).with_suffix(".seal-tmp")
        for _ in range(_TICK_TRIES):
            tmp.write_text(json.dumps({"stat": stamp}))
            if os.stat(tmp).st_mtime_ns > stamp[4]:  # any later write to db stamps a later time
                os.replace(tmp, seal)
                if _stamp(db) == stamp:
                    return True
                break_seal(db)  # written meanwhile: no seal
                return False
            time.sleep(0.005)
        tmp.unlink(missing_ok=True)
    except OSError:
        pass
    return False

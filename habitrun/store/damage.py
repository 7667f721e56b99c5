"""A damaged store file: find what is still readable, keep all of it, say what is lost.

Opening a store runs SQLite's ``quick_check`` (one read of the file; a
fraction of a second for a store of 100,000 subjects x 3 stages), unless the
file is exactly as a writer left it at a clean close (:mod:`habitrun.store.seal`). When it
finds damage (bytes overwritten in the middle of the file, a truncated file)
every record, result and table row is read one by one, by rowid, and what
reads back is copied into a fresh database: in memory for a read-only
command (`plan`, `status` then show the study as the intact records say),
or, for `run`, into a new file that replaces the damaged one, which is kept
beside it (``cache.db.damaged-<time>``) and never deleted. A record that
cannot be read (or whose large result's row is lost) is reported by stage
and subject where the index still names it, and its subject is stale.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from habitrun.store.diskcache_adapter import CACHE_TABLE

_SCAN_SLACK = 1000  # rowids probed past the last one known, when the table's end cannot be read


@dataclass
class Damage:
    """What a damaged store still holds and what it lost."""

    problem: str  # SQLite's first complaint
    kept: int = 0  # records copied intact
    lost: list[tuple[str, str]] = field(default_factory=list)  # (stage, subject) of records lost
    lost_unnamed: int = 0  # lost records the index does not name either (-1: unknown)
    results_lost: int = 0  # large results whose row was unreadable (their records are in ``lost``)
    aside: Path | None = None  # where `run` moved the damaged file

    def summary(self, directory: Path) -> str:
        named = sorted({f"{stage} {sid}" for stage, sid in self.lost})
        shown = ", ".join(named[:8]) + (f" and {len(named) - 8} more" if len(named) > 8 else "")
        lost = f"{len(self.lost) + max(0, self.lost_unnamed)} record(s) unreadable"
        if named:
            lost += f" ({shown})"
        if self.lost_unnamed > 0:
            lost += f"; {self.lost_unnamed} of them not named by the index"
        elif self.lost_unnamed < 0:
            lost += "; records the index does not name may be lost too (their subjects then run as new)"
        text = (f"the checkpoint store at {directory} is damaged ({self.problem}): {lost}; "
                f"{self.kept} record(s) intact and used; the subjects of the unreadable ones are stale")
        if self.aside is not None:
            text += f". The damaged file is kept as {self.aside}; the store now holds the intact records"
        return text


def open_for_reading(db: Path, *, immutable: bool = False) -> tuple[sqlite3.Connection, str | None]:
    """A read-only connection to ``db``, and what is wrong with it if SQLite cannot read it as is.

    A truncated file (shorter than its header says) is refused by SQLite as a whole, even
    the pages that are there. Then the file is read into memory with its header made to
    match its length (no free-page list, no write-ahead log) so that what it still holds can
    be read; the file itself is not touched. ``immutable``: not even SQLite's read-only mode,
    which makes -wal/-shm files beside a file whose header says write-ahead log (the guard
    must not write a byte beside a file it may refuse).
    """
    try:
        return _probe(db, "immutable=1" if immutable else "mode=ro"), None
    except sqlite3.OperationalError as exc:
        # A store in a folder this user cannot write, without the write-ahead log's files:
        # SQLite cannot make them, and with no log no writer can be active, so the file
        # alone is the whole database.
        if "locked" in str(exc) or Path(f"{db}-wal").exists():
            raise
        try:
            return _probe(db, "immutable=1"), None
        except sqlite3.OperationalError:
            raise exc from None
        except sqlite3.DatabaseError:
            pass
    except sqlite3.DatabaseError:
        pass
    return _patched_copy(db)


def _probe(db: Path, mode: str) -> sqlite3.Connection:
    con = sqlite3.connect(f"file:{quote(str(db))}?{mode}", uri=True, timeout=60, isolation_level=None,
                          check_same_thread=False)
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        con.close()
        raise
    return con


def _patched_copy(db: Path) -> tuple[sqlite3.Connection, str]:
    data = bytearray(db.read_bytes())
    size = int.from_bytes(data[16:18], "big") if len(data) >= 100 else 0
    size = 65536 if size == 1 else size
    if size < 512 or size & (size - 1):
        raise sqlite3.DatabaseError("its header is damaged (no valid page size)")
    pages = len(data) // size
    counted = int.from_bytes(data[28:32], "big")
    del data[pages * size:]
    data[28:32] = pages.to_bytes(4, "big")
    data[32:40] = bytes(8)  # forget the free-page list (it may point past the end)
    data[18] = data[19] = 1  # a plain file: the copy has no write-ahead log
    con = _from_bytes(bytes(data))
    if pages < counted:
        return con, f"the file is truncated: it holds {pages} of the {counted} pages its header counts"
    return con, "SQLite cannot read the file as it is"


def _from_bytes(data: bytes) -> sqlite3.Connection:
    """A connection on a database image held in memory (``deserialize``, 3.11+), or on 3.10 on an
    unlinked temporary copy of it (SQLite keeps the file open)."""
    if sys.version_info >= (3, 11):
        con = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        con.deserialize(data)
        return con
    with tempfile.NamedTemporaryFile(prefix="habitrun-damaged-", suffix=".db", delete=False) as tmp:
        tmp.write(data)
    try:
        con = sqlite3.connect(tmp.name, isolation_level=None, check_same_thread=False)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the file is open before the unlink
        except sqlite3.DatabaseError:
            pass  # the caller reads what it can and says what it cannot
    finally:
        os.unlink(tmp.name)
    return con


def quick_check(con: sqlite3.Connection) -> str | None:
    """None when SQLite finds the file sound, else its first complaint."""
    try:
        rows = con.execute("PRAGMA quick_check(5)").fetchall()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    if rows == [("ok",)]:
        return None
    lines = [line.strip() for row in rows for line in str(row[0]).splitlines()]
    return "; ".join([line for line in lines if line and not line.startswith("***")][:2])


def _max_rowid(con: sqlite3.Connection, table: str, hint: int) -> tuple[int, bool]:
    """The last rowid to probe, and whether it is known (else a generous guess)."""
    try:
        (top,) = con.execute(f"SELECT max(rowid) FROM {table}").fetchone()
        return max(int(top or 0), hint), True
    except sqlite3.DatabaseError:
        return hint * 2 + _SCAN_SLACK, False


def _rows(con: sqlite3.Connection, table: str, columns: str, hint: int) -> tuple[list[tuple], int]:
    """Every readable row of ``table`` (point reads by rowid), and how many rowids failed
    (-1: unknown, the table's end could not be read, so failed probes may be rows never written)."""
    out, failed = [], 0
    top, known = _max_rowid(con, table, hint)
    for rowid in range(1, top + 1):
        try:
            row = con.execute(f"SELECT {columns} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            failed += 1
            continue
        if row is not None:
            out.append(row)
    return out, failed if known else -1


def _schema(con: sqlite3.Connection) -> list[tuple[str, str, str]]:
    """(type, name, sql) of every table, index and trigger, tables first."""
    rows = con.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
    order = {"table": 0, "index": 1, "trigger": 2}
    return sorted((r for r in rows if r[0] in order and not r[1].startswith("sqlite_")), key=lambda r: order[r[0]])


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in con.execute(f"PRAGMA table_info({table})")]


def salvage(source: sqlite3.Connection, dest: sqlite3.Connection, problem: str, records: str) -> Damage:
    """Copy every readable row of ``source`` into ``dest`` (empty); report what was lost.

    ``records`` is the records table's name. Raises sqlite3.DatabaseError when not even the
    schema can be read (nothing can be salvaged then).
    """
    damage = Damage(problem)
    schema = _schema(source)
    tables = [name for kind, name, _sql in schema if kind == "table"]
    dest.execute("BEGIN")
    for kind, _name, sql in schema:
        if kind != "trigger":
            dest.execute(sql)
    named: dict[str, tuple[str, str]] = {}  # key -> (stage, subject), from the index where readable
    try:
        for stage, sid, key in source.execute(
            f"SELECT stage, subject_id, key FROM {records} INDEXED BY {records}_stage"
        ):
            named[key] = (stage, sid)
    except sqlite3.DatabaseError:
        pass  # the index is damaged too (or has another name): lost records go unnamed
    copied: dict[str, list[tuple]] = {}
    failed: dict[str, int] = {}
    for table in tables:
        cols = _columns(source, table)
        rows, failed[table] = _rows(source, table, ", ".join(cols), len(named) if table == records else 0)
        copied[table] = rows
        marks = ", ".join("?" * len(cols))
        if table != records and table != CACHE_TABLE:
            dest.executemany(f"INSERT OR IGNORE INTO {table} ({', '.join(cols)}) VALUES ({marks})", rows)
    # A record whose large result lived in a Cache row that is lost is lost too.
    rcols = _columns(source, records)
    cache_keys: set[str] = set()
    if CACHE_TABLE in copied:
        ccols = _columns(source, CACHE_TABLE)
        dest.executemany(f"INSERT INTO {CACHE_TABLE} ({', '.join(ccols)}) VALUES ({', '.join('?' * len(ccols))})",
                         copied[CACHE_TABLE])
        key_at = ccols.index("key")
        cache_keys = {row[key_at] for row in copied[CACHE_TABLE]}
        damage.results_lost = max(0, failed.get(CACHE_TABLE, 0))
    k, ok = rcols.index("key"), rcols.index("ok")
    mode = rcols.index("mode") if "mode" in rcols else None
    kept = []
    for row in copied.get(records, []):
        if row[ok] == 1 and (mode is None or row[mode] is None) and row[k] not in cache_keys:
            continue  # its result is gone with a damaged Cache row
        kept.append(row)
    dest.executemany(f"INSERT INTO {records} ({', '.join(rcols)}) VALUES ({', '.join('?' * len(rcols))})", kept)
    kept_keys = {row[k] for row in kept}
    damage.kept = len(kept)
    damage.lost = sorted(named[key] for key in set(named) - kept_keys)
    read_keys = {row[k] for row in copied.get(records, [])}
    failed_rows = failed.get(records, 0)
    damage.lost_unnamed = -1 if failed_rows < 0 else max(0, failed_rows - len(set(named) - read_keys))
    for kind, _name, sql in schema:
        if kind == "trigger":
            dest.execute(sql)
    dest.execute("COMMIT")
    return damage


def repair_file(directory: Path, db_name: str, problem: str, records: str) -> Damage:
    """For the lock holder: salvage into a new file, keep the damaged one aside, swap them."""
    db = directory / db_name
    stamp = time.strftime("%Y%m%d-%H%M%S")
    fresh = directory / f".{db_name}.salvage"
    for leftover in (fresh, fresh.with_name(fresh.name + "-journal")):
        leftover.unlink(missing_ok=True)
    source, _ = open_for_reading(db)
    dest = sqlite3.connect(fresh, isolation_level=None)
    try:
        damage = salvage(source, dest, problem, records)
    finally:
        source.close()
        dest.close()
    aside = directory / f"{db_name}.damaged-{stamp}"
    for suffix in ("-wal", "-shm"):
        companion = directory / f"{db_name}{suffix}"
        if companion.exists():
            os.replace(companion, directory / f"{aside.name}{suffix}")
    os.replace(db, aside)
    os.replace(fresh, db)
    damage.aside = aside
    return damage


def in_memory(source: sqlite3.Connection, problem: str, records: str) -> tuple[sqlite3.Connection, Damage]:
    """For a read-only command: the intact records, copied into memory (the file is not touched)."""
    dest = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    damage = salvage(source, dest, problem, records)
    return dest, damage

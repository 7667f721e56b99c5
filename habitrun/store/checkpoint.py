"""The checkpoint store: per (stage, cache key) a stored success with its result, or a failure.

One SQLite file, opened by diskcache, holds a ``habitrun_record`` row per
(stage, cache key): its state (stage, subject, ok, attempts, error, log
path...) and, for a success, its result as diskcache's ``Disk`` serialises
it (mode and value). A result too large to sit in a row (diskcache's
``min_file_size``, 32 KB) goes where diskcache puts it: a row of its
``Cache`` table and a file beside the database. Bulk questions such as
"which of these 100,000 keys are done" are one SQL query over an index, a
record and its result are one row written in one statement, and a reader
never sees a result without its record or the reverse.

Store format 1 kept every result in the ``Cache`` table and indexed records
twice; format 2 keeps small results in the record and one index. A format-1
store is upgraded in place when it is opened (two columns added, the index
rebuilt, no result moved): its results stay readable where they are.

Format 3 adds, per record, the checksum of its result (``digest``, see
:mod:`habitrun.store.integrity`; verified on every read, and by planning) and
the first absolute path outside the study its result names (``outside``);
paths under the study are stored relative (:mod:`habitrun.store.relpaths`).
A table ``habitrun_changed`` lists, filled by a trigger, every key whose
stored result was replaced by a *different* one: what the planner needs to
make downstream results of the old value stale. Records written before
format 3 have no checksum and stay valid.

Read-only commands open the store with SQLite's ``mode=ro`` and never write
it, whatever its format: an older format is read through temporary views
that give the missing columns as NULL.

Durability: diskcache runs SQLite in WAL mode with ``synchronous=NORMAL``;
a transaction that committed is in the log, so a process killed right after
:meth:`CheckpointStore.put` returned loses nothing.
"""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import diskcache

from habitrun.errors import StoreError
from habitrun.store.damage import Damage
from habitrun.store.guard import (
    META_TABLE,
    STORE_VERSION,
    StoreDirState,
    inspect_store_dir,
)
from habitrun.store.integrity import (
    ResultUnreadable,
    data_digest,
    decode_file,
    decode_row,
    read_file,
    row_digest,
    spilled_file_suspect,
)
from habitrun.store.jsontext import compact
from habitrun.store.relpaths import Relativizer, set_reader_roots
from habitrun.store.schema import (
    CHANGED as _CHANGED,
)
from habitrun.store.schema import (
    RECORDS as _RECORDS,
)
from habitrun.store.schema import (
    SCHEMA,
    check_and_repair,
    mark_new_store,
    open_read_only,
    read_version,
    upgrade,
)
from habitrun.store.trace import TRACE_INSERT, TRACE_SCHEMA, read_trace

# A success replaces anything; a failure never replaces a stored success for the same key
# (the key says the inputs are identical, so the stored result is still valid).
_UPSERT = (
    f"INSERT INTO {_RECORDS} (key, stage, subject_id, ok, attempts, error, kind, log_path, run_id,"
    " components, duration, written_at, mode, value, digest, outside) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
    " ON CONFLICT(key) DO UPDATE SET stage=excluded.stage, subject_id=excluded.subject_id,"
    " ok=excluded.ok, attempts=excluded.attempts, error=excluded.error, kind=excluded.kind,"
    " log_path=excluded.log_path, run_id=excluded.run_id, components=excluded.components,"
    " duration=excluded.duration, written_at=excluded.written_at, mode=excluded.mode, value=excluded.value,"
    " digest=excluded.digest, outside=excluded.outside"
    f" WHERE excluded.ok = 1 OR {_RECORDS}.ok = 0"
)

_STATE_COLUMNS = "key, stage, subject_id, ok, attempts, error, kind, log_path, run_id"
_KEYS_PARAM = "(SELECT value FROM json_each(?))"  # one query for any number of keys
_SEP = "\x1f"  # joins keys in bulk reads; put() refuses keys containing it


@dataclass(slots=True)  # slots: one per subject on the recorder's path
class Record:
    """What the engine reports for one subject of one stage."""

    stage: str
    key: str
    subject_id: str
    ok: bool
    result: Any = None
    error: str | None = None
    kind: str | None = None
    attempts: int = 1
    # What went into the key, for `plan --reason`: a dict, or the same already as compact JSON.
    components: dict | str = field(default_factory=dict)
    run_id: str | None = None
    log_path: str | None = None
    duration_sec: float = 0.0


@dataclass(frozen=True)
class StoredState:
    """A stored record without its result."""

    key: str
    stage: str
    subject_id: str
    ok: bool
    attempts: int
    error: str | None
    kind: str | None
    log_path: str | None
    run_id: str | None


class UnstorableResult(StoreError):
    """A successful subject's result cannot be pickled; nothing of its batch was written."""

    def __init__(self, record: Record, reason: str) -> None:
        super().__init__(
            f"stage {record.stage!r}, subject {record.subject_id!r}: its result cannot be stored "
            f"({reason}); return numbers, strings, paths, lists or dicts of them"
        )
        self.record = record


class UnreadableResults(StoreError):
    """Stored results that fail their checksum (or whose file is gone): stale, never passed on."""

    def __init__(self, directory: Path, bad: list[tuple[str, str, str, str]]) -> None:
        shown = "; ".join(f"stage {stage!r}, subject {sid!r}: {why}" for stage, sid, _key, why in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        super().__init__(
            f"stored result unreadable in {directory}: {shown}{more}. "
            "`habitrun plan` shows them as stale; `habitrun run` recomputes them"
        )
        self.bad = bad


class StoreNotFound(StoreError):
    """``open(create=False)`` found no store."""


def _state(row: tuple) -> StoredState:
    key, stage, sid, ok, attempts, error, kind, log_path, run_id = row
    return StoredState(key, stage, sid, bool(ok), attempts, error, kind, log_path, run_id)


class CheckpointStore:
    """A habitrun checkpoint store in one folder (see the module docstring)."""

    def __init__(self, directory: Path, con: sqlite3.Connection, cache: diskcache.Cache | None = None) -> None:
        self.directory = directory
        self._cache = cache  # None: opened read-only (no diskcache, which writes on opening)
        self._ro_con = con if cache is None else None
        self._dir = str(directory)
        self.read_only = cache is None
        self._relativize: Relativizer | None = None
        self.damage: Damage | None = None  # set when the file was found damaged (see habitrun.store.damage)
        self.verify_rows = False  # planning checks in-row results too (see unreadable())
        self.format_version = read_version(con)  # as stored (a read-only store is not upgraded)
        # Whether diskcache's own table may hold results (large ones, or a format-1 store's):
        # while it holds none, storing small results never needs to look there. Only the
        # lock holder writes, through one instance, so the writer's flag stays true.
        self._cache_used = con.execute("SELECT 1 FROM Cache LIMIT 1").fetchone() is not None

    @property
    def _con(self) -> sqlite3.Connection:
        # diskcache keeps one connection per thread (the recorder writes from its own)
        return self._ro_con if self._cache is None else self._cache._con

    def set_roots(self, run_root: Path, study_root: Path) -> None:
        """The study's folders: paths under them in results are stored relative, and resolved
        against them when read (see :mod:`habitrun.store.relpaths`)."""
        run_root, study_root = os.path.abspath(run_root), os.path.abspath(study_root)
        self._relativize = Relativizer([("run", run_root), ("study", study_root)])
        set_reader_roots({"run": run_root, "study": study_root})

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def exists(cls, directory: Path) -> bool:
        """True when ``directory`` holds a habitrun store (StoreError when it holds something else)."""
        return inspect_store_dir(Path(directory)) is StoreDirState.HABITRUN

    @classmethod
    def open(cls, directory: Path, *, create: bool = True, read_only: bool = False) -> CheckpointStore:
        """Open (or create) the store; refuse, untouched, a folder holding anything else.

        ``read_only``: for commands that only read (`plan`, `status`): SQLite's read-only
        mode, no schema statement, no upgrade; the database file is not changed.
        """
        directory = Path(directory)
        state = inspect_store_dir(directory)
        if state is not StoreDirState.HABITRUN and (not create or read_only):
            raise StoreNotFound(f"no checkpoint store at {directory} yet (nothing has run)")
        if read_only:
            con, damage = open_read_only(directory)
            store = cls(directory, con)
            store.damage = damage
            return store
        damage = None
        if state is StoreDirState.HABITRUN:
            damage = check_and_repair(directory)
        else:
            mark_new_store(directory)
        try:
            cache = diskcache.Cache(
                str(directory),
                timeout=60,
                eviction_policy="none",  # results are records, never evicted
                cull_limit=0,
                statistics=0,
                tag_index=0,
                size_limit=2**62,
            )
        except (OSError, diskcache.Timeout) as exc:
            raise StoreError(f"cannot open the checkpoint store at {directory}: {exc}") from None
        except Exception as exc:  # sqlite3.DatabaseError after the read-only check: a race or damage
            raise StoreError(f"cannot open the checkpoint store at {directory}: {exc}") from None
        try:
            store = cls(directory, cache._con, cache)
            with store._transaction() as con:
                # The trace table is additive (store/trace.py): made by writers only.
                for statement in SCHEMA + TRACE_SCHEMA:
                    con.execute(statement)
                upgrade(con)
        except BaseException:
            cache.close()
            raise
        store.damage = damage
        store.format_version = STORE_VERSION
        return store

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
        else:
            self._ro_con.close()

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _writer(self) -> diskcache.Cache:
        if self._cache is None:
            raise StoreError(f"the checkpoint store at {self.directory} was opened read-only")
        return self._cache

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        # diskcache's transaction and ours are one: BEGIN IMMEDIATE on its connection.
        with self._writer().transact(retry=True):
            yield self._con

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        return self._con.execute(sql, params).fetchall()

    # -- writing -----------------------------------------------------------------------------
    def put(self, records: Sequence[Record], trace: Sequence[tuple] = ()) -> None:
        """Store a batch, and its trace rows (store/trace.py), in one transaction: all or none.

        A success's result is serialised by diskcache's ``Disk`` (so it reads back the way
        diskcache reads its own values). A small one goes into the record's own row, one
        ``executemany`` for the whole batch; a large one goes where diskcache puts it (a
        ``Cache`` row and a file). Storing is then a few tens of microseconds a subject.
        """
        if not records:
            if trace:
                with self._transaction() as con:
                    con.executemany(TRACE_INSERT, trace)
            return
        now = time.time()
        disk = self._writer().disk
        relativize = self._relativize
        spilled: dict[str, tuple] = {}  # key -> (size, mode, filename, value) of results kept in files
        rows = []
        try:
            for rec in records:
                if _SEP in rec.key:
                    raise StoreError(f"cache key {rec.key!r} contains the reserved character \\x1f")
                mode = value = digest = outside = None
                if rec.ok:
                    result = rec.result
                    if relativize is not None:
                        result = relativize(result)
                        outside = relativize.outside
                    try:
                        stored = disk.store(result, False, key=rec.key)
                    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
                        raise UnstorableResult(rec, f"{type(exc).__name__}: {exc}") from None
                    replaced = spilled.pop(rec.key, None)  # the same key twice in one batch
                    if replaced is not None:
                        disk.remove(replaced[2])
                    if stored[2] is None:
                        mode, value = stored[1], stored[3]
                        digest = row_digest(mode, value)
                    else:
                        spilled[rec.key] = stored
                        digest = data_digest(stored[1], read_file(self._dir, stored[2]))
                components = rec.components
                rows.append(
                    (
                        rec.key,
                        rec.stage,
                        rec.subject_id,
                        1 if rec.ok else 0,
                        int(rec.attempts),
                        None if rec.ok else rec.error,
                        None if rec.ok else rec.kind,
                        rec.log_path,
                        rec.run_id,
                        components if components.__class__ is str else compact(components),
                        float(rec.duration_sec),
                        now,
                        mode,
                        value,
                        digest,
                        outside,
                    )
                )
            with self._cache._transact(retry=True) as (sql, remove_after_commit):
                self._put_spilled(sql, rows, spilled, now, remove_after_commit)
                self._con.executemany(_UPSERT, rows)
                if trace:
                    self._con.executemany(TRACE_INSERT, trace)
        except BaseException:
            for stored in spilled.values():  # files of a batch that was not written
                disk.remove(stored[2])
            raise

    def _put_spilled(self, sql: Any, rows: list[tuple], spilled: dict[str, tuple], now: float,
                     remove_after_commit: Any) -> None:
        """Keep diskcache's ``Cache`` table in step: large results in, replaced ones out.

        Every success replaces whatever ``Cache`` held for its key (a large result of an
        earlier run, or any result of a format-1 store); diskcache's triggers keep its count
        and size, and a replaced file is removed once the transaction has committed.
        """
        if not self._cache_used and not spilled:
            return
        self._cache_used = True
        successes = [row[0] for row in rows if row[3]]  # the keys of this batch's successes
        con = self._con
        gone = []
        for rowid, filename in sql(
            f"SELECT rowid, filename FROM Cache WHERE raw = 1 AND key IN {_KEYS_PARAM}",
            (json.dumps(successes),),
        ):
            remove_after_commit(filename)
            gone.append((rowid,))
        if gone:
            con.executemany("DELETE FROM Cache WHERE rowid = ?", gone)
        if spilled:
            con.executemany(
                "INSERT INTO Cache (key, raw, store_time, expire_time, access_time, access_count, tag,"
                " size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, ?, ?, ?, ?)",
                [(key, now, now, size, mode, filename, value) for key, (size, mode, filename, value) in spilled.items()],
            )

    def defer_checkpoints(self) -> bool:
        """Stop this thread's commits from copying the write-ahead log into the database.

        SQLite does that copy (with two fsyncs: tens of milliseconds here) inside whichever
        commit passes a thousand pages of log, so one batch now and then, and the flush at
        the end of a stage, would wait for it. The caller runs :meth:`checkpoint` instead,
        when nothing waits on it. False when SQLite refused (commits then copy as before).
        """
        try:
            self._con.execute("PRAGMA wal_autocheckpoint = 0")
        except sqlite3.Error:
            return False
        return True

    def checkpoint(self) -> bool:
        """Copy the write-ahead log into the database without blocking readers or writers.

        False when it could not (SQLite then copies it when the store is closed): committed
        records are safe in the log either way, so this is never worth failing a run over.
        """
        try:
            self._con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            return False
        return True

    def discard(self, keys: Iterable[str]) -> int:
        """Forget these keys (results and records); returns how many records went."""
        keys = list(keys)
        if not keys:
            return 0
        with self._transaction() as con:
            present = [
                r[0]
                for r in con.execute(
                    f"SELECT key FROM {_RECORDS} WHERE key IN {_KEYS_PARAM}", (json.dumps(keys),)
                )
            ]
            for key in present:
                self._cache.delete(key, retry=True)
            con.execute(f"DELETE FROM {_RECORDS} WHERE key IN {_KEYS_PARAM}", (json.dumps(present),))
            con.execute(f"DELETE FROM {_CHANGED} WHERE key IN {_KEYS_PARAM}", (json.dumps(present),))
        return len(present)

    def adopt(self, moves: Sequence[tuple[str, str, str]]) -> int:
        """Move records, with their results, from old keys to new ones: (old, new, components JSON).

        The planner finds a result stored under the key an older habitrun computed for the same
        inputs; moving it to today's key keeps it (nothing reruns because the key format changed).
        """
        if not moves:
            return 0
        moved = 0
        try:
            with self._transaction() as con:
                for old, new, components in moves:
                    cur = con.execute(
                        f"UPDATE OR REPLACE {_RECORDS} SET key = ?, components = ? WHERE key = ?",
                        (new, components, old),
                    )
                    moved += cur.rowcount
                    if self._cache_used:
                        con.execute("UPDATE OR REPLACE Cache SET key = ? WHERE key = ? AND raw = 1", (new, old))
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot move {len(moves)} stored result(s) to today's keys in {self.directory} ({exc}); "
                "nothing was changed, and `habitrun plan` still counts them done"
            ) from None
        return moved

    def stage_packages(self, stage: str, *, prefix: str = "", key: str | None = None) -> list[dict]:
        """The distinct package versions kept with the stage's successes under one key, or under
        every key starting with ``prefix`` (one scan of the stage's range)."""
        if key is not None:
            where, params = "stage = ? AND key = ?", (stage, key)
        else:
            upper = prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\U0010ffff"
            where, params = "stage = ? AND key >= ? AND key < ?", (stage, prefix, upper)
        try:
            rows = self._query(
                f"SELECT DISTINCT json_extract(components, '$.packages') FROM {_RECORDS} WHERE {where} AND ok = 1",
                params,
            )
        except sqlite3.Error:
            return []
        out = []
        for (text,) in rows:
            try:
                value = json.loads(text) if text else None
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
        return out

    def meta(self, name: str) -> str | None:
        """A value habitrun keeps about the store (see :meth:`set_meta`)."""
        rows = self._query(f"SELECT value FROM {META_TABLE} WHERE name = ?", (name,))
        return rows[0][0] if rows else None

    def set_meta(self, name: str, value: str) -> None:
        """Keep a small named value (e.g. the package versions a stage last ran with)."""
        with self._transaction() as con:
            con.execute(f"INSERT OR REPLACE INTO {META_TABLE} VALUES (?, ?)", (name, value))

    # -- reading -----------------------------------------------------------------------------
    def states(self, keys: Iterable[str]) -> dict[str, StoredState]:
        """States of the given keys that are stored (one query)."""
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return {}
        rows = self._query(
            f"SELECT {_STATE_COLUMNS} FROM {_RECORDS} WHERE key IN {_KEYS_PARAM}",
            (json.dumps(keys),),
        )
        return {row[0]: _state(row) for row in rows}

    def stage_outcomes(self, stage: str, prefix: str = "") -> tuple[set[str], set[str]]:
        """(done, failed) keys of ``stage``: the planner's fast path.

        With ``prefix``, only keys starting with it, returned without it (the planner asks
        for one map stage version's subject parts). One scan of the stage's range of a
        covering index, the keys joined in SQL and split in Python: well under a microsecond
        a key, where a row object per key costs ten times that.
        """
        # One scan of the stage's index range, both lists built in SQL (no sort by ok).
        if prefix:
            upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
            part, params = "substr(key, ?)", (len(prefix) + 1, len(prefix) + 1, stage, prefix, upper)
            where = "stage = ? AND key >= ? AND key < ?"
        else:
            part, params, where = "key", (stage,), "stage = ?"
        ((done_joined, failed_joined),) = self._query(
            f"SELECT group_concat(CASE WHEN ok = 1 THEN {part} END, char(31)),"
            f" group_concat(CASE WHEN ok = 0 THEN {part} END, char(31)) FROM {_RECORDS} WHERE {where}",
            params,
        )
        done = set(done_joined.split(_SEP)) if done_joined else set()
        failed = set(failed_joined.split(_SEP)) if failed_joined else set()
        return done, failed

    def results(self, keys: Iterable[str]) -> dict[str, Any]:
        """Results of the stored successes among ``keys``, each checked against its checksum.

        Raises :class:`UnreadableResults` (naming stage and subject) when any does not match.
        """
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return {}
        wanted = json.dumps(keys)
        rows = self._query(
            f"SELECT key, mode, NULL, value, digest, stage, subject_id FROM {_RECORDS}"
            f" WHERE key IN {_KEYS_PARAM} AND ok = 1 AND mode IS NOT NULL",
            (wanted,),
        )
        if len(rows) < len(keys):  # the rest may be large ones, in diskcache's table (or failures)
            rows += self._query(
                f"SELECT c.key, c.mode, c.filename, c.value, r.digest, r.stage, r.subject_id FROM Cache c"
                f" LEFT JOIN {_RECORDS} r ON r.key = c.key WHERE c.raw = 1 AND c.key IN {_KEYS_PARAM}"
                f" AND c.key NOT IN (SELECT key FROM {_RECORDS} WHERE key IN {_KEYS_PARAM} AND mode IS NOT NULL)",
                (wanted, wanted),
            )
        out: dict[str, Any] = {}
        bad: list[tuple[str, str, str, str]] = []
        for key, mode, filename, value, digest, stage, sid in rows:
            try:
                if filename is None:
                    if digest is not None and row_digest(mode, value) != digest:
                        raise ResultUnreadable("checksum mismatch")
                    out[key] = decode_row(mode, value)
                else:
                    data = read_file(self._dir, filename)
                    if digest is not None and data_digest(mode, data) != digest:
                        raise ResultUnreadable("checksum mismatch")
                    out[key] = decode_file(mode, data)
            except FileNotFoundError:
                bad.append((stage or "?", sid or "?", key, "its file is missing"))
            except ResultUnreadable as exc:
                bad.append((stage or "?", sid or "?", key, str(exc)))
            except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError,
                    TypeError, IndexError) as exc:
                bad.append((stage or "?", sid or "?", key, f"{type(exc).__name__}: {exc}"))
        if bad:
            raise UnreadableResults(self.directory, bad)
        return out

    def trace(self, *, run_id: str | None = None, stage: str | None = None,
              keys: Iterable[str] | None = None) -> list[tuple]:
        """Trace rows (columns: store.trace.TRACE_COLUMNS), oldest first; ``keys``: only those keys'."""
        wanted = None if keys is None else json.dumps(keys if isinstance(keys, list) else list(keys))
        return read_trace(self._con, run_id=run_id, stage=stage, keys=wanted)

    def durations(self, keys: Iterable[str]) -> dict[str, float]:
        """key -> stored duration of the record (seconds) for the stored ones among ``keys``."""
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return {}
        rows = self._query(f"SELECT key, duration FROM {_RECORDS} WHERE key IN {_KEYS_PARAM}", (json.dumps(keys),))
        return {key: duration for key, duration in rows}

    def unreadable(self, stage: str, prefix: str = "") -> dict[str, str]:
        """Stored successes of ``stage`` whose result fails its check: key (without ``prefix``) -> why.

        What planning asks so that a damaged result is stale, not passed on. A large
        result's file is looked at by its stat (missing, resized, or modified after it was
        stored), and then read in full. Results in a record's row are checked against their
        checksum only when ``verify_rows`` is set (`plan --verify`, `status --verify`): that
        reads every row of the stage, a few microseconds a subject, where planning otherwise
        reads an index. Reading a result (:meth:`results`) always checks it in full, and the
        engine recomputes one that fails before anything downstream receives it.
        """
        cut = len(prefix)
        bad: dict[str, str] = {}
        where, params = ("stage = ? AND ok = 1", (stage,))
        if prefix:
            upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
            where, params = "stage = ? AND ok = 1 AND key >= ? AND key < ?", (stage, prefix, upper)
        digest_of = row_digest
        for key, mode, value, digest in self._query(
            f"SELECT key, mode, value, digest FROM {_RECORDS} WHERE {where} AND digest IS NOT NULL"
            " AND mode IS NOT NULL", params,
        ) if self.verify_rows else ():
            try:
                if digest_of(mode, value) != digest:
                    bad[key[cut:]] = "checksum mismatch"
            except (TypeError, ValueError):
                bad[key[cut:]] = "checksum mismatch"
        if self._cache_used:
            for key, mode, filename, size, stored_at, digest in self._query(
                f"SELECT c.key, c.mode, c.filename, c.size, c.store_time, r.digest FROM Cache c"
                f" JOIN {_RECORDS} r ON r.key = c.key WHERE r.{where.replace(' AND ', ' AND r.')}"
                " AND r.mode IS NULL AND c.filename IS NOT NULL", params,
            ):
                why = spilled_file_suspect(self._dir, filename, size, stored_at)
                if why == "changed" and digest is not None:
                    try:
                        data = read_file(self._dir, filename)
                    except OSError:
                        why = "its file cannot be read"
                    else:
                        why = None if data_digest(mode, data) == digest else "checksum mismatch"
                elif why == "changed":
                    why = None  # stored before checksums: nothing to compare with
                if why:
                    bad[key[cut:]] = why
        return bad

    def lost(self, stage: str) -> set[str]:
        """Subjects of ``stage`` whose record was unreadable in a damaged store file."""
        if self.damage is None:
            return set()
        return {sid for st, sid in self.damage.lost if st == stage}

    def changed(self, stage: str) -> dict[str, tuple[str, float]]:
        """Keys of ``stage`` whose result was replaced by a different one: key -> (subject, when)."""
        return {key: (sid, at) for key, sid, at in self._query(
            f"SELECT key, subject_id, changed_at FROM {_CHANGED} WHERE stage = ?", (stage,))}

    def written_at(self, keys: Iterable[str]) -> dict[str, float]:
        """When the stored records of ``keys`` were written (key -> time)."""
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return {}
        return dict(self._query(
            f"SELECT key, written_at FROM {_RECORDS} WHERE key IN {_KEYS_PARAM}", (json.dumps(keys),)
        ))

    def outside_paths(self, stage: str) -> tuple[int, str | None]:
        """How many stored results of ``stage`` name absolute paths outside the study, and one."""
        if self.format_version < 3:
            return 0, None  # not recorded before format 3
        ((count, example),) = self._query(
            f"SELECT count(*), min(outside) FROM {_RECORDS} WHERE stage = ? AND outside IS NOT NULL", (stage,)
        )
        return count, example

    def latest(self, stage: str) -> dict[str, tuple[str, dict]]:
        """subject_id -> (key, components) of the newest record of each subject in ``stage``."""
        rows = self._query(
            f"SELECT subject_id, key, components, max(written_at) FROM {_RECORDS}"
            " WHERE stage = ? GROUP BY subject_id",
            (stage,),
        )
        return {sid: (key, json.loads(comp) if comp else {}) for sid, key, comp, _ in rows}

    def failures(self, stage: str | None = None) -> list[StoredState]:
        """Stored failures (of one stage, or all), oldest first."""
        where, params = ("ok = 0 AND stage = ?", (stage,)) if stage else ("ok = 0", ())
        rows = self._query(
            f"SELECT {_STATE_COLUMNS} FROM {_RECORDS} WHERE {where} ORDER BY written_at, rowid",
            params,
        )
        return [_state(row) for row in rows]

    def stage_keys(self, stage: str) -> list[str]:
        """Every stored key of ``stage`` (current or from older versions of the stage)."""
        return [r[0] for r in self._query(f"SELECT key FROM {_RECORDS} WHERE stage = ?", (stage,))]

    def entries(self) -> list[tuple[str, str, str, int]]:
        """Every record as (key, stage, subject, bytes its result takes): what `gc` weighs."""
        return self._query(
            f"SELECT r.key, r.stage, r.subject_id, coalesce(length(r.value), 0) + coalesce(c.size, 0)"
            f" + coalesce(length(c.value), 0) FROM {_RECORDS} r LEFT JOIN Cache c ON c.key = r.key AND c.raw = 1"
        )

    def count(self, stage: str | None = None) -> int:
        """How many records are stored (in one stage, or in all)."""
        if stage is None:
            return self._query(f"SELECT count(*) FROM {_RECORDS}")[0][0]
        return self._query(f"SELECT count(*) FROM {_RECORDS} WHERE stage = ?", (stage,))[0][0]

    # -- which recipe wrote it ---------------------------------------------------------------
    def recipe_info(self) -> tuple[str, str] | None:
        """(name, sha256) of the recipe that last wrote the store, if recorded."""
        meta = dict(self._query(f"SELECT name, value FROM {META_TABLE}"))
        if "recipe_name" not in meta:
            return None
        return meta["recipe_name"], meta.get("recipe_sha256", "")

    def check_recipe(self, name: str, sha256: str, *, strict: bool) -> str | None:
        """Remember the recipe writing the store; warn (or, strict, refuse) when another wrote it."""
        previous = self.recipe_info()
        message = None
        if previous is not None and previous != (name, sha256):
            old_name, old_sha = previous
            if old_name != name:
                what = f"by another recipe, {old_name!r} (this one is {name!r})"
            else:
                what = f"by another version of recipe {name!r} (sha256 {old_sha[:12]}, now {sha256[:12]})"
            message = f"the checkpoint store at {self.directory} was last written {what}"
            if strict:
                raise StoreError(
                    message + "; policy.strict_checkpoint_hash is on, so it is not used. "
                    "Turn it off to reuse the store (changed stages rerun anyway), "
                    "or set policy.checkpoint_dir to a new folder."
                )
            message += "; stored results whose inputs did not change are reused"
        if previous != (name, sha256):
            with self._transaction() as con:
                con.executemany(
                    f"INSERT OR REPLACE INTO {META_TABLE} VALUES (?, ?)",
                    (("recipe_name", name), ("recipe_sha256", sha256)),
                )
        return message

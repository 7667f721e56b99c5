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

Durability: diskcache runs SQLite in WAL mode with ``synchronous=NORMAL``;
a transaction that committed is in the log, so a process killed right after
:meth:`CheckpointStore.put` returned loses nothing.
"""

from __future__ import annotations

import json
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
from habitrun.store.guard import (
    DB_NAME,
    META_TABLE,
    STORE_FORMAT,
    STORE_VERSION,
    StoreDirState,
    inspect_store_dir,
)
from habitrun.store.jsontext import compact
from habitrun.store.trace import TRACE_INSERT, TRACE_SCHEMA, read_trace

_RECORDS = "habitrun_record"

_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {META_TABLE} (name TEXT PRIMARY KEY, value TEXT)",
    f"CREATE TABLE IF NOT EXISTS {_RECORDS} ("
    " key TEXT PRIMARY KEY, stage TEXT NOT NULL, subject_id TEXT NOT NULL, ok INTEGER NOT NULL,"
    " attempts INTEGER NOT NULL, error TEXT, kind TEXT, log_path TEXT, run_id TEXT,"
    " components TEXT, duration REAL, written_at REAL NOT NULL, mode INTEGER, value BLOB)",
    # One index serves every question by stage: a subject's latest record, and (covering ok
    # and key) which keys of a stage are done or failed. Its entries go in subject order,
    # mostly next to each other; a second index ordered by the (random) key would cost a
    # page written per record per commit.
    f"CREATE INDEX IF NOT EXISTS {_RECORDS}_stage ON {_RECORDS} (stage, subject_id, written_at, ok, key)",
    f"INSERT OR IGNORE INTO {META_TABLE} VALUES ('format', '{STORE_FORMAT}')",
    f"INSERT OR IGNORE INTO {META_TABLE} VALUES ('version', '{STORE_VERSION}')",
)
# Format 1 -> 2: a success's result may sit in its record (mode and value as diskcache's Disk writes them).
_UPGRADE_FROM_1 = (
    f"ALTER TABLE {_RECORDS} ADD COLUMN mode INTEGER",
    f"ALTER TABLE {_RECORDS} ADD COLUMN value BLOB",
    f"DROP INDEX IF EXISTS {_RECORDS}_subject",  # both replaced by {_RECORDS}_stage
    f"DROP INDEX IF EXISTS {_RECORDS}_outcome",
)

# A success replaces anything; a failure never replaces a stored success for the same key
# (the key says the inputs are identical, so the stored result is still valid).
_UPSERT = (
    f"INSERT INTO {_RECORDS} (key, stage, subject_id, ok, attempts, error, kind, log_path, run_id,"
    " components, duration, written_at, mode, value) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
    " ON CONFLICT(key) DO UPDATE SET stage=excluded.stage, subject_id=excluded.subject_id,"
    " ok=excluded.ok, attempts=excluded.attempts, error=excluded.error, kind=excluded.kind,"
    " log_path=excluded.log_path, run_id=excluded.run_id, components=excluded.components,"
    " duration=excluded.duration, written_at=excluded.written_at, mode=excluded.mode, value=excluded.value"
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


class StoreNotFound(StoreError):
    """``open(create=False)`` found no store."""


def _state(row: tuple) -> StoredState:
    key, stage, sid, ok, attempts, error, kind, log_path, run_id = row
    return StoredState(key, stage, sid, bool(ok), attempts, error, kind, log_path, run_id)


def _upgrade(con: Any) -> None:
    """Bring an older store to this format, inside the opening transaction (all or nothing)."""
    (version,) = con.execute(f"SELECT value FROM {META_TABLE} WHERE name = 'version'").fetchone()
    if int(version) == 1:
        for statement in _UPGRADE_FROM_1:
            con.execute(statement)
        con.execute(f"UPDATE {META_TABLE} SET value = ? WHERE name = 'version'", (str(STORE_VERSION),))


def _mark_new_store(directory: Path) -> None:
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
        for statement in _SCHEMA:
            con.execute(statement)
        con.execute("COMMIT")
    except sqlite3.Error as exc:
        raise StoreError(f"cannot create the checkpoint store at {directory}: {exc}") from None
    finally:
        con.close()


class CheckpointStore:
    """A habitrun checkpoint store in one folder (see the module docstring)."""

    def __init__(self, directory: Path, cache: diskcache.Cache) -> None:
        self.directory = directory
        self._cache = cache
        # Whether diskcache's own table may hold results (large ones, or a format-1 store's):
        # while it holds none, storing small results never needs to look there. Only the
        # lock holder writes, through one instance, so the writer's flag stays true.
        self._cache_used = cache._con.execute("SELECT 1 FROM Cache LIMIT 1").fetchone() is not None

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def exists(cls, directory: Path) -> bool:
        """True when ``directory`` holds a habitrun store (StoreError when it holds something else)."""
        return inspect_store_dir(Path(directory)) is StoreDirState.HABITRUN

    @classmethod
    def open(cls, directory: Path, *, create: bool = True) -> CheckpointStore:
        """Open (or create) the store; refuse, untouched, a folder holding anything else."""
        directory = Path(directory)
        state = inspect_store_dir(directory)
        if state is not StoreDirState.HABITRUN and not create:
            raise StoreNotFound(f"no checkpoint store at {directory} yet (nothing has run)")
        if state is not StoreDirState.HABITRUN:
            _mark_new_store(directory)
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
        store = cls(directory, cache)
        try:
            with store._transaction() as con:
                # The trace table is additive (store/trace.py): made by a writer only, so a
                # reader of an older store adds nothing to it.
                for statement in _SCHEMA + (TRACE_SCHEMA if create else ()):
                    con.execute(statement)
                _upgrade(con)
        except BaseException:
            cache.close()
            raise
        return store

    def close(self) -> None:
        self._cache.close()

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        # diskcache's transaction and ours are one: BEGIN IMMEDIATE on its connection.
        with self._cache.transact(retry=True):
            yield self._cache._con

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        return self._cache._con.execute(sql, params).fetchall()

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
        disk = self._cache.disk
        spilled: dict[str, tuple] = {}  # key -> (size, mode, filename, value) of results kept in files
        rows = []
        try:
            for rec in records:
                if _SEP in rec.key:
                    raise StoreError(f"cache key {rec.key!r} contains the reserved character \\x1f")
                mode = value = None
                if rec.ok:
                    try:
                        stored = disk.store(rec.result, False, key=rec.key)
                    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
                        raise UnstorableResult(rec, f"{type(exc).__name__}: {exc}") from None
                    replaced = spilled.pop(rec.key, None)  # the same key twice in one batch
                    if replaced is not None:
                        disk.remove(replaced[2])
                    if stored[2] is None:
                        mode, value = stored[1], stored[3]
                    else:
                        spilled[rec.key] = stored
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
                    )
                )
            with self._cache._transact(retry=True) as (sql, remove_after_commit):
                self._put_spilled(sql, rows, spilled, now, remove_after_commit)
                self._cache._con.executemany(_UPSERT, rows)
                if trace:
                    self._cache._con.executemany(TRACE_INSERT, trace)
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
        con = self._cache._con
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
            self._cache._con.execute("PRAGMA wal_autocheckpoint = 0")
        except sqlite3.Error:
            return False
        return True

    def checkpoint(self) -> bool:
        """Copy the write-ahead log into the database without blocking readers or writers.

        False when it could not (SQLite then copies it when the store is closed): committed
        records are safe in the log either way, so this is never worth failing a run over.
        """
        try:
            self._cache._con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
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
        return len(present)

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
        """Results of the stored successes among ``keys``."""
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return {}
        wanted = json.dumps(keys)
        rows = self._query(
            f"SELECT key, mode, NULL, value FROM {_RECORDS}"
            f" WHERE key IN {_KEYS_PARAM} AND ok = 1 AND mode IS NOT NULL",
            (wanted,),
        )
        if len(rows) < len(keys):  # the rest may be large ones, in diskcache's table (or failures)
            rows += self._query(
                f"SELECT key, mode, filename, value FROM Cache WHERE raw = 1 AND key IN {_KEYS_PARAM}"
                f" AND key NOT IN (SELECT key FROM {_RECORDS} WHERE key IN {_KEYS_PARAM} AND mode IS NOT NULL)",
                (wanted, wanted),
            )
        fetch = self._cache.disk.fetch
        out: dict[str, Any] = {}
        for key, mode, filename, value in rows:
            try:
                out[key] = fetch(mode, filename, value, False)
            except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
                raise StoreError(
                    f"the stored result for key {key} in {self.directory} cannot be read "
                    f"({type(exc).__name__}: {exc}); `habitrun run` with "
                    "policy.force_rerun_subjects for that subject recomputes it"
                ) from None
        return out

    def trace(self, *, run_id: str | None = None, stage: str | None = None,
              keys: Iterable[str] | None = None) -> list[tuple]:
        """Trace rows (columns: store.trace.TRACE_COLUMNS), oldest first; ``keys``: only those keys'."""
        wanted = None if keys is None else json.dumps(keys if isinstance(keys, list) else list(keys))
        return read_trace(self._cache._con, run_id=run_id, stage=stage, keys=wanted)

    def durations(self, keys: Iterable[str]) -> dict[str, float]:
        """key -> stored duration of the record (seconds) for the stored ones among ``keys``."""
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return {}
        rows = self._query(f"SELECT key, duration FROM {_RECORDS} WHERE key IN {_KEYS_PARAM}", (json.dumps(keys),))
        return {key: duration for key, duration in rows}

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

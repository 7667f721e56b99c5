"""The checkpoint store: per (stage, cache key) a stored success with its result, or a failure.

Results live in a diskcache ``Cache`` (pickling, large values spilled to
files). Beside it, in the same SQLite file and written in the same
transaction, a small ``habitrun_record`` table holds each record's state
(stage, subject, ok, attempts, error, log path...). Bulk questions such as
"which of these 100,000 keys are done" are then one SQL query over an
index instead of 100,000 diskcache lookups, and a reader never sees a
result without its record or the reverse.

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

_RECORDS = "habitrun_record"

_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {META_TABLE} (name TEXT PRIMARY KEY, value TEXT)",
    f"CREATE TABLE IF NOT EXISTS {_RECORDS} ("
    " key TEXT PRIMARY KEY, stage TEXT NOT NULL, subject_id TEXT NOT NULL, ok INTEGER NOT NULL,"
    " attempts INTEGER NOT NULL, error TEXT, kind TEXT, log_path TEXT, run_id TEXT,"
    " components TEXT, duration REAL, written_at REAL NOT NULL)",
    f"CREATE INDEX IF NOT EXISTS {_RECORDS}_subject ON {_RECORDS} (stage, subject_id, written_at)",
    f"CREATE INDEX IF NOT EXISTS {_RECORDS}_outcome ON {_RECORDS} (stage, ok, key)",
    f"INSERT OR IGNORE INTO {META_TABLE} VALUES ('format', '{STORE_FORMAT}')",
    f"INSERT OR IGNORE INTO {META_TABLE} VALUES ('version', '{STORE_VERSION}')",
)

# A success replaces anything; a failure never replaces a stored success for the same key
# (the key says the inputs are identical, so the stored result is still valid).
_UPSERT = (
    f"INSERT INTO {_RECORDS} (key, stage, subject_id, ok, attempts, error, kind, log_path, run_id,"
    " components, duration, written_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
    " ON CONFLICT(key) DO UPDATE SET stage=excluded.stage, subject_id=excluded.subject_id,"
    " ok=excluded.ok, attempts=excluded.attempts, error=excluded.error, kind=excluded.kind,"
    " log_path=excluded.log_path, run_id=excluded.run_id, components=excluded.components,"
    " duration=excluded.duration, written_at=excluded.written_at"
    f" WHERE excluded.ok = 1 OR {_RECORDS}.ok = 0"
)

_STATE_COLUMNS = "key, stage, subject_id, ok, attempts, error, kind, log_path, run_id"
_KEYS_PARAM = "(SELECT value FROM json_each(?))"  # one query for any number of keys
_SEP = "\x1f"  # joins keys in bulk reads; put() refuses keys containing it


@dataclass
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
    components: dict = field(default_factory=dict)  # what went into the key, for `plan --reason`
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
                for statement in _SCHEMA:
                    con.execute(statement)
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
    def put(self, records: Sequence[Record]) -> None:
        """Store a batch in one transaction: all of it or (on an error) none of it.

        Results go into diskcache's own table in its own format (its ``Disk`` pickles
        them and spills large ones to files, so :meth:`results` and diskcache read them
        back), but with one ``executemany`` per batch instead of two statements per
        result: storing is then about a tenth of a subject's dispatch cost.
        """
        if not records:
            return
        now = time.time()
        disk = self._cache.disk
        values: dict[str, tuple] = {}  # key -> (size, mode, filename, value); the last success wins
        rows = []
        try:
            for rec in records:
                if _SEP in rec.key:
                    raise StoreError(f"cache key {rec.key!r} contains the reserved character \\x1f")
                if rec.ok:
                    try:
                        stored = disk.store(rec.result, False, key=rec.key)
                    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
                        raise UnstorableResult(rec, f"{type(exc).__name__}: {exc}") from None
                    replaced = values.get(rec.key)
                    if replaced is not None and replaced[2] is not None:
                        disk.remove(replaced[2])
                    values[rec.key] = stored
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
                        compact(rec.components),
                        float(rec.duration_sec),
                        now,
                    )
                )
            with self._cache._transact(retry=True) as (sql, remove_after_commit):
                self._put_results(sql, values, now, remove_after_commit)
                self._cache._con.executemany(_UPSERT, rows)
        except BaseException:
            for stored in values.values():  # files of a batch that was not written
                if stored[2] is not None:
                    disk.remove(stored[2])
            raise

    def _put_results(self, sql: Any, values: dict[str, tuple], now: float, remove_after_commit: Any) -> None:
        """Insert or replace results in diskcache's ``Cache`` table (its triggers keep its count and size)."""
        if not values:
            return
        existing = {
            key: (rowid, filename)
            for key, rowid, filename in sql(
                f"SELECT key, rowid, filename FROM Cache WHERE raw = 1 AND key IN {_KEYS_PARAM}",
                (json.dumps(list(values)),),
            )
        }
        inserts = []
        updates = []
        for key, (size, mode, filename, value) in values.items():
            old = existing.get(key)
            if old is None:
                inserts.append((key, now, now, size, mode, filename, value))
            else:
                remove_after_commit(old[1])
                updates.append((now, now, size, mode, filename, value, old[0]))
        con = self._cache._con
        if inserts:
            con.executemany(
                "INSERT INTO Cache (key, raw, store_time, expire_time, access_time, access_count, tag,"
                " size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, ?, ?, ?, ?)",
                inserts,
            )
        if updates:
            con.executemany(
                "UPDATE Cache SET store_time = ?, expire_time = NULL, access_time = ?, access_count = 0,"
                " tag = NULL, size = ?, mode = ?, filename = ?, value = ? WHERE rowid = ?",
                updates,
            )

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
        for one map stage version's subject parts). One range scan of a covering index,
        the keys joined in SQL and split in Python: about 0.4 us a key where a row object
        per key costs ten times that.
        """
        done: set[str] = set()
        failed: set[str] = set()
        if prefix:
            upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
            rows = self._query(
                f"SELECT ok, group_concat(substr(key, ?), char(31)) FROM {_RECORDS}"
                " WHERE stage = ? AND key >= ? AND key < ? GROUP BY ok",
                (len(prefix) + 1, stage, prefix, upper),
            )
        else:
            rows = self._query(
                f"SELECT ok, group_concat(key, char(31)) FROM {_RECORDS} WHERE stage = ? GROUP BY ok",
                (stage,),
            )
        for ok, joined in rows:
            (done if ok else failed).update(joined.split(_SEP))
        return done, failed

    def results(self, keys: Iterable[str]) -> dict[str, Any]:
        """Results of the stored successes among ``keys``."""
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return {}
        rows = self._query(
            f"SELECT key, mode, filename, value FROM Cache WHERE raw = 1 AND key IN {_KEYS_PARAM}",
            (json.dumps(keys),),
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

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

This module opens the store and writes it; the rest is one concern a module:
the records table's columns (:mod:`~habitrun.store.records`), the formats
and the steps between them (:mod:`~habitrun.store.migrations`), creating,
reading read-only and salvaging the file (:mod:`~habitrun.store.schema`),
the read queries (:mod:`~habitrun.store.queries`) and what the store uses of
diskcache beyond its public API (:mod:`~habitrun.store.diskcache_adapter`).
"""


from __future__ import annotations

import json
import os
import pickle
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import diskcache

from habitrun.errors import StoreError
from habitrun.store import diskcache_adapter as dc
from habitrun.store.damage import Damage
from habitrun.store.guard import (
    DB_NAME,
    META_TABLE,
    STORE_VERSION,
    StoreDirState,
    inspect_store_dir,
)
from habitrun.store.integrity import data_digest, read_file, row_digest
from habitrun.store.migrations import CHANGED, read_version, upgrade
from habitrun.store.queries import KEYS_PARAM, SEP, StoreQueries, UnreadableResults
from habitrun.store.records import RECORDS, UPSERT, Record, StoredState, row_of
from habitrun.store.relpaths import Relativizer, set_reader_roots
from habitrun.store.schema import SCHEMA, check_and_repair, mark_new_store, open_read_only
from habitrun.store.seal import break_seal, empty_log, write_seal
from habitrun.store.trace import TRACE_INSERT, TRACE_SCHEMA

__all__ = ["CheckpointStore", "Record", "StoreNotFound", "StoredState", "UnreadableResults", "UnstorableResult"]


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


class CheckpointStore(StoreQueries):
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
        self._cache_used = dc.holds_results(con)

    @property
    def _con(self) -> sqlite3.Connection:
        if self._cache is not None:
            return dc.connection(self._cache)
        assert self._ro_con is not None  # opened read-only: no cache, a connection of its own
        return self._ro_con

    def set_roots(self, run_root: Path, study_root: Path, data_roots: Sequence[tuple[str, str]] = ()) -> None:
        """The study's folders, and its declared data roots ((vars name, folder): see
        :mod:`habitrun.spec.roots`): paths under them in results are stored relative, and
        resolved against them when read (see :mod:`habitrun.store.relpaths`)."""
        run, study = os.path.abspath(run_root), os.path.abspath(study_root)
        data = [(f"var:{name}", os.path.abspath(folder)) for name, folder in data_roots]
        self._relativize = Relativizer([("run", run), *data, ("study", study)])
        set_reader_roots({"run": run, "study": study, **dict(data)})

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
            damage = check_and_repair(directory)  # skipped when the seal says it was closed cleanly
        break_seal(directory / DB_NAME)  # before the first byte written (see habitrun.store.seal)
        held = mark_new_store(directory) if state is not StoreDirState.HABITRUN else None
        cache = dc.open_cache(directory, held)
        try:
            store = cls(directory, dc.connection(cache), cache)
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

    def close(self) -> bool:
        """Close; True when a writer left everything committed in the database file itself (the
        write-ahead log emptied): what lets run journals be settled (store/recovery.py)."""
        self.end_prefetch()
        if self._cache is not None:
            # A clean close: the log moved into the file and emptied, then sealed: the next
            # open need not check the file again (see habitrun.store.seal).
            emptied = empty_log(dc.connection(self._cache))
            self._cache.close()
            if emptied:
                write_seal(self.directory / DB_NAME)
            return emptied
        if self._ro_con is not None:
            self._ro_con.close()
        return False

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

    # -- writing -----------------------------------------------------------------------------
    def put(self, records: Sequence[Record], trace: Sequence[tuple] = ()) -> dict[str, int]:
        """Store a batch, and its trace rows (store/trace.py), in one transaction: all or none.

        Returns the size in bytes (pickled, or raw for bytes and text) of each result kept in a
        file, by key: the large ones, which the runner warns about (engine/recorder.py).

        A success's result is serialised by diskcache's ``Disk`` (so it reads back the way
        diskcache reads its own values). A small one goes into the record's own row, one
        ``executemany`` for the whole batch; a large one goes where diskcache puts it (a
        ``Cache`` row and a file). Storing is then a few tens of microseconds a subject.
        """
        if not records:
            if trace:
                with self._transaction() as con:
                    con.executemany(TRACE_INSERT, trace)
            return {}
        now = time.time()
        disk = self._writer().disk
        spilled: dict[str, dc.Stored] = {}  # key -> what Disk.store returned, for results kept in files
        try:
            rows = [self._row(rec, now, disk, spilled) for rec in records]
            with dc.write_transaction(self._cache) as (sql, remove_after_commit):
                # diskcache's Cache table kept in step: every success replaces what it held for
                # its key (a large result of an earlier run, or any result of a format-1 store).
                # While it holds nothing, storing small results never needs to look there.
                if self._cache_used or spilled:
                    self._cache_used = True
                    successes = [rec.key for rec in records if rec.ok]
                    dc.replace_results(self._con, sql, successes, spilled, now, remove_after_commit)
                self._con.executemany(UPSERT, rows)
                if trace:
                    self._con.executemany(TRACE_INSERT, trace)
        except BaseException:
            for stored in spilled.values():  # files of a batch that was not written
                disk.remove(stored[2])
            raise
        return {key: stored[0] for key, stored in spilled.items()}

    def _row(self, rec: Record, now: float, disk: diskcache.Disk, spilled: dict[str, dc.Stored]) -> tuple:
        """The upsert's row of one record; a result too large for the row goes into ``spilled``."""
        if SEP in rec.key:
            raise StoreError(f"cache key {rec.key!r} contains the reserved character \\x1f")
        if not rec.ok:
            return row_of(rec, now, None, None, None, None)
        result, outside = rec.result, None
        relativize = self._relativize
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
        size, mode, filename, value = stored
        if filename is None:
            return row_of(rec, now, mode, value, row_digest(mode, value), outside)
        spilled[rec.key] = stored
        return row_of(rec, now, None, None, data_digest(mode, read_file(self._dir, filename)), outside)

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
                    f"SELECT key FROM {RECORDS} WHERE key IN {KEYS_PARAM}", (json.dumps(keys),)
                )
            ]
            cache = self._writer()
            for key in present:
                cache.delete(key, retry=True)
            con.execute(f"DELETE FROM {RECORDS} WHERE key IN {KEYS_PARAM}", (json.dumps(present),))
            con.execute(f"DELETE FROM {CHANGED} WHERE key IN {KEYS_PARAM}", (json.dumps(present),))
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
                        f"UPDATE OR REPLACE {RECORDS} SET key = ?, components = ? WHERE key = ?",
                        (new, components, old),
                    )
                    moved += cur.rowcount
                    if self._cache_used:
                        dc.move_result(con, old, new)
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot move {len(moves)} stored result(s) to today's keys in {self.directory} ({exc}); "
                "nothing was changed, and `habitrun plan` still counts them done"
            ) from None
        return moved

    def meta(self, name: str) -> str | None:
        """A value habitrun keeps about the store (see :meth:`set_meta`)."""
        rows = self._query(f"SELECT value FROM {META_TABLE} WHERE name = ?", (name,))
        return rows[0][0] if rows else None

    def set_meta(self, name: str, value: str) -> None:
        """Keep a small named value (e.g. the package versions a stage last ran with)."""
        with self._transaction() as con:
            con.execute(f"INSERT OR REPLACE INTO {META_TABLE} VALUES (?, ?)", (name, value))

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

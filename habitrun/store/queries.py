"""The store's read queries: which keys are done or failed, their states, results and history.

A mixin of :class:`~habitrun.store.checkpoint.CheckpointStore`, kept apart from
opening and writing: every method here reads (through ``_query`` on the
store's connection, read-only or not) and none writes.
"""

from __future__ import annotations

import json
import pickle
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

from habitrun.errors import StoreError
from habitrun.store import diskcache_adapter as dc
from habitrun.store.damage import Damage
from habitrun.store.integrity import (
    ResultUnreadable,
    data_digest,
    decode_file,
    decode_row,
    read_file,
    row_digest,
    spilled_file_suspect,
)
from habitrun.store.migrations import CHANGED
from habitrun.store.records import RECORDS, STATE_COLUMNS, StoredState, state_of
from habitrun.store.trace import read_trace

KEYS_PARAM = dc.KEYS_PARAM
SEP = "\x1f"  # joins keys in bulk reads; put() refuses keys containing it


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



def key_range(stage: str, prefix: str, where: str = "stage = ?") -> tuple[str, tuple]:
    """``where`` narrowed to the keys starting with ``prefix`` (a range of the stage's index)."""
    if not prefix:
        return where, (stage,)
    upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    return f"{where} AND key >= ? AND key < ?", (stage, prefix, upper)


class StoreQueries:
    """Read queries over the store's tables (see the module docstring)."""

    directory: Path
    damage: Damage | None
    verify_rows: bool
    format_version: int
    _dir: str
    _cache_used: bool

    @property
    def _con(self) -> sqlite3.Connection:
        raise NotImplementedError

    # (thread, {(stage, prefix): outcome texts}) while outcome texts are read ahead (see prefetch_outcomes)
    _prefetching: tuple[threading.Thread, dict[tuple[str, str], tuple[str | None, str | None]]] | None = None

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        return self._idle_con.execute(sql, params).fetchall()

    @property
    def _idle_con(self) -> sqlite3.Connection:
        """The connection, once a read-ahead thread is done with it: one query at a time."""
        if self._prefetching is not None:
            self._prefetching[0].join()
        return self._con

    def prefetch_outcomes(self, ranges: Sequence[tuple[str, str]]) -> None:
        """Read the :meth:`outcome_texts` of ``ranges`` ((stage, prefix) pairs) in a thread, for
        the planner to take: SQLite scans a million keys a stage (no Python lock held) while
        the planner computes them. Only for a read-only store, whose connection allows it; any
        other query waits for the thread, so the connection serves one at a time."""
        if not ranges or not getattr(self, "read_only", False) or self._prefetching is not None:
            return
        found: dict[tuple[str, str], tuple[str | None, str | None]] = {}

        def scan() -> None:
            for stage, prefix in ranges:
                try:
                    found[(stage, prefix)] = self._outcome_query(stage, prefix)
                except BaseException:  # noqa: BLE001  # the planner asks again and sees the error
                    return

        thread = threading.Thread(target=scan, name="habitrun-outcomes", daemon=True)
        self._prefetching = (thread, found)
        thread.start()

    def end_prefetch(self) -> None:
        """Wait for the outcome texts read ahead, and drop those not taken."""
        if self._prefetching is not None:
            self._prefetching[0].join()
            self._prefetching = None

    def stage_packages(self, stage: str, *, prefix: str = "", key: str | None = None) -> list[dict]:
        """The distinct package versions kept with the stage's successes under one key, or under
        every key starting with ``prefix`` (one scan of the stage's range)."""
        if key is not None:
            where, params = "stage = ? AND key = ?", (stage, key)
        else:
            where, params = key_range(stage, prefix)
        try:
            rows = self._query(
                f"SELECT DISTINCT json_extract(components, '$.packages') FROM {RECORDS} WHERE {where} AND ok = 1",
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

    def states(self, keys: Iterable[str]) -> dict[str, StoredState]:
        """States of the given keys that are stored (one query)."""
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return {}
        rows = self._query(
            f"SELECT {STATE_COLUMNS} FROM {RECORDS} WHERE key IN {KEYS_PARAM}",
            (json.dumps(keys),),
        )
        return {row[0]: state_of(row) for row in rows}

    def written_times(self, keys: Sequence[str]) -> dict[str, float]:
        """key -> when its record was written, for the given keys that are stored (one query):
        what a run journal is compared with (:mod:`habitrun.store.recovery`)."""
        if not keys:
            return {}
        rows = self._query(f"SELECT key, written_at FROM {RECORDS} WHERE key IN {KEYS_PARAM}",
                           (json.dumps(list(keys)),))
        return {key: float(at) for key, at in rows}

    def stage_outcomes(self, stage: str, prefix: str = "") -> tuple[set[str], set[str]]:
        """(done, failed) keys of ``stage``: the planner's fast path.

        With ``prefix``, only keys starting with it, returned without it (the planner asks
        for one map stage version's subject parts). One scan of the stage's range of a
        covering index, the keys joined in SQL and split in Python: well under a microsecond
        a key, where a row object per key costs ten times that.
        """
        done_joined, failed_joined = self.outcome_texts(stage, prefix)
        done = set(done_joined.split(SEP)) if done_joined else set()
        failed = set(failed_joined.split(SEP)) if failed_joined else set()
        return done, failed

    def outcome_texts(self, stage: str, prefix: str = "") -> tuple[str | None, str | None]:
        """The keys of :meth:`stage_outcomes` as SQL joins them (``SEP`` between two), done and
        failed, in the order of the stage's index: by subject id, then by when written.

        A planner that knows which keys to expect compares one text with another instead of
        making a set of a million keys (see :func:`habitrun.planner.judge.judge`).
        """
        if self._prefetching is not None:
            self._prefetching[0].join()
            ahead = self._prefetching[1].pop((stage, prefix), None)
            if ahead is not None:
                return ahead
        return self._outcome_query(stage, prefix)

    def _outcome_query(self, stage: str, prefix: str) -> tuple[str | None, str | None]:
        # One scan of the stage's index range. The usual range holds successes only: their keys
        # joined, as the least and greatest ``ok`` say (a quarter cheaper than sorting by ``ok``
        # in a CASE per row). Only a range with a failure is scanned again for both lists.
        where, params = key_range(stage, prefix)
        part, cut = "key", cast("tuple[int, ...]", ())
        if prefix:
            part, cut = "substr(key, ?)", (len(prefix) + 1,)
        ((joined, least, most),) = self._con.execute(
            f"SELECT group_concat({part}, ?), min(ok), max(ok) FROM {RECORDS} WHERE {where}", (*cut, SEP, *params),
        ).fetchall()
        if least is None or least == most == 1:
            return joined, None
        ((done_joined, failed_joined),) = self._con.execute(
            f"SELECT group_concat(CASE WHEN ok = 1 THEN {part} END, ?),"
            f" group_concat(CASE WHEN ok = 0 THEN {part} END, ?) FROM {RECORDS} WHERE {where}",
            (*cut, SEP, *cut, SEP, *params),
        ).fetchall()
        return done_joined, failed_joined

    def results(self, keys: Iterable[str]) -> dict[str, Any]:
        """Results of the stored successes among ``keys``, each checked against its checksum.

        Raises :class:`UnreadableResults` (naming stage and subject) when any does not match.
        """
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return {}
        wanted = json.dumps(keys)
        rows = self._query(
            f"SELECT key, mode, NULL, value, digest, stage, subject_id FROM {RECORDS}"
            f" WHERE key IN {KEYS_PARAM} AND ok = 1 AND mode IS NOT NULL",
            (wanted,),
        )
        if len(rows) < len(keys):  # the rest may be large ones, in diskcache's table (or failures)
            rows += dc.large_results(self._idle_con, wanted)
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
        return read_trace(self._idle_con, run_id=run_id, stage=stage, keys=wanted)

    def durations(self, keys: Iterable[str]) -> dict[str, float]:
        """key -> stored duration of the record (seconds) for the stored ones among ``keys``."""
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return {}
        rows = self._query(f"SELECT key, duration FROM {RECORDS} WHERE key IN {KEYS_PARAM}", (json.dumps(keys),))
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
        where, params = key_range(stage, prefix, "stage = ? AND ok = 1")
        digest_of = row_digest
        for key, mode, value, digest in self._query(
            f"SELECT key, mode, value, digest FROM {RECORDS} WHERE {where} AND digest IS NOT NULL"
            " AND mode IS NOT NULL", params,
        ) if self.verify_rows else ():
            try:
                if digest_of(mode, value) != digest:
                    bad[key[cut:]] = "checksum mismatch"
            except (TypeError, ValueError):
                bad[key[cut:]] = "checksum mismatch"
        if self._cache_used:
            for key, mode, filename, size, stored_at, digest in dc.result_files(
                self._idle_con, "r." + where.replace(" AND ", " AND r."), params,
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
            f"SELECT key, subject_id, changed_at FROM {CHANGED} WHERE stage = ?", (stage,))}

    def written_at(self, keys: Iterable[str]) -> dict[str, float]:
        """When the stored records of ``keys`` were written (key -> time)."""
        keys = keys if isinstance(keys, list) else list(keys)
        if not keys:
            return {}
        return dict(self._query(
            f"SELECT key, written_at FROM {RECORDS} WHERE key IN {KEYS_PARAM}", (json.dumps(keys),)
        ))

    def outside_paths(self, stage: str) -> tuple[int, str | None]:
        """How many stored results of ``stage`` name absolute paths outside the study, and one."""
        if self.format_version < 3:
            return 0, None  # not recorded before format 3
        ((count, example),) = self._query(
            f"SELECT count(*), min(outside) FROM {RECORDS} WHERE stage = ? AND outside IS NOT NULL", (stage,)
        )
        return count, example

    def latest(self, stage: str) -> dict[str, tuple[str, dict]]:
        """subject_id -> (key, components) of the newest record of each subject in ``stage``."""
        rows = self._query(
            f"SELECT subject_id, key, components, max(written_at) FROM {RECORDS}"
            " WHERE stage = ? GROUP BY subject_id",
            (stage,),
        )
        return {sid: (key, json.loads(comp) if comp else {}) for sid, key, comp, _ in rows}

    def failures(self, stage: str | None = None) -> list[StoredState]:
        """Stored failures (of one stage, or all), oldest first."""
        where, params = ("ok = 0 AND stage = ?", (stage,)) if stage else ("ok = 0", ())
        rows = self._query(
            f"SELECT {STATE_COLUMNS} FROM {RECORDS} WHERE {where} ORDER BY written_at, rowid",
            params,
        )
        return [state_of(row) for row in rows]

    def stage_keys(self, stage: str) -> list[str]:
        """Every stored key of ``stage`` (current or from older versions of the stage)."""
        return [r[0] for r in self._query(f"SELECT key FROM {RECORDS} WHERE stage = ?", (stage,))]

    def entries(self) -> list[tuple[str, str, str, int]]:
        """Every record as (key, stage, subject, bytes its result takes): what `gc` weighs."""
        return dc.record_sizes(self._idle_con)

    def count(self, stage: str | None = None) -> int:
        """How many records are stored (in one stage, or in all)."""
        if stage is None:
            return self._query(f"SELECT count(*) FROM {RECORDS}")[0][0]
        return self._query(f"SELECT count(*) FROM {RECORDS} WHERE stage = ?", (stage,))[0][0]

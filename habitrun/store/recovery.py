"""Run journals against the store: what a run committed and the store lost, and what it never stored.

A run's journal (:mod:`habitrun.store.journal`) stays in its folder until a
later writer has closed the store cleanly with everything the journal holds
in the database file: then it is *settled* (deleted). An unsettled journal is
the run's word for

* how many records it committed: each one must still be in the store, under
  its key, as written then or later. One that is not was lost after its
  commit (noise in, or the deletion of, ``cache.db-wal``; a store replaced):
  `plan`, `status` and `run` say so with the counts; `run` and `resume`
  store it again from the journal when the journal holds its result, and
  refuse to go on (exit 2) when it does not, unless ``--accept-loss``;
* the outcomes it received and never committed (a SIGKILL inside the group
  commit window, a full disk): `run` and `resume` store them without running
  their subjects again.

A record counts as present when its key is stored with a ``written_at`` no
older than the journal's batch: a later run may have replaced it, an older
record under the same key is what was there before the run's commit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from habitrun.store.journal import FIELDS, JOURNAL_FILE, JournalContent, read_journal, record_of
from habitrun.store.records import Record
from habitrun.store.trace import COL

RUNS = "runs"
NAMED = 6  # subjects named in a message
_TRACE_KEY = COL["key"]
_STAGE, _KEY, _SUBJECT = (FIELDS.index(name) for name in ("stage", "key", "subject_id"))  # of a journal row


class _Times(Protocol):
    def written_times(self, keys: Sequence[str]) -> dict[str, float]: ...


def journal_store_dir(run_root: Path, store_dir: Path) -> str:
    """How a journal names its store: relative to the run root when under it (a copied study
    keeps its journals' store), else absolute."""
    store, root = os.path.abspath(store_dir), os.path.abspath(run_root)
    return os.path.relpath(store, root) if store.startswith(root + os.sep) else store


def unsettled(run_root: Path, store_dir: Path) -> list[JournalContent]:
    """The journals under ``run_root`` that name this store and are not settled, oldest first."""
    runs = Path(run_root) / RUNS
    if not runs.is_dir():
        return []
    wanted = journal_store_dir(run_root, store_dir)
    found = []
    for path in runs.glob(f"*/{JOURNAL_FILE}"):
        content = read_journal(path)
        if content is not None and content.store_dir == wanted:
            found.append(content)
    found.sort(key=lambda c: (c.started, c.run_id))
    return found


@dataclass
class RunCheck:
    """One unsettled journal compared with the store."""

    run_id: str
    path: Path
    committed: int = 0  # records the run committed (those it removed on purpose left out)
    lost: list[tuple[str, str, str]] = field(default_factory=list)  # committed, not in the store: (stage, subject, key)
    restorable: dict[str, Record] = field(default_factory=dict)  # key -> lost record the journal holds
    pending: dict[str, Record] = field(default_factory=dict)  # key -> received, never committed, not stored
    trace: list[tuple] = field(default_factory=list)  # the trace rows of the batches restored or pending

    @property
    def unrestorable(self) -> list[tuple[str, str, str]]:
        return [lost for lost in self.lost if lost[2] not in self.restorable]


def _check(content: JournalContent, times: dict[str, float]) -> RunCheck:
    check = RunCheck(content.run_id, content.path)
    latest: dict[str, tuple[bool, float, tuple | None, tuple[str, str, str]]] = {}
    traced: dict[int, list[tuple]] = {}
    for batch in content.batches:
        committed = batch.seq <= content.committed_seq
        traced[batch.seq] = batch.trace
        for row in batch.rows:
            stage, key, sid = row[_STAGE], row[_KEY], row[_SUBJECT]
            latest[key] = (committed, batch.ts, row, (stage, sid, key))
        for stage, sid, key in batch.unkept:
            latest[key] = (committed, batch.ts, None, (stage, sid, key))
    wanted: set[str] = set()
    for key, (committed, ts, kept, named) in latest.items():
        if key in content.forgotten:
            continue
        check.committed += committed
        stored = times.get(key)
        if stored is not None and stored >= ts:
            continue
        if committed:
            check.lost.append(named)
            if kept is not None:
                check.restorable[key] = record_of(*kept)
                wanted.add(key)
        elif kept is not None:
            check.pending[key] = record_of(*kept)
            wanted.add(key)
    for rows in traced.values():
        check.trace.extend(r for r in rows if r[_TRACE_KEY] in wanted)
    return check


@dataclass
class Recovery:
    """Every unsettled journal of a store, compared with it."""

    store_dir: Path
    runs: list[RunCheck] = field(default_factory=list)

    @property
    def journals(self) -> list[Path]:
        return [run.path for run in self.runs]

    @property
    def unrestorable(self) -> list[tuple[str, str, str]]:
        return [lost for run in self.runs for lost in run.unrestorable]

    def records(self) -> list[Record]:
        """What `run` stores again: lost records the journals hold and outcomes never committed
        (a key in several journals: the latest run's)."""
        out: dict[str, Record] = {}
        for run in self.runs:
            out.update(run.restorable)
            out.update(run.pending)
        return list(out.values())

    def trace(self) -> list[tuple]:
        return [row for run in self.runs for row in run.trace]

    def losses(self, *, advice: bool = False) -> list[str]:
        """One sentence per run whose committed records the store lost (``advice``: and what
        `run` will do about it, for `plan` and `status`)."""
        out = []
        for run in self.runs:
            if not run.lost:
                continue
            readable = run.committed - len(run.lost)
            text = (f"{run.committed} record(s) were committed by run {run.run_id} to the checkpoint store at "
                    f"{self.store_dir}, {readable} are readable there: {len(run.lost)} were lost after their "
                    f"commit ({self.cause()})")
            if run.restorable:
                text += f"; {len(run.restorable)} of them are kept in the run's journal ({run.path})"
            bad = run.unrestorable
            if bad:
                text += f"; {len(bad)} cannot be restored ({_named(bad)}): their subjects would run again"
            if advice:
                text += ("; `habitrun run` (or `resume`) refuses to go on unless told --accept-loss" if bad
                         else "; `habitrun run` (or `resume`) stores them again from the journal")
            out.append(text)
        return out

    @staticmethod
    def cause() -> str:
        return "its write-ahead log cache.db-wal was damaged or deleted, or the store was replaced"

    def pending_notes(self) -> list[str]:
        """One sentence per run that received outcomes it never stored."""
        return [f"run {run.run_id} received {len(run.pending)} outcome(s) it had not stored when it stopped; "
                "they are kept in its journal and the next `habitrun run` or `resume` stores them without "
                "running their subjects again" for run in self.runs if run.pending]

    def restored_notes(self) -> list[str]:
        """What `run` says once it stored the journals' records again."""
        out = []
        for run in self.runs:
            if run.restorable:
                out.append(f"{len(run.restorable)} record(s) committed by run {run.run_id} were lost from the "
                           f"checkpoint store ({self.cause()}); restored from the run's journal {run.path}")
            if run.pending:
                out.append(f"{len(run.pending)} outcome(s) run {run.run_id} received but had not stored when it "
                           "stopped were stored from its journal (their subjects are not run again)")
        return out


def _named(lost: list[tuple[str, str, str]]) -> str:
    shown = ", ".join(f"{stage} {sid}" for stage, sid, _ in lost[:NAMED])
    return shown + (f" and {len(lost) - NAMED} more" if len(lost) > NAMED else "")


def examine(store: _Times | None, journals: list[JournalContent], store_dir: Path) -> Recovery:
    """Compare each journal with the store (None: there is no readable store)."""
    recovery = Recovery(Path(store_dir))
    if not journals:
        return recovery
    keys = sorted({row[_KEY] for c in journals for b in c.batches for row in b.rows}
                  | {u[2] for c in journals for b in c.batches for u in b.unkept})
    times = store.written_times(keys) if store is not None else {}
    recovery.runs = [_check(content, times) for content in journals]
    return recovery


def settle(paths: Sequence[Path]) -> None:
    """These journals hold nothing the store does not (it was closed cleanly since): delete them."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass  # still unsettled: checked again next time, at the cost of a read

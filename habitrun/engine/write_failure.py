"""A folder that cannot be written (a full disk): stop at the first write that fails, keep what is stored.

The store's commits (the recorder thread) and the run folder's events (any
thread) both report here; only the first failure counts. Nothing more can
be stored after it, so running subjects are stopped rather than waited for,
and the run ends with a run-level error (exit 2) that says how much stayed
stored.
"""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Any

from habitrun.engine.control import StopFlag
from habitrun.engine.events import RunFinished, event_dict
from habitrun.errors import EXIT_USAGE, StoreWriteError
from habitrun.store.runs import DISK_FULL, UNWRITABLE, RunFolder


class WriteFailure:
    """Holds the first folder that refused a write, and why."""

    def __init__(self, stop: StopFlag) -> None:
        self.stop = stop
        self.first: tuple[Path, BaseException] | None = None

    def __bool__(self) -> bool:
        return self.first is not None

    def note(self, folder: Path | str, exc: BaseException) -> None:
        """A commit or an event could not be written: stop now (called from any thread)."""
        if self.first is None:
            self.first = (Path(folder), exc)
            self.stop.set(f"cannot write {folder}: {reason(exc)}", hard=True)

    def end_run(self, run: RunFolder, counts: dict[str, Any], stored: int, started: float,
                store_dir: Path, kept: int = 0) -> StoreWriteError:
        """Record how the run ended, in the space its folder set aside; the run-level error to raise.

        The outcome is ``disk_full`` (no space, or over quota) or ``unwritable`` (anything
        else), with the folder and the reason in the summary: `status` shows it as a stop
        that `resume` continues, not as a runner that died.
        ``kept``: outcomes received and not stored, kept in the run's journal (the next run
        stores them without running their subjects again).
        """
        assert self.first is not None
        folder, exc = self.first
        outcome = outcome_for(exc)
        stages = {name: c.as_dict() for name, c in counts.items()}
        duration_sec = round(time.monotonic() - started, 3)
        summary = {"stages": stages,
                   "stop_reason": self.stop.reason, "stored_this_run": stored,
                   "duration_sec": duration_sec,
                   "write_failure": {"folder": str(folder), "reason": reason(exc)}}
        ended = RunFinished(outcome=outcome, exit_code=EXIT_USAGE, stages=stages,
                            failed_subjects=sum(c.failed for c in counts.values()), stop_reason=self.stop.reason,
                            duration_sec=duration_sec, backends=[])
        for attempt in (run.events.close, run.free_reserve, lambda: run.events.write(event_dict(ended)),
                        lambda: run.finish(outcome, summary), run.events.close):
            try:
                attempt()
            except OSError:
                pass  # the same full disk, even so: the store is the record that matters
        what = "the checkpoint store" if folder == store_dir else "the run folder"
        return StoreWriteError(
            f"cannot write {what} at {folder}: {reason(exc)}. The run stopped at the first write that "
            f"failed; {stored} result(s) of this run were stored before it and stay readable"
            + (f", and {kept} more are kept in the run's journal (stored by `resume` without running their "
               "subjects again)" if kept else "")
            + ". Free space there (or set run_dir / policy.checkpoint_dir to another disk), then continue with:",
            folder=folder,
        )


def outcome_for(exc: BaseException) -> str:
    """The run's recorded outcome after a write failed with ``exc``."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DISK_FULL
    return UNWRITABLE


def reason(exc: BaseException) -> str:
    """An OSError as "No space left on device (errno 28)"; anything else as its type and text."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} (errno {exc.errno})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

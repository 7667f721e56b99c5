"""A folder that cannot be written (a full disk): stop at the first write that fails, keep what is stored.

The store's commits (the recorder thread) and the run folder's events (any
thread) both report here; only the first failure counts. Nothing more can
be stored after it, so running subjects are stopped rather than waited for,
and the run ends with a run-level error (exit 2) that says how much stayed
stored.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from habitrun.engine.control import StopFlag
from habitrun.errors import StoreWriteError
from habitrun.store.runs import RunFolder


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
        """Record what can still be recorded in the run folder; the run-level error to raise.

        ``kept``: outcomes received and not stored, kept in the run's journal (the next run
        stores them without running their subjects again)."""
        assert self.first is not None
        folder, exc = self.first
        summary = {"stages": {name: c.as_dict() for name, c in counts.items()},
                   "stop_reason": self.stop.reason, "stored_this_run": stored,
                   "duration_sec": round(time.monotonic() - started, 3)}
        for attempt in (lambda: run.finish("interrupted", summary), run.events.close):
            try:
                attempt()
            except OSError:
                pass  # the same full disk: the store is the record that matters
        what = "the checkpoint store" if folder == store_dir else "the run folder"
        return StoreWriteError(
            f"cannot write {what} at {folder}: {reason(exc)}. The run stopped at the first write that "
            f"failed; {stored} result(s) of this run were stored before it and stay readable"
            + (f", and {kept} more are kept in the run's journal (stored by `resume` without running their "
               "subjects again)" if kept else "")
            + ". Free space there (or set run_dir / policy.checkpoint_dir to another disk), then continue with:",
            folder=folder,
        )


def reason(exc: BaseException) -> str:
    """An OSError as "No space left on device (errno 28)"; anything else as its type and text."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} (errno {exc.errno})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

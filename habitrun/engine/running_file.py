"""The run folder's ``running.json``: which subjects run now, on which pid, since when.

`habitrun status` of a live run (cli/live.py) must name a hung subject's
process and log without asking the runner anything and without taking the
store lock. No event says when a subject starts: one per subject would cost
the event log a write per subject at 100,000 subjects, and a worker may
start a queued subject without the runner waking at all (see
engine/process/beacon.py). So a thread of the runner reads the backend's
view (its workers' beacons) once a second and rewrites this small file
atomically; it is removed when the stages end. The stage loop itself is not
touched: its dispatch pays nothing (benchmarks/dispatch.py).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from habitrun.engine.contract import Backend

INTERVAL_SEC = 1.0


class RunningFile:
    """A daemon thread that rewrites ``path`` every ``interval`` seconds until :meth:`close`."""

    def __init__(self, path: Path, current: Callable[[], tuple[str | None, Backend | None]],
                 interval: float = INTERVAL_SEC) -> None:
        self.path = Path(path)
        self.current = current  # (the stage running now, its backend): read from this thread
        self.interval = interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.loop, name="habitrun-running-file", daemon=True)

    def start(self) -> RunningFile:
        self.thread.start()
        return self

    def loop(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.write(self.snapshot())
            except Exception:  # noqa: BLE001 - advisory only: a full disk or a racing read never stops the run
                continue

    def snapshot(self) -> dict[str, Any]:
        """What runs now: ``{"ts", "runner_pid", "stage", "subjects": [{subject, attempt, pid, started_at, log, output}]}``."""
        stage, backend = self.current()
        running = backend.running_subjects() if backend is not None else []
        return {
            "ts": round(time.time(), 3), "runner_pid": os.getpid(), "stage": stage,
            "subjects": [{"subject": r.task.subject_id, "attempt": r.task.attempt, "pid": r.pid,
                          "started_at": round(r.started_at, 3), "log": r.task.log_path, "output": r.output}
                         for r in running],
        }

    def write(self, data: dict[str, Any]) -> None:
        """Replace the file whole (a reader never sees half of it)."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self.path)

    def close(self) -> None:
        """Stop the thread and remove the file: nothing runs any more."""
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)
        for path in (self.path, self.path.with_name(f".{self.path.name}.tmp")):
            try:
                path.unlink()
            except OSError:
                pass

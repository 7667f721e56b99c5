"""The log of a subject whose worker died or was stopped under it: what it printed, then what happened."""

from __future__ import annotations

import os

from habitrun.engine.invoke import log_header, read_capped
from habitrun.engine.process.death import classify_exit
from habitrun.engine.process.handle import WorkerHandle


def write_death_log(worker: WorkerHandle, log_max_bytes: int) -> None:
    """Append the worker's scratch output of the subject it owes a log, then one line saying how it ended.

    Called once the worker is reaped, so its exit code is known. A log that
    cannot be written changes nothing about the subject's outcome.
    """
    if worker.log_owed is None:
        return
    task, start, what = worker.log_owed
    worker.log_owed = None
    output = b""
    if start >= 0 and worker.scratch_path:
        try:
            fd = os.open(worker.scratch_path, os.O_RDONLY)
            try:
                output = read_capped(fd, start, os.fstat(fd).st_size, log_max_bytes)
            finally:
                os.close(fd)
        except OSError:
            output = b""
    code = worker.proc.exitcode
    ended = classify_exit(code).message if code is not None else "worker did not end"
    memory = f"; its memory last seen at {worker.watched.last_rss_mb:.0f} MB" if worker.watched.last_rss_mb else ""
    if output and not output.endswith(b"\n"):
        output += b"\n"
    line = f"--- habitrun: {what} (pid {worker.pid}: {ended}{memory}) ---\n"
    try:
        os.makedirs(os.path.dirname(task.log_path), exist_ok=True)
        with open(task.log_path, "ab") as log:
            log.write(log_header(task, worker.pid) + output + line.encode())
    except OSError:
        pass

"""A Dask worker's crash file: where faulthandler writes the stack of a subject that kills its worker.

A Dask worker runs subjects in one thread of a long-lived process whose stderr is Dask's, and a
subject's output waits in a scratch file that dies with the process. So each worker points
faulthandler at a file of its own beside the stage's subject logs (armed once per stage folder: no
cost per subject; it stays empty unless the process dies of a fatal signal), and the client, which
charges the death, copies what is there into that subject's log and removes the files when the
stage ends. The log folder is the run folder the workers already write subject logs into.
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

CRASH_PREFIX = ".crash-"


def crash_path(log_path: str, pid: int) -> str:
    """The crash file of worker ``pid`` for the stage whose subject log is ``log_path``."""
    return os.path.join(os.path.dirname(log_path), f"{CRASH_PREFIX}{pid}")


class CrashFile:
    """The worker's side: faulthandler armed on this process's crash file for the current stage."""

    def __init__(self) -> None:
        self._file: BinaryIO | None = None
        self._path: str | None = None

    def arm(self, log_path: str) -> None:
        path = crash_path(log_path, os.getpid())
        if path == self._path:
            return
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            armed = open(path, "wb", buffering=0)  # noqa: SIM115 - held open for faulthandler
            faulthandler.enable(file=armed, all_threads=False)  # the crashing thread: the subject's
        except OSError:
            return  # no crash file: a crash then leaves no stack, the subject still runs
        if self._file is not None:
            self._file.close()
        self._file, self._path = armed, path


def take_crash(log_path: str, pid: int | None) -> bytes:
    """What worker ``pid`` wrote into its crash file before it died (and the file removed), or b""."""
    if pid is None:
        return b""
    path = crash_path(log_path, pid)
    try:
        with open(path, "rb") as fh:
            text = fh.read()
        os.unlink(path)
    except OSError:
        return b""
    return text


def remove_crash_files(log_paths: Iterable[str]) -> None:
    """Remove the (empty) crash files the workers left in these subject logs' folders."""
    for folder in {os.path.dirname(p) for p in log_paths}:
        try:
            for entry in Path(folder).glob(f"{CRASH_PREFIX}*"):
                entry.unlink(missing_ok=True)
        except OSError:
            continue

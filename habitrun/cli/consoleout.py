"""The one writer behind the `habitrun` process's stdout and stderr: a closed console never stops the work.

A pager quit, a dead ``tee`` or log shipper closes the pipe a run prints to;
Python ignores SIGPIPE, so the next write raises ``BrokenPipeError`` wherever it
happens (a progress line, the summary, a warning), and that used to end the run
with 0 subjects run and provenance left "running". :func:`install` puts a
:class:`ConsoleStream` in ``sys.stdout`` and ``sys.stderr`` (which rich's
consoles, ``typer.echo``, ``print``, ``warnings`` and ``logging`` all write to
when they write): it passes everything through until a write fails with
EPIPE (or EIO: a terminal that hung up), then sends what that write held and all that follows to the run
folder's ``console.log`` (kept in memory until :func:`attach` names the run
folder). The closed descriptor is pointed at ``/dev/null``, so the
interpreter's last flush of the original stream, and any process started
later, write nowhere instead of failing.
"""

from __future__ import annotations

import errno
import io
import os
import sys
import threading
from pathlib import Path
from typing import TextIO

from habitrun.cli import entry

LOG_NAME = "console.log"
MEMORY_LIMIT = 4 << 20  # what is held before the run folder exists; past it, the oldest goes
PENDING_LIMIT = 64 << 10  # text kept since the last good flush (the real stream's buffer is smaller)


GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.EIO})  # EIO: a terminal that hung up


def broken_pipe(exc: BaseException) -> bool:
    """Whether ``exc`` says the console is gone: its reader closed the pipe, the socket was reset,
    the terminal hung up (its SIGHUP stops the run; the summary still has to go somewhere)."""
    return isinstance(exc, OSError) and exc.errno in GONE


class ConsoleLog:
    """``console.log`` in the run folder: what could not be printed once the console closed."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.held: list[str] = []
        self.held_size = 0
        self.path: Path | None = None
        self.file: TextIO | None = None
        self.used = False
        self.announced = False

    def write(self, text: str) -> None:
        if not text:
            return
        with self.lock:
            self.used = True
            if self.path is None:
                self.held.append(text)
                self.held_size += len(text)
                while self.held_size > MEMORY_LIMIT and len(self.held) > 1:
                    self.held_size -= len(self.held.pop(0))
                return
            self._append(text)

    def attach(self, folder: Path) -> None:
        """The run folder exists: what was held goes into its console.log, and so does what follows."""
        with self.lock:
            if self.path is not None:
                return
            self.path = Path(folder) / LOG_NAME
            held, self.held, self.held_size = "".join(self.held), [], 0
            if held:
                self._append(held)
        self.announce()

    def announce(self) -> None:
        """Say once, on whichever console still works, where the rest of the output went."""
        if self.announced or self.path is None or not self.used:
            return
        self.announced = True
        note = f"habitrun: the console was closed; the rest of the output goes to {self.path}\n"
        for stream in (sys.stderr, sys.stdout):
            if isinstance(stream, ConsoleStream) and not stream.broken:
                stream.write(note)
                stream.flush()
                if not stream.broken:
                    return

    def _append(self, text: str) -> None:
        try:
            if self.file is None:
                assert self.path is not None
                self.file = open(self.path, "a", encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
            self.file.write(text)
            self.file.flush()
        except (OSError, ValueError):
            pass  # a full disk: the console's text is the one thing a run may lose

    def write_now(self, text: str) -> None:
        """From a signal handler: written if the log is free, else dropped (never waits)."""
        if self.lock.acquire(blocking=False):
            try:
                self.write(text)
            finally:
                self.lock.release()


class ConsoleStream(io.TextIOBase):
    """A text stream that writes to ``real`` until its reader goes, then to ``log``."""

    def __init__(self, real: TextIO | None, name: str, log: ConsoleLog) -> None:
        super().__init__()
        self.real = real
        self.name = name
        self.log = log
        self.broken = real is None  # closed before we started (``>&-``)
        self.pending: list[str] = []  # written since the last good flush: lost with the pipe
        self.pending_size = 0
        self.lock = threading.RLock()

    # what rich, click and logging look at
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.real, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.real, "errors", None) or "strict"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        if self.broken or self.real is None:
            return False
        return self.real.isatty()

    def fileno(self) -> int:
        """The real descriptor while it works (a worker checks it is fd 1); none once it is gone."""
        if self.broken or self.real is None:
            raise io.UnsupportedOperation("the console was closed; output goes to console.log")
        return self.real.fileno()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self.lock:
            if self.broken:
                self.log.write(text)
                return len(text)
            assert self.real is not None
            self.pending.append(text)
            self.pending_size += len(text)
            try:
                self.real.write(text)
            except OSError as exc:
                if not broken_pipe(exc):
                    raise
                self._closed()
                return len(text)
            if self.pending_size > PENDING_LIMIT:
                self.pending, self.pending_size = [text], len(text)
        return len(text)

    def flush(self) -> None:
        with self.lock:
            if self.broken or self.real is None:
                return
            try:
                self.real.flush()
            except OSError as exc:
                if not broken_pipe(exc):
                    raise
                self._closed()
                return
            self.pending, self.pending_size = [], 0

    def _closed(self) -> None:
        """The reader is gone: what it did not get, and all that follows, goes to console.log."""
        self.broken = True
        assert self.real is not None
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self.real.fileno())
            finally:
                os.close(devnull)
        except (OSError, ValueError, io.UnsupportedOperation):
            pass
        pending, self.pending, self.pending_size = "".join(self.pending), [], 0
        self.log.write(pending)
        self.log.announce()


_log = ConsoleLog()


def install() -> None:
    """Route ``sys.stdout`` and ``sys.stderr`` through :class:`ConsoleStream` (the console script only)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, ConsoleStream):
            setattr(sys, name, ConsoleStream(stream, name, _log))
    entry.on_closed_stderr(_log.write_now)


def attach(folder: Path) -> None:
    """The run folder exists: console.log goes there (only written when a console was closed)."""
    _log.attach(folder)

"""The engine's debug channel: `habitrun -v` or ``HABITRUN_DEBUG=1`` writes its decisions to ``debug.log``.

Every module that decides something (the runner, the planner, the backends,
the recorder) logs through ``logging.getLogger(__name__)``, below the
``habitrun`` logger. Nobody listens by default: ``habitrun``'s level is left
unset (WARNING through the root), so a ``log.debug`` call costs a level check,
and the dispatch path checks once per stage or per round, not per subject
(``benchmarks/engine_cpu.py``). A run with ``HABITRUN_DEBUG=1`` in its
environment, or started by ``habitrun -v`` (which also prints each line on
stderr: :mod:`habitrun.cli.verbose`), sets ``habitrun`` to DEBUG for the run
and writes every line to the run folder's ``debug.log``; lines logged before
the folder exists (planning, the backend's choice) are held and written first.
Text is escaped (:func:`printable`): a subject id cannot forge a line.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

ENV = "HABITRUN_DEBUG"
LOG_NAME = "debug.log"
LOGGER = logging.getLogger("habitrun")
HELD_MAX = 100_000  # lines held before the run folder exists; past it the oldest go
FORMAT = "%(asctime)s.%(msecs)03d %(threadName)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"

_active: RunDebugLog | None = None


def wanted() -> bool:
    """``HABITRUN_DEBUG`` is set to something other than 0, or habitrun's logger was set to DEBUG (`-v`)."""
    return os.environ.get(ENV, "").strip() not in ("", "0") or 0 < LOGGER.level <= logging.DEBUG


def printable(text: str) -> str:
    """``text`` with every character a terminal or a log reader would act on (newline, ESC...) escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class Escaped(logging.Formatter):
    """habitrun's debug line: time, thread, module, the message with its control characters escaped."""

    def __init__(self) -> None:
        super().__init__(FORMAT, DATE_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


class RunDebugLog(logging.Handler):
    """``debug.log`` of one run: lines held in memory until the run folder exists, then appended there."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(Escaped())
        self.held: list[str] = []
        self.file: TextIO | None = None
        self.path: Path | None = None
        self.broken = False
        self.guard = threading.Lock()

    def attach(self, folder: Path) -> None:
        """The run folder exists: write what was held, and every line after, to its debug.log."""
        with self.guard:
            self.path = Path(folder) / LOG_NAME
            try:
                self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
                self.file.write("".join(line + "\n" for line in self.held))
                self.file.flush()
            except OSError:
                self.broken = True  # a debug log that cannot be written never stops the run
            self.held = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 - a bad log call must not break the engine
            return
        with self.guard:
            if self.broken:
                return
            if self.file is None:
                self.held.append(line)
                if len(self.held) > HELD_MAX:
                    del self.held[: HELD_MAX // 10]
                return
            try:
                self.file.write(line + "\n")
                self.file.flush()
            except OSError:
                self.broken = True

    def close(self) -> None:
        with self.guard:
            if self.file is not None:
                try:
                    self.file.close()
                except OSError:
                    pass
                self.file = None
        super().close()


@contextmanager
def debug_run() -> Iterator[RunDebugLog | None]:
    """For one run: when :func:`wanted`, habitrun's logger at DEBUG and a :class:`RunDebugLog` on it."""
    global _active
    if not wanted():
        yield None
        return
    handler = RunDebugLog()
    level = LOGGER.level
    LOGGER.addHandler(handler)
    if not 0 < level <= logging.DEBUG:
        LOGGER.setLevel(logging.DEBUG)
    _active = handler
    try:
        yield handler
    finally:
        _active = None
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)
        handler.close()


def attach_run_folder(folder: Path) -> None:
    """The run's folder exists: the debug log (if this run keeps one) goes there."""
    if _active is not None:
        _active.attach(folder)

"""`habitrun -v`: the engine's debug lines on stderr as they happen, printed literally.

The lines are :mod:`habitrun.engine.debuglog`'s (time, thread, module,
message, control characters escaped); they go to whatever ``sys.stderr`` is
when each is logged, so a progress display on the terminal (which redirects
stderr while it draws) prints them above its bars, as plain text: never read
as rich markup. A run also writes them to its folder's ``debug.log``.
"""

from __future__ import annotations

import logging
import sys

from habitrun.engine.debuglog import LOGGER, Escaped


class StderrLines(logging.Handler):
    """Each debug line on the current ``sys.stderr``."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(Escaped())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - a closed console never stops the work (cli/consoleout.py)
            pass


def to_stderr() -> None:
    """Turn the debug channel on for this command, printing each line on stderr (once however often called)."""
    if not any(isinstance(h, StderrLines) for h in LOGGER.handlers):
        LOGGER.addHandler(StderrLines())
    LOGGER.setLevel(logging.DEBUG)

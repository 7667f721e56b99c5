"""End the `habitrun` process without the interpreter's teardown, once nothing is left to finish.

After a command has printed its outcome, Python's own shutdown still clears
every module and frees every object one by one: with the hundreds of modules
a command imports (pydantic, typer, rich, the engine) that is 25-80 ms of a
command that takes 0.3 s, and nothing a user sees. :func:`exit_now` lets the
normal exit do what matters (wait for non-daemon threads, run the ``atexit``
handlers, which include multiprocessing's and ``weakref.finalize``'s) and cuts
it short after that, with public means only: importing this module registers
:func:`_last_handler`, and ``atexit`` runs its handlers last in, first out
(documented), so a handler registered before any other runs after all of them.
It finalises what sits in reference cycles (such as the SQLite connection a
thread opened, whose close checkpoints the store's WAL into its file), flushes
stdout/stderr and leaves with ``os._exit``. Where it cannot be sure that is
all (an SQLite connection still open, held by a live object; a flush that
fails, whose message and exit status Python's shutdown owns) it returns, and
the normal teardown goes on, so the outcome is the same either way.

This module is imported first by ``cli/app.py`` (a handler registered before it
would run after the cut and be skipped: ``tests/cli/test_fast_exit.py`` checks
that ``logging``'s and ``multiprocessing``'s are registered after it).
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from typing import NoReturn

_status: int | None = None  # set by exit_now: the status the last handler leaves with


def exit_code(code: object) -> int | None:
    """The status ``sys.exit(code)`` ends with, or None when Python would print ``code`` (a message)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return None


def exit_now(code: object) -> NoReturn:
    """Leave with ``code`` as ``sys.exit(code)`` would, skipping the interpreter's teardown when that is safe."""
    global _status
    _status = exit_code(code)
    raise SystemExit(code)


def _last_handler() -> None:
    """The last ``atexit`` handler: after every other has run, leave without the teardown if that is safe."""
    status = _status
    if status is None:  # not ended by exit_now (or with a message Python prints): the normal exit
        return
    gc.collect()  # what sits in reference cycles is finalised, as the teardown would (a thread's SQLite connection)
    if _databases_open():  # held by a live object
        gc.unfreeze()  # the teardown then sees the CLI's frozen imports as it always did
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            return  # a closed pipe: Python's shutdown reports it as it always does
    os._exit(status)


atexit.register(_last_handler)  # at import, before any other handler: so it runs after all of them


def _databases_open() -> bool:
    """Whether an SQLite connection is still open: the teardown would close it, which checkpoints its WAL.

    Only what the cycle collector has not frozen is looked at: the CLI freezes what its
    imports made (tens of thousands of objects, 10-30 ms to walk) before a command opens
    any store, so a connection is never among them (tests/cli/test_fast_exit.py checks
    that importing every command opens none). One missed would still lose nothing: what
    it committed is in its WAL, which the next open reads.
    """
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is None:
        return False
    for obj in gc.get_objects():  # not the frozen generation (CPython)
        if isinstance(obj, sqlite3.Connection):
            try:
                obj.total_changes  # noqa: B018 - raises on a closed connection, from any thread
            except sqlite3.ProgrammingError:
                continue
            return True
    return False

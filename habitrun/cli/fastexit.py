"""End the `habitrun` process without the interpreter's teardown, once nothing is left to finish.

After a command has printed its outcome, Python's own shutdown still clears
every module and frees every object one by one: with the hundreds of modules
a command imports (pydantic, typer, rich, the engine) that is 25-80 ms of a
command that takes 0.3 s, and nothing a user sees. :func:`exit_now` does what
that shutdown does that matters (the ``atexit`` handlers, which include
multiprocessing's and ``weakref.finalize``'s, and flushing stdout/stderr) and
then leaves with ``os._exit``. Where it cannot be sure that is all (a
non-daemon thread still running, which a normal exit would wait for, or a
flush that fails, whose message and exit status Python's shutdown owns) it
falls back to the normal exit, so the outcome is the same either way.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_code(code: object) -> int | None:
    """The status ``sys.exit(code)`` ends with, or None when Python would print ``code`` (a message)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return None


def exit_now(code: object) -> NoReturn:
    """Leave with ``code`` as ``sys.exit(code)`` would, skipping the interpreter's teardown when that is safe."""
    status = exit_code(code)
    if status is None or _threads_pending():
        raise SystemExit(code)
    atexit._run_exitfuncs()
    if _threads_pending():  # an atexit handler started one
        raise SystemExit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            raise SystemExit(code) from None  # a closed pipe: Python's shutdown reports it as it always does
    os._exit(status)


def _threads_pending() -> bool:
    """Whether a thread that a normal exit would wait for is still running."""
    main = threading.main_thread()
    return any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate())

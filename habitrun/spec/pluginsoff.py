"""Build habitrun's own pydantic models without pydantic's plugin lookup.

The first model class pydantic builds looks for plugins: it imports
``importlib.metadata`` and reads the entry points of every installed
distribution, about 30 ms of a `validate` or `plan` that should take 0.2 s.
The recipe and policy models gain nothing from a plugin, so they are built
with ``PYDANTIC_DISABLE_PLUGINS`` set (as typer builds its own adapters).

The CLI imports each command's modules under the same guard: the engine's
modules import the policy models on their own (typer builds its option
adapters with the variable set already).

The variable is set only while no other thread could start a process and is
removed right after, so no process started meanwhile or later (workers, the
operator check, whatever a user's operator starts) inherits it, and models a
user's operator builds still find their plugins. A thread that never starts
a Python process (``run``'s read of git's state) is marked with
:func:`starts_no_python` and does not count.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_VARIABLE = "PYDANTIC_DISABLE_PLUGINS"


@contextmanager
def plugins_off() -> Iterator[None]:
    """Disable pydantic plugins for the block when that cannot leak into another thread's child process."""
    if _VARIABLE in os.environ or not _alone():
        yield
        return
    os.environ[_VARIABLE] = "1"
    try:
        yield
    finally:
        os.environ.pop(_VARIABLE, None)


def starts_no_python(thread: threading.Thread) -> threading.Thread:
    """Mark ``thread`` as one that starts no Python process: :func:`plugins_off` may act while it runs."""
    thread.habitrun_starts_no_python = True  # type: ignore[attr-defined]
    return thread


def _alone() -> bool:
    """True when every thread but this one is marked by :func:`starts_no_python`."""
    me = threading.current_thread()
    return all(t is me or getattr(t, "habitrun_starts_no_python", False) for t in threading.enumerate())

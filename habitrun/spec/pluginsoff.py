"""Build habitrun's own pydantic models without pydantic's plugin lookup.

The first model class pydantic builds looks for plugins: it imports
``importlib.metadata`` and reads the entry points of every installed
distribution, about 30 ms of a `validate` or `plan` that should take 0.2 s.
The recipe and policy models gain nothing from a plugin, so they are built
with ``PYDANTIC_DISABLE_PLUGINS`` set (as typer builds its own adapters).

The variable is set only while this process has a single thread and is
removed right after, so no process started meanwhile or later (workers, the
operator check, whatever a user's operator starts) inherits it, and models a
user's operator builds still find their plugins.
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
    if _VARIABLE in os.environ or threading.active_count() > 1:
        yield
        return
    os.environ[_VARIABLE] = "1"
    try:
        yield
    finally:
        os.environ.pop(_VARIABLE, None)

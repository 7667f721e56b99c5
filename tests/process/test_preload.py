"""The fork server preloads every module a forked worker needs before its first subject.

A child of the fork server runs the request's target (``served_worker``, then
``worker_main``), unpickled in the server; a module missing from the preload is
imported again in every child, milliseconds per subject in isolated mode.
"""

from __future__ import annotations

from habitrun.engine.process.spawner import BASE_PRELOAD
from habitrun.engine.process.worker import served_worker, worker_main


def test_the_worker_entries_are_preloaded() -> None:
    assert served_worker.__module__ in BASE_PRELOAD
    assert worker_main.__module__ in BASE_PRELOAD

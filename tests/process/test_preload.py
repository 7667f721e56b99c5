"""The fork server preloads every module a forked worker needs before its first subject.

A child of the fork server unpickles its process object (whose class lives in
``spawner``) and runs ``worker_main``; a module missing from the preload is
imported again in every child, milliseconds per subject in isolated mode.
"""

from __future__ import annotations

from habitrun.engine.process import spawner
from habitrun.engine.process.spawner import BASE_PRELOAD
from habitrun.engine.process.worker import worker_main


def test_the_process_class_and_the_worker_entry_are_preloaded() -> None:
    classes = [c for c in vars(spawner).values() if isinstance(c, type) and c.__module__ == spawner.__name__
               and issubclass(c, spawner.BaseProcess)]
    assert classes, "the spawner defines the process classes it starts"
    for cls in classes:
        assert cls.__module__ in BASE_PRELOAD, cls
    assert worker_main.__module__ in BASE_PRELOAD


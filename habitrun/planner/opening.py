"""The subjects and the store of a plan, read side by side.

Opening a store may run SQLite's ``quick_check`` (when it was not sealed at a
clean close: :mod:`habitrun.store.seal`): a read of the whole file (about
1.4 s for a million subjects x 3 stages), in SQLite's C code, which lets go of
Python's lock. Reading the manifest is Python's work. One in a thread beside
the other, a large plan starts in the time of the longer of the two.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from habitrun.spec.subjects import SubjectTable, load_subjects

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe

S = TypeVar("S")


def subjects_and_store(loaded: LoadedRecipe, open_store: Callable[[], S]) -> tuple[SubjectTable, S]:
    """``load_subjects(loaded)`` and ``open_store()`` (run in a thread; its connection must allow
    that, as a read-only store's does), both done; their errors as if one ran after the other:
    the manifest's first (the store, if opened, is then closed)."""
    opened: list[S] = []
    failed: list[BaseException] = []

    def opening() -> None:
        try:
            opened.append(open_store())
        except BaseException as exc:  # noqa: BLE001  # raised in the caller's thread below
            failed.append(exc)

    thread = threading.Thread(target=opening, name="habitrun-open-store", daemon=True)
    thread.start()
    try:
        subjects = load_subjects(loaded)
    except BaseException:
        thread.join()
        for store in opened:
            close = getattr(store, "close", None)
            if close is not None:
                close()
        raise
    thread.join()
    if failed:
        raise failed[0]
    return subjects, opened[0]

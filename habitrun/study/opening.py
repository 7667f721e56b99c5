"""The one store opener of every command that reads or tidies a study; a plan's subjects and store read side by side.

:func:`open_store` is the one store opener of the read commands (`plan`,
`status`, `results`, `trace`, `report`, `gc`, `debug`, the live view and
``habitrun.results``): read-only unless asked to write, never created unless
asked to, and always told the study's folders so that stored relative paths
come back absolute (:mod:`habitrun.store.relpaths`).

Opening a store may run SQLite's ``quick_check`` (when it was not sealed at a
clean close: :mod:`habitrun.store.seal`): a read of the whole file (about
1.4 s for a million subjects x 3 stages), in SQLite's C code, which lets go of
Python's lock. Reading the manifest is Python's work. One in a thread beside
the other, a large plan starts in the time of the longer of the two.

Once the store is open, that thread also starts reading each map stage's
stored keys (:meth:`~habitrun.store.queries.StoreQueries.prefetch_outcomes`,
about 0.35 s of SQLite a stage for a million subjects) when the ranges the
plan will ask for are known without the manifest: no input files, no declared
inputs, no ``fields``. It is a guess only in what it costs: the plan takes
a text read ahead only for exactly the (stage, key prefix) it asks about.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from habitrun.errors import StoreError
from habitrun.planner.context import build_context
from habitrun.planner.plan import outcome_ranges
from habitrun.spec.roots import declared_roots
from habitrun.spec.subjects import SubjectTable, load_subjects
from habitrun.store.checkpoint import CheckpointStore

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe

S = TypeVar("S")


def open_store(loaded: LoadedRecipe, *, write: bool = False, create: bool = False, verify: bool = False,
               required: bool = False) -> CheckpointStore | None:
    """The recipe's checkpoint store, or None when there is none yet.

    Read-only (SQLite's ``mode=ro``: the file is left as it was, a read-only copy of a study
    can be read) unless ``write``; created (with its folders) only with ``create``, as
    `debug --store` does; ``required``: no store is a StoreError naming the command that makes
    one. ``verify``: check every stored result read against its checksum. Writing needs the
    store's lock, which the caller holds.
    """
    store_dir = loaded.store_dir()
    if not create and not CheckpointStore.exists(store_dir):
        if required:
            raise StoreError(f"no checkpoint store at {store_dir} yet: run the study first "
                             f"({shlex.join(['habitrun', 'run', str(loaded.path)])})")
        return None
    if create:
        from habitrun.store.folders import ensure_folder  # only `debug --store` creates one

        ensure_folder(loaded.run_root())
        ensure_folder(store_dir.parent)
    store = CheckpointStore.open(store_dir, create=create, read_only=not write)
    store.set_roots(loaded.run_root(), loaded.root, declared_roots(loaded).data)
    store.verify_rows = verify
    return store


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
            return
        _read_ahead(loaded, opened[0])

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


def _read_ahead(loaded: LoadedRecipe, store: object) -> None:
    """Start reading the stored keys the plan will compare, when they are known before the
    manifest is read (see the module docstring)."""
    recipe = loaded.recipe
    prefetch = getattr(store, "prefetch_outcomes", None)
    if prefetch is None or recipe.subjects.found or recipe.subjects.file_columns() \
            or any(s.inputs or s.fields is not None for s in recipe.stages):
        return
    try:
        context = build_context(loaded, [], None, save=False)
    except Exception:  # noqa: BLE001  # only a read ahead: the plan itself meets and reports it
        return
    prefetch(outcome_ranges(recipe, {n: info.fingerprint for n, info in context.stages.items()}, context))

"""One study opened for reading: its recipe, subjects, store and runs, behind the read commands.

`plan`, `status`, `gc`, `results`, `trace`, `report` and ``habitrun.results``
each open a :class:`Study` and ask it; they only parse options and print. How
a recipe, a run and a store are found lives here (:mod:`.which`,
:mod:`.opening`), so a change to what a read command answers about lands in
one place. Nothing here writes, except through :meth:`Study.writing`, which
holds the store's lock.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from habitrun.errors import StoreError
from habitrun.planner.plan import Plan, plan_study
from habitrun.spec.loader import LoadedRecipe, load_recipe
from habitrun.spec.subjects import SubjectTable, load_subjects
from habitrun.store.checkpoint import CheckpointStore
from habitrun.study.opening import open_store, subjects_and_store
from habitrun.study.which import About, choose, run_overrides, selecting

if TYPE_CHECKING:
    from habitrun.store.runs import RunFolder


class Study:
    """A study's recipe as one read command takes it, and what that answers about (:class:`About`)."""

    def __init__(self, loaded: LoadedRecipe, about: About) -> None:
        self.loaded = loaded
        self.about = about

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def at_run(cls, recipe: str | Path, overrides: Sequence[str] = (), run_id: str | None = None) -> Study:
        """For `status`, `results`, `trace`, `report`: the latest run (or ``run_id``), or the overrides given."""
        loaded, about = choose(Path(recipe), overrides, run_id)
        return cls(loaded, about)

    @classmethod
    def of_file(cls, recipe: str | Path, overrides: Sequence[str] = ()) -> Study:
        """For `plan` and `gc`: the recipe file with ``overrides``, against the store they select."""
        loaded = load_recipe(recipe, tuple(overrides))
        return cls(loaded, About(None, selecting(loaded.overrides), "file"))

    @classmethod
    def of_run_folder(cls, folder: Path) -> Study:
        """A run folder named on the command line: its stored recipe, planned in the folder it ran in."""
        from habitrun.store.runs import RunFolder

        run = RunFolder.open(folder)
        root = run.source.get("root")
        if not root:
            raise StoreError(f"{folder / 'source.json'} does not say which folder the run used")
        loaded = load_recipe(run.recipe_file, root=root)
        return cls(loaded, About(run, selecting(run_overrides(run)), "run"))

    # -- what it holds -----------------------------------------------------------------------
    @property
    def run(self) -> RunFolder | None:
        return self.about.run

    def subjects(self) -> SubjectTable:
        return load_subjects(self.loaded)

    def store(self, *, verify: bool = False, required: bool = False) -> CheckpointStore | None:
        """The study's store, read-only (None, or with ``required`` a StoreError, when there is none)."""
        return open_store(self.loaded, verify=verify, required=required)

    def subjects_and_store(self, *, verify: bool = False) -> tuple[SubjectTable, CheckpointStore | None]:
        """Both, read side by side (:func:`habitrun.study.opening.subjects_and_store`)."""
        return subjects_and_store(self.loaded, lambda: self.store(verify=verify))

    def plan(self, subjects: SubjectTable, store: CheckpointStore | None) -> Plan:
        """Each stage's keys and statuses for ``subjects`` against ``store`` (nothing is written)."""
        return plan_study(self.loaded, subjects, store)

    @contextmanager
    def writing(self) -> Iterator[CheckpointStore | None]:
        """The existing store opened for writing under the study's lock (None: no store), as `gc --yes` needs."""
        from habitrun.store.lock import StoreLock, default_lock_path  # only a writer needs the lock

        store_dir = self.loaded.store_dir()
        store_dir.parent.mkdir(parents=True, exist_ok=True)
        with StoreLock(default_lock_path(store_dir)):
            store = open_store(self.loaded, write=True)
            try:
                yield store
            finally:
                if store is not None:
                    store.close()

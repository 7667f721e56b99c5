"""Whether a run folder is where its study keeps its runs: shared by `resume` and `status`.

Kept apart from `resume` so that `status` does not import the engine to ask it.
"""

from __future__ import annotations

from pathlib import Path

from habitrun.errors import StoreError
from habitrun.spec.loader import LoadedRecipe
from habitrun.store.runs import RUNS, RunFolder


def check_run_home(run: RunFolder, loaded: LoadedRecipe, *, named: Path) -> None:
    """Refuse a run folder that is not where ``loaded`` keeps its runs (copied or moved):
    replaying it would read and write another study's store."""
    home = loaded.run_root() / RUNS
    if same_folder(run.path.parent, home):
        return
    raise StoreError(
        f"{named} is not in the runs folder of the study it belongs to ({home}): the run folder, or its "
        f"study, was copied or moved, and resuming it would write to {loaded.run_root()}. To resume the "
        "study that holds it, name that study's recipe: habitrun resume <study folder>/recipe.yaml"
    )


def same_folder(a: Path, b: Path) -> bool:
    """Whether two paths are one folder (resolved, or the same inode through a mount)."""
    try:
        return a.resolve() == b.resolve() or a.samefile(b)
    except OSError:
        return False

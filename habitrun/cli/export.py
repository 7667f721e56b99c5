"""`habitrun export [RECIPE] --ro-crate DIR [--run ID]`: a run as a Workflow Run RO-Crate.

The crate (:mod:`habitrun.store.rocrate`) is written into DIR: an empty or
missing folder, or one holding an earlier crate (replaced). The run is the
latest by default. Nothing in the study or its store is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from habitrun.cli.app import app
from habitrun.cli.findrecipe import given_or_found
from habitrun.cli.runpick import find_run
from habitrun.errors import StoreError, UsageError
from habitrun.spec.loader import load_recipe
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.rocrate import MAX_SUBJECT_ACTIONS, METADATA_FILE, export_crate


@app.command()
def export(
    recipe: Optional[Path] = typer.Argument(None, metavar="RECIPE", help="The recipe file (default: recipe.yaml here or in the nearest parent folder)."),  # noqa: UP045
    ro_crate: Optional[Path] = typer.Option(None, "--ro-crate", metavar="DIR", help="Write a Workflow Run RO-Crate into DIR (empty, new, or an earlier crate)."),  # noqa: UP045
    run: Optional[str] = typer.Option(None, "--run", help="A run id or a unique prefix (default: the latest run)."),  # noqa: UP045
    max_subject_actions: int = typer.Option(MAX_SUBJECT_ACTIONS, "--max-subject-actions", min=0, metavar="N",
                                            help="An action per subject and stage while the run has at most N of them; else one per stage."),
) -> None:
    """Export a run as a Workflow Run RO-Crate: the recipe, one action per stage, files with digests."""
    if ro_crate is None:
        raise UsageError("say what to export: --ro-crate DIR (a Workflow Run RO-Crate)")
    path = given_or_found(recipe)
    found = find_run(load_recipe(path).run_root(), run, recipe=path)
    if ro_crate.exists() and (not ro_crate.is_dir() or (any(ro_crate.iterdir())
                                                        and not (ro_crate / METADATA_FILE).is_file())):
        raise UsageError(f"{ro_crate} exists and is not an empty folder or an earlier crate: choose another DIR")
    root = found.source.get("root")
    if not root:
        raise StoreError(f"{found.path / 'source.json'} does not say which folder the run used")
    loaded = load_recipe(found.recipe_file, root=root)
    store_dir = loaded.store_dir()
    if not CheckpointStore.exists(store_dir):
        raise StoreError(f"the run's checkpoint store {store_dir} is gone: nothing to export")
    with CheckpointStore.open(store_dir, create=False, read_only=True) as store:
        store.set_roots(loaded.run_root(), loaded.root)
        try:
            summary = export_crate(ro_crate, run=found, recipe=loaded.recipe, store=store, study_root=loaded.root,
                                   max_subject_actions=max_subject_actions)
        except OSError as exc:
            raise StoreError(f"cannot write the crate into {ro_crate}: {exc}") from None
    typer.echo(f"run {found.run_id}: RO-Crate in {summary.folder} ({summary.stages} stage(s), "
               f"{summary.subject_actions} subject action(s), {summary.files} file(s) listed)")
    for note in summary.notes:
        typer.echo(f"  note: {note}")

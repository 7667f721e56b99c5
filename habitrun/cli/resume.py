"""`habitrun resume [RECIPE or RUN_FOLDER]`: continue the latest run from its stored recipe.

The stored, resolved recipe is what is replayed, so a resume does exactly
what the interrupted run would have done. If the recipe file changed since,
the differences are shown and `--use-current` picks the edited file instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from habitrun.cli.app import app
from habitrun.cli.execute import Selection, execute, load_selected, retry_command
from habitrun.cli.findrecipe import given_or_found
from habitrun.cli.options import Chosen, run_options
from habitrun.cli.runhome import check_run_home, same_folder
from habitrun.cli.text import esc
from habitrun.errors import HabitrunError, RecipeError, StoreError
from habitrun.spec.loader import LoadedRecipe, load_recipe
from habitrun.store.runindex import study_runs
from habitrun.store.runs import RunFolder

DEFAULT_RECIPE = Path("recipe.yaml")


def find_run(target: Path | None) -> tuple[RunFolder | None, Path, Path]:
    """The run to continue (None: no run was ever started), the recipe file and the study root.

    Given a recipe (or its folder), the study is that recipe's folder, wherever the run
    was first made: a copied study (``cp -a A C``) resumes in C, on C's store. Given a
    run folder, the study is the one the run was made in, and the run folder must be
    where that study keeps its runs.
    """
    target = target or DEFAULT_RECIPE
    if target.is_dir() and (target / "source.json").is_file():
        run = RunFolder.open(target)
        recipe_path = Path(run.source["recipe_path"])
        if not RunFolder.is_complete(target):
            raise StoreError(f"{target} is an incomplete run folder (no provenance.json: its runner was killed "
                             f"while making it, before any subject ran); resume the study by its recipe: "
                             f"habitrun resume {shlex.quote(str(recipe_path))}")
        return run, recipe_path, Path(run.source.get("root") or recipe_path.parent)
    if target.is_dir():
        target = target / "recipe.yaml"
    if not target.is_file():
        raise RecipeError(f"{target}: no such recipe file or run folder; give the recipe (habitrun resume RECIPE) "
                          f"or a run folder (.habitrun/runs/<run>)")
    loaded = load_recipe(target)
    runs = study_runs(loaded.run_root())  # also a run that run_dir put elsewhere (store/runindex.py)
    return (runs[-1] if runs else None), target.resolve(), loaded.root


def stored_recipe(run: RunFolder, root: Path) -> LoadedRecipe:
    """The resolved recipe the run stored, loaded against the study folder ``root``."""
    try:
        return load_recipe(run.recipe_file, root=root)
    except RecipeError as exc:
        raise StoreError(f"the recipe stored in {run.path} no longer loads ({exc.problems[0]}); "
                         f"use --use-current to resume with the current recipe file") from None


def _resume_command(target: Path | None) -> str:
    return f"habitrun resume {shlex.quote(str(target or DEFAULT_RECIPE))}"


def _body(resolved_yaml: str) -> list[str]:
    """The resolved recipe's lines without habitrun's header comments."""
    return [line for line in resolved_yaml.splitlines() if not line.startswith("#")]


@app.command()
@run_options
def resume(
    target_given: Optional[Path] = typer.Argument(None, metavar="TARGET", help="Recipe file, study folder or run folder (default: recipe.yaml here or in the nearest parent folder)."),  # noqa: UP045
    use_current: bool = typer.Option(False, "--use-current", help="Use the recipe file as it is now, not as it was run."),
    *,
    chosen: Chosen,
) -> None:
    """Finish the latest run: nothing that finished is repeated, nothing is lost."""
    target = given_or_found(target_given)
    console = Console(highlight=False, soft_wrap=True)
    selection, quiet, report = chosen.selection, chosen.quiet, chosen.report
    recipe_arg = str(target or DEFAULT_RECIPE)
    retry = retry_command("resume", recipe_arg, (), selection)
    previous, recipe_path, root = find_run(target)
    if previous is None:
        # Killed before its first run folder existed: nothing was stored, so resuming is running.
        console.print(f"no earlier run of {esc(recipe_path)} was recorded; starting one", highlight=False)
        loaded = load_selected(recipe_path, (), selection)
        execute(console, loaded, quiet=quiet, recipe_arg=recipe_arg, retry=retry, selection=selection,
                resume=_resume_command(target), report=report, accept_loss=chosen.accept_loss, detach=chosen.detach)
    provenance = previous.read_provenance()
    overrides = tuple(provenance.get("overrides", []))
    stored = stored_recipe(previous, root) if not use_current else None
    if stored is not None:
        # The stored file is the resolved recipe; keep the identity of the recipe the user ran.
        stored = dataclasses.replace(stored, sha256=(provenance.get("recipe") or {}).get("sha256") or stored.sha256,
                                     overrides=overrides)
    current: LoadedRecipe | None = None
    try:
        current = load_recipe(recipe_path, overrides=overrides) if recipe_path.is_file() else None
    except HabitrunError as exc:
        if use_current:
            raise
        console.print(f"[yellow]note:[/] the recipe file no longer loads; resuming with the stored recipe ({esc(exc.message.splitlines()[0])})")
    if stored is not None and current is not None:
        before = _body(previous.recipe_file.read_text())
        after = _body(current.resolved_yaml())
        if before != after:
            diff = "\n".join(difflib.unified_diff(before, after, "as run", "recipe file now", lineterm="", n=1))
            console.print("[yellow]the recipe file changed since this run:[/]")
            console.print(diff, markup=False, highlight=False)
            console.print("resuming with the recipe [bold]as it was run[/]; pass --use-current to use the file as it is now")
    picked = current if use_current else stored
    assert picked is not None
    loaded = picked
    check_run_home(previous, loaded, named=target or DEFAULT_RECIPE)
    made_in = previous.source.get("root")
    if made_in and not same_folder(Path(made_in), root):
        console.print(f"note: run {esc(previous.run_id)} was made in {esc(made_in)}; resuming it here, in "
                      f"{esc(root)}, on this folder's store", highlight=False)
    loaded = with_selection(loaded, selection, stored=not use_current)
    console.print(f"resuming run {esc(previous.run_id)} ({esc(previous.path)})", highlight=False)
    execute(console, loaded, quiet=quiet, recipe_arg=recipe_arg, retry=retry, selection=selection,
            resume=_resume_command(target), resumed_from=previous, source_path=recipe_path, report=report,
            accept_loss=chosen.accept_loss, detach=chosen.detach)


def with_selection(loaded: LoadedRecipe, selection: Selection, *, stored: bool) -> LoadedRecipe:
    """The recipe to resume with the command line's selection applied over its overrides.

    A stored recipe is the resolved one (its overrides already applied): only the
    selection's overrides are applied to it, and added to those it records.
    """
    extra = selection.overrides(loaded)
    if not extra:
        return loaded
    again = load_recipe(loaded.path, extra if stored else (*loaded.overrides, *extra), root=loaded.root)
    return dataclasses.replace(again, sha256=loaded.sha256, overrides=(*loaded.overrides, *extra))

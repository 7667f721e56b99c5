"""`habitrun run RECIPE [overrides...]`: run a study; exit 0 / 1 / 2 / 130."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from habitrun.cli.app import app
from habitrun.cli.progress import RunDisplay
from habitrun.cli.report import write_run_report
from habitrun.cli.summary import print_summary
from habitrun.engine.runner import run_study
from habitrun.errors import StoreWriteError
from habitrun.spec.loader import load_recipe


@app.command()
def run(
    recipe: Path = typer.Argument(..., help="The study's recipe YAML."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted overrides: policy.workers=8 stages.NAME.params.KEY=VALUE"),  # noqa: UP045
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the final summary."),
    report: bool = typer.Option(False, "--report", help="Write report.html into the run folder at the end (as policy.report)."),
) -> None:
    """Run every stage for every subject; subjects already stored as done are skipped."""
    loaded = load_recipe(recipe, overrides=tuple(overrides or ()))
    console = Console(highlight=False, soft_wrap=True)
    try:
        with RunDisplay(console, quiet=quiet) as display:
            summary = run_study(loaded, argv=sys.argv, observer=display.on_event)
    except StoreWriteError as exc:  # a full disk: stopped; say how to go on from here
        raise exc.with_resume(f"habitrun resume {shlex.quote(str(recipe))}") from None
    print_summary(console, summary, recipe_arg=str(recipe))
    if report or loaded.recipe.policy.report:
        write_run_report(console, loaded, summary.run)
    raise typer.Exit(summary.exit_code)

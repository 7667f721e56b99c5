"""`habitrun report RECIPE [-o report.html] [--run RUN_ID]`: the run's HTML report.

One self-contained file (see cli/htmlreport): summary and provenance, per
stage histograms of duration and peak memory against the policy's limits,
a timeline with a lane per worker, and the failures with their log tails.
By default the latest run's report goes into that run's folder. With
``policy.report: true`` or ``run --report`` it is written at the end of
every run. Nothing is written to the store.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from habitrun.cli.app import app, err_console
from habitrun.cli.findrecipe import given_or_found
from habitrun.cli.plan import open_existing_store
from habitrun.cli.text import esc
from habitrun.cli.trace import pick_run
from habitrun.errors import HabitrunError
from habitrun.spec.loader import LoadedRecipe, load_recipe
from habitrun.store.runs import RUNS, RunFolder

REPORT_NAME = "report.html"


def make_report(loaded: LoadedRecipe, run: RunFolder, output: Path | None = None) -> Path:
    """Write ``run``'s report to ``output`` (default: report.html in the run folder)."""
    from habitrun.cli.htmlreport.gather import (
        gather,  # here: `habitrun run` starts faster without it
    )
    from habitrun.cli.htmlreport.page import write_report

    store = open_existing_store(loaded)
    try:
        data = gather(loaded, run, store)
    finally:
        if store is not None:
            store.close()
    return write_report(data, output or run.path / REPORT_NAME)


def write_run_report(console: Console, loaded: LoadedRecipe, run: RunFolder | None) -> None:
    """After a run: its report into its folder. A report that cannot be written is a warning:
    the run's outcome and exit code stay what they were. A run with nothing to do made no
    folder (``run`` is None): there is nothing new to report."""
    if run is None:
        console.print("no report: nothing ran, so this run made no folder; the latest run's report: "
                      f"habitrun report {esc(shlex.quote(str(loaded.path)))}", highlight=False)
        return
    try:
        path = make_report(loaded, run)
    except HabitrunError as exc:
        console.print(f"[yellow]warning:[/] no report: {esc(exc.message)}", highlight=False)
        return
    console.print(f"report: {esc(str(path))}", highlight=False)


@app.command()
def report(
    recipe: Optional[Path] = typer.Argument(None, metavar="RECIPE", help="The recipe file (default: recipe.yaml here or in the nearest parent folder)."),  # noqa: UP045
    output: Optional[Path] = typer.Option(None, "--output", "-o", help=f"The HTML file (default: {REPORT_NAME} in the run's folder)."),  # noqa: UP045
    run: Optional[str] = typer.Option(None, "--run", help="A run id (default: the latest run)."),  # noqa: UP045
) -> None:
    """Write a run's report: one HTML file that opens offline, charts included."""
    loaded = load_recipe(given_or_found(recipe))
    run_id = pick_run(loaded, run if run != "all" else None)
    folder = RunFolder.open(loaded.run_root() / RUNS / str(run_id))
    path = make_report(loaded, folder, output)
    err_console.print(f"report: {esc(str(path))}", highlight=False)

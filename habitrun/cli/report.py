"""`habitrun report [RECIPE] [OVERRIDES...] [-o report.html] [--run RUN_ID]`: the run's HTML report.

One self-contained file (see cli/htmlreport): summary and provenance, per
stage histograms of duration and peak memory against the policy's limits,
a timeline with a lane per worker, and the failures with their log tails.
By default the latest run's report (wherever ``run_dir`` put it) goes into that
run's folder; ``--run ID`` picks another run, ``key=value`` overrides the latest
run made with them. The first line on stderr says which run and overrides. With
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
from habitrun.cli.findrecipe import recipe_and_overrides
from habitrun.cli.text import esc
from habitrun.errors import HabitrunError, UsageError
from habitrun.spec.loader import LoadedRecipe
from habitrun.store.runs import RunFolder
from habitrun.study.opening import open_store

REPORT_NAME = "report.html"


def make_report(loaded: LoadedRecipe, run: RunFolder, output: Path | None = None) -> Path:
    """Write ``run``'s report to ``output`` (default: report.html in the run folder)."""
    from habitrun.cli.htmlreport.gather import (
        gather,  # here: `habitrun run` starts faster without it
    )
    from habitrun.cli.htmlreport.page import write_report

    store = open_store(loaded)
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
    recipe_word: Optional[str] = typer.Argument(None, metavar="RECIPE", help="The recipe file (default: recipe.yaml here or in the nearest parent folder)."),  # noqa: UP045
    overrides: Optional[list[str]] = typer.Argument(None, help="Overrides like run's (key=value): the latest run made with them."),  # noqa: UP045
    output: Optional[Path] = typer.Option(None, "--output", "-o", help=f"The HTML file (default: {REPORT_NAME} in the run's folder)."),  # noqa: UP045
    run: Optional[str] = typer.Option(None, "--run", help="A run id (default: the latest run)."),  # noqa: UP045
) -> None:
    """Write a run's report: one HTML file that opens offline, charts included."""
    from habitrun.study.facade import Study

    recipe, overrides = recipe_and_overrides(recipe_word, overrides)
    study = Study.at_run(recipe, overrides, None if run == "all" else run)
    if study.run is None:
        what = "for these overrides: run the study with them" if overrides else "yet: run the study first"
        raise UsageError(f"no run of {study.loaded.path} {what} "
                         f"({shlex.join(['habitrun', 'run', str(study.loaded.path), *overrides])})")
    path = make_report(study.loaded, study.run, output)
    err_console.print(esc(study.about.line()), highlight=False)
    err_console.print(f"report: {esc(str(path))}", highlight=False)

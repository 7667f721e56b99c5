"""`habitrun run RECIPE [overrides...]`: run a study; exit 0 / 1 / 2 / 130."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from habitrun.cli.app import app
from habitrun.cli.execute import (
    RECORD_NOOP_HELP,
    RERUN_HELP,
    RETRY_FAILED_HELP,
    STAGE_HELP,
    Selection,
    execute,
    load_selected,
    retry_command,
)


@app.command()
def run(
    recipe: Path = typer.Argument(..., help="The study's recipe YAML."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted overrides: policy.workers=8 stages.NAME.params.KEY=VALUE"),  # noqa: UP045
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the final summary."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help=RETRY_FAILED_HELP),
    rerun: Optional[list[str]] = typer.Option(None, "--rerun", metavar="SUBJECT", help=RERUN_HELP),  # noqa: UP045
    stage: Optional[str] = typer.Option(None, "--stage", metavar="NAME", help=STAGE_HELP),  # noqa: UP045
    record_noop: bool = typer.Option(False, "--record-noop", help=RECORD_NOOP_HELP),
    report: bool = typer.Option(False, "--report", help="Write report.html into the run folder at the end (as policy.report)."),
) -> None:
    """Run every stage for every subject; subjects already stored as done are skipped."""
    selection = Selection(retry_failed, tuple(rerun or ()), stage, record_noop)
    loaded = load_selected(recipe, overrides or (), selection)
    console = Console(highlight=False, soft_wrap=True)
    execute(console, loaded, quiet=quiet, recipe_arg=str(recipe), selection=selection,
            retry=retry_command("run", str(recipe), overrides or (), selection),
            resume=f"habitrun resume {shlex.quote(str(recipe))}", report=report)

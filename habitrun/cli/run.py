"""`habitrun run RECIPE [overrides...]`: run a study; exit 0 / 1 / 2 / 130."""

from __future__ import annotations

import shlex
from typing import Optional

import typer
from rich.console import Console

from habitrun.cli.app import app
from habitrun.cli.execute import execute, load_selected, retry_command
from habitrun.cli.findrecipe import recipe_and_overrides
from habitrun.cli.options import Chosen, run_options


@app.command()
@run_options
def run(
    recipe_word: Optional[str] = typer.Argument(None, metavar="RECIPE", help="The recipe file (default: recipe.yaml here or in the nearest parent folder)."),  # noqa: UP045
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted overrides: policy.workers=8 stages.NAME.params.KEY=VALUE"),  # noqa: UP045
    *,
    chosen: Chosen,
) -> None:
    """Run every stage for every subject; subjects already stored as done are skipped."""
    recipe, overrides = recipe_and_overrides(recipe_word, overrides)
    selection = chosen.selection
    loaded = load_selected(recipe, overrides or (), selection)
    console = Console(highlight=False, soft_wrap=True)
    execute(console, loaded, quiet=chosen.quiet, recipe_arg=str(recipe), selection=selection,
            retry=retry_command("run", str(recipe), overrides or (), selection),
            resume=f"habitrun resume {shlex.quote(str(recipe))}", report=chosen.report,
            accept_loss=chosen.accept_loss, detach=chosen.detach)

"""`habitrun results [RECIPE] STAGE [-o FILE]`: a stage's current results as a table (or JSON).

A map stage gives one row per subject (see planner/results.py) as CSV, TSV,
JSON lines or Parquet by the file's suffix, CSV on stdout without ``-o``. A
collect or train stage's single result is written as it is, as JSON.
Nothing is written to the store. With one positional it is the stage (the recipe
is found as every command finds it: habitrun/cli/findrecipe.py); with two, the recipe
and the stage: a word is never guessed to be one or the other from what exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from habitrun.cli.app import app, err_console
from habitrun.cli.findrecipe import find_recipe, given_or_found
from habitrun.cli.tables import write_json, write_table
from habitrun.cli.text import esc
from habitrun.errors import UsageError
from habitrun.planner.results import group_result, stage_table
from habitrun.spec.loader import load_recipe


def recipe_and_stage(first: str | None, second: str | None) -> tuple[Path, str | None]:
    """``RECIPE STAGE``, or ``STAGE`` alone (the recipe found upward): one word is always the stage."""
    if second is not None:
        return given_or_found(first), second
    return find_recipe(), first


@app.command()
def results(
    first: Optional[str] = typer.Argument(None, metavar="RECIPE", help="The recipe file (default: recipe.yaml here or in the nearest parent folder). One word alone is the STAGE."),  # noqa: UP045
    second: Optional[str] = typer.Argument(None, metavar="STAGE", help="The stage whose results to write."),  # noqa: UP045
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="File to write: .csv .tsv .jsonl .parquet (a collect stage: .json). Default: CSV on stdout."),  # noqa: UP045
    manifest: bool = typer.Option(False, "--manifest", help="Add the manifest's fields as columns."),
) -> None:
    """Write a stage's current results: one row per subject, the result's keys as columns."""
    recipe, stage = recipe_and_stage(first, second)
    loaded = load_recipe(recipe)
    kinds = {s.name: s.kind for s in loaded.recipe.stages}
    if stage is None:
        raise UsageError(f"give the stage: habitrun results [RECIPE] STAGE; its stages are: {', '.join(kinds)}")
    if stage not in kinds:
        raise UsageError(f"the recipe has no stage {stage!r}; its stages are: {', '.join(kinds)}")
    kind = kinds[stage]
    if kind != "map":
        if output is not None and output.suffix.lower() != ".json":
            raise UsageError(f"stage {stage!r} is a {kind} stage with one result: write it as JSON (-o result.json)")
        write_json(output, group_result(loaded, stage))
    else:
        if output is not None and output.suffix.lower() == ".json":
            raise UsageError(f"stage {stage!r} is a map stage: write a table (.csv .tsv .jsonl .parquet)")
        columns, rows = stage_table(loaded, stage, manifest=manifest)
        write_table(output, columns, rows)
    if output is not None:
        err_console.print(f"wrote {esc(str(output))}", highlight=False)

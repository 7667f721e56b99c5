"""`habitrun results [RECIPE] STAGE [OVERRIDES...] [--run ID] [-o FILE]`: a stage's current results as a table (or JSON).

A map stage gives one row per subject (see study/results.py): the subject id and
the operator's result columns (``--meta`` adds status, error and costs), as CSV,
TSV, JSON lines or Parquet by the file's suffix, CSV on stdout without ``-o``. A
collect or train stage's single result is written as it is, as JSON. The results
are those of the latest run (its overrides and store), of ``--run ID``, or of the
``key=value`` overrides given; the first line on stderr says which. Nothing is
written to the store. With one word it is the stage (the recipe is found as every
command finds it: habitrun/cli/findrecipe.py); with two, the recipe and the stage:
a word is never guessed to be one or the other from what exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from habitrun.cli.app import app, err_console
from habitrun.cli.findrecipe import find_recipe, given_or_found, is_override
from habitrun.cli.tables import write_json, write_table
from habitrun.cli.text import esc
from habitrun.errors import UsageError
from habitrun.study.facade import Study
from habitrun.study.results import group_result, is_group_stage, stage_table


def recipe_and_stage(first: str | None, second: str | None) -> tuple[Path, str | None]:
    """``RECIPE STAGE``, or ``STAGE`` alone (the recipe found upward): one word is always the stage."""
    if second is not None:
        return given_or_found(first), second
    return find_recipe(), first


def split_words(words: list[str]) -> tuple[Path, str | None, list[str]]:
    """The recipe, the stage and the overrides (``key=value`` words that name no file), in that order."""
    plain = [w for w in words if not is_override(w)]
    overrides = [w for w in words if is_override(w)]
    if len(plain) > 2:
        raise UsageError(f"give at most RECIPE and STAGE before the overrides; got {', '.join(plain)}")
    recipe, stage = recipe_and_stage(*(plain + [None, None])[:2])
    return recipe, stage, overrides


@app.command()
def results(
    first: Optional[str] = typer.Argument(None, metavar="RECIPE", help="The recipe file (default: recipe.yaml here or in the nearest parent folder). One word alone is the STAGE."),  # noqa: UP045
    second: Optional[str] = typer.Argument(None, metavar="STAGE", help="The stage whose results to write."),  # noqa: UP045
    overrides: Optional[list[str]] = typer.Argument(None, help="Overrides like run's (key=value): the results those values select."),  # noqa: UP045
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="File to write: .csv .tsv .jsonl .parquet (a collect stage: .json). Default: CSV on stdout."),  # noqa: UP045
    manifest: bool = typer.Option(False, "--manifest", help="Add the manifest's fields as columns."),
    meta: bool = typer.Option(False, "--meta", help="Add each subject's status, failure kind, error, duration, CPU and peak memory."),
    run: Optional[str] = typer.Option(None, "--run", help="A run id: its results (default: the latest run's)."),  # noqa: UP045
) -> None:
    """Write a stage's current results: one row per subject, the result's keys as columns."""
    words = [w for w in (first, second, *(overrides or ())) if w is not None]
    recipe, stage, given = split_words(words)
    study = Study.at_run(recipe, given, run)
    kinds = {s.name: s.kind for s in study.loaded.recipe.stages}
    if stage is None:
        raise UsageError(f"give the stage: habitrun results [RECIPE] STAGE; its stages are: {', '.join(kinds)}")
    if is_group_stage(study, stage):
        if output is not None and output.suffix.lower() != ".json":
            raise UsageError(f"stage {stage!r} is a {kinds[stage]} stage with one result: write it as JSON (-o result.json)")
        value = group_result(study, stage)
        typer.echo(study.about.line(), err=True)  # plain: rich is not loaded for it
        write_json(output, value)
    else:
        if output is not None and output.suffix.lower() == ".json":
            raise UsageError(f"stage {stage!r} is a map stage: write a table (.csv .tsv .jsonl .parquet)")
        columns, rows = stage_table(study, stage, manifest=manifest, meta=meta)
        typer.echo(study.about.line(), err=True)  # plain: rich is not loaded for it
        write_table(output, columns, rows)
    if output is not None:
        err_console.print(f"wrote {esc(str(output))}", highlight=False)

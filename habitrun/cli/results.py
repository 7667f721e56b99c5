"""`habitrun results RECIPE STAGE [-o FILE]`: a stage's current results as a table (or JSON).

A map stage gives one row per subject (see planner/results.py) as CSV, TSV,
JSON lines or Parquet by the file's suffix, CSV on stdout without ``-o``. A
collect or train stage's single result is written as it is, as JSON.
Nothing is written to the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from habitrun.cli.app import app, err_console
from habitrun.cli.tables import write_json, write_table
from habitrun.cli.text import esc
from habitrun.errors import UsageError
from habitrun.planner.results import group_result, stage_table
from habitrun.spec.loader import load_recipe


@app.command()
def results(
    recipe: Path = typer.Argument(..., help="The study's recipe YAML."),
    stage: str = typer.Argument(..., help="The stage whose results to write."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="File to write: .csv .tsv .jsonl .parquet (a collect stage: .json). Default: CSV on stdout."),  # noqa: UP045
    manifest: bool = typer.Option(False, "--manifest", help="Add the manifest's fields as columns."),
) -> None:
    """Write a stage's current results: one row per subject, the result's keys as columns."""
    loaded = load_recipe(recipe)
    kinds = {s.name: s.kind for s in loaded.recipe.stages}
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

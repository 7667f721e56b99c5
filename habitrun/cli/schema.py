"""`habitrun schema [--out DIR]`: write the recipe and RunPolicy JSON Schemas.

The files are checked in under ``schemas/``; a recipe's first line
``# yaml-language-server: $schema=schemas/recipe.schema.json`` then gives
completion and checking in editors.
"""

from __future__ import annotations

from pathlib import Path

import typer

from habitrun.cli.app import app
from habitrun.errors import UsageError
from habitrun.spec.schemas import write_schemas


@app.command()
def schema(
    out: Path = typer.Option(Path("schemas"), "--out", "-o", help="Folder to write the schema files into."),
) -> None:
    """Write schemas/recipe.schema.json and schemas/run-policy.schema.json."""
    try:
        written = write_schemas(out)
    except OSError as exc:  # exit 2 with the reason, as every command that writes a file
        raise UsageError(f"cannot write the schemas into {out}: {exc.strerror or exc}") from None
    for path in written:
        typer.echo(f"wrote {path}")

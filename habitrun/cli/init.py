"""`habitrun init DIR`: a small working study to start from.

It writes a recipe (with the editor-schema header), a small data/ tree whose
files the recipe finds (subjects.from), a clinical manifest, an operator
package ``study_ops/`` (a function, a class and a collect operator) and the
JSON Schemas the header points to. It never overwrites a file.
"""

from __future__ import annotations

import json
import shlex
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from habitrun.cli.app import app
from habitrun.errors import RecipeError, UsageError
from habitrun.spec.schemas import FILES, schema_text

if TYPE_CHECKING:  # importlib.resources.abc is 3.11+; importlib.abc.Traversable is gone in 3.14
    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:
        from importlib.abc import Traversable

RENAMED = {"gitignore": ".gitignore"}  # dot-files do not survive every packaging tool


def _template_files(folder: Traversable, prefix: str = "") -> list[tuple[str, Traversable]]:
    out = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name == "__pycache__":
            continue
        rel = f"{prefix}{RENAMED.get(entry.name, entry.name)}"
        if entry.is_dir():
            out.extend(_template_files(entry, rel + "/"))
        else:
            out.append((rel, entry))
    return out


def study_files(name: str) -> dict[str, str]:
    """Relative path -> text of every file of a new study named ``name``."""
    root = resources.files("habitrun.cli").joinpath("templates").joinpath("study")
    files = {}
    for rel, entry in _template_files(root):
        text = entry.read_text(encoding="utf-8")
        if rel == "recipe.yaml":
            text = text.replace("{{name}}", json.dumps(name))
        files[rel] = text
    for filename, model in FILES.items():
        files[f"schemas/{filename}"] = schema_text(model, filename)
    return files


@app.command()
def init(
    folder: Path = typer.Argument(..., help="Folder for the new study (created if missing)."),
    name: str = typer.Option(None, "--name", help="Study name (default: the folder's name)."),
) -> None:
    """Write a small working study: recipe.yaml, data/ (found by subjects.from), clinical.csv, study_ops/."""
    files = study_files(name or folder.resolve().name or "study")
    clashes = [rel for rel in files if (folder / rel).exists()]
    if clashes:
        raise RecipeError([f"{folder / rel}: already exists; habitrun init never overwrites" for rel in clashes])
    if folder.exists() and not folder.is_dir():
        raise RecipeError([f"{folder}: exists and is not a folder"])
    for rel, text in files.items():
        target = folder / rel
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        except OSError as exc:  # a read-only or missing parent, a full disk: exit 2, never a traceback
            raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from None
    typer.echo(f"wrote a new study in {folder}:")
    for rel in files:
        typer.echo(f"  {rel}")
    recipe = str(folder / "recipe.yaml")
    typer.echo(f"next: {shlex.join(['habitrun', 'validate', recipe])}  then  {shlex.join(['habitrun', 'run', recipe])}")

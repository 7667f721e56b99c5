"""The one rule for a command's recipe argument: optional, found in the current folder or upward like git.

Every command that reads a study (`run`, `resume`, `plan`, `status`, `validate`,
`results`, `trace`, `report`, `gc`) takes its recipe as an optional first
positional. Left out, it is ``recipe.yaml`` in the current folder or the nearest
parent folder that has one; the search stops at the filesystem root or at a folder
holding ``.git`` (a study lives inside its repository), as git and DVC look for
their own folders. A first positional with ``=`` that is no file is an override
(`habitrun run policy.workers=2`). Only the standard library is imported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from habitrun.errors import UsageError

RECIPE_NAME = "recipe.yaml"


def search_upward(start: Path | None = None) -> tuple[Path | None, Path]:
    """The nearest ``recipe.yaml`` from ``start`` (default: the current folder) upward, and where the search stopped."""
    folder = (start or Path.cwd()).absolute()
    while True:
        candidate = folder / RECIPE_NAME
        if candidate.is_file():
            return candidate, folder
        if (folder / ".git").exists() or folder.parent == folder:
            return None, folder
        folder = folder.parent


def find_recipe(start: Path | None = None) -> Path:
    """The recipe a command uses when none is given (UsageError: none).

    ``recipe.yaml`` when it is in the current folder, else its absolute path: the
    paths and the commands printed from it then read without ``../..``.
    """
    found, stopped = search_upward(start)
    if found is None:
        raise UsageError(f"no {RECIPE_NAME} here or in any parent folder up to {stopped}; give its path")
    return Path(RECIPE_NAME) if found.parent == Path.cwd().absolute() else found


def is_override(word: str) -> bool:
    """Whether a first positional is an override (``key=value``) rather than a recipe path."""
    return "=" in word and not Path(word).exists()


def recipe_and_overrides(recipe: str | None, overrides: Sequence[str] | None) -> tuple[Path, list[str]]:
    """The recipe (given, or found upward) and the overrides, for commands taking ``[RECIPE] [OVERRIDES]...``.

    The words arrive as text (not typer's ``Path``, which would rewrite ``key=/a//b/`` as ``key=/a/b``).
    """
    rest = list(overrides or ())
    if recipe is not None and is_override(recipe):
        rest.insert(0, recipe)
        recipe = None
    return (Path(recipe) if recipe is not None else find_recipe()), rest


def given_or_found(recipe: str | Path | None) -> Path:
    """The recipe given, or found upward: for commands whose only positional is the recipe."""
    return Path(recipe) if recipe is not None else find_recipe()

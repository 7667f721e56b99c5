"""Load a recipe file: YAML with positions -> overrides -> interpolation -> models.

Every problem on the way is collected and raised together as one
:class:`RecipeError`, each as ``file:line:col: field.path: message`` (or,
for a value set on the command line, ``override 'k=v': field.path: message``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from habitrun.errors import RecipeError
from habitrun.spec.interpolate import Interpolator, escape
from habitrun.spec.messages import problems_of
from habitrun.spec.overrides import apply_overrides
from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import Recipe
from habitrun.spec.yamlpos import Path_, Positions, dump_yaml, format_path, load_with_positions

DEFAULT_RUN_DIR = ".habitrun"


@dataclass(frozen=True)
class Locator:
    """Turns a field path into the ``file:line:col: path`` (or ``override '...': path``) prefix."""

    positions: Positions
    origins: dict[Path_, str] = field(default_factory=dict)

    def __call__(self, path: Path_, *, key: bool = False) -> str:
        for n in range(len(path), -1, -1):
            origin = self.origins.get(tuple(path[:n]))
            if origin is not None:
                return f"override {origin!r}: {format_path(path)}"
        line, col = self.positions.locate(path, key=key)
        return f"{self.positions.source}:{line}:{col}: {format_path(path)}"


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe and everything about where it came from."""

    recipe: Recipe
    path: Path
    root: Path
    text: str
    sha256: str
    overrides: tuple[str, ...]
    resolved: dict[str, Any]
    locate: Locator = field(repr=False, compare=False)

    @property
    def search_path(self) -> tuple[str, ...]:
        """Folders importable for operators: the recipe's own folder (root)."""
        return (str(self.root),)

    def _under_root(self, value: str) -> Path:
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.root / path

    def run_root(self) -> Path:
        """Folder for runs, store and lock: ``run_dir`` against root, default ``root/.habitrun``."""
        return self._under_root(self.recipe.run_dir or DEFAULT_RUN_DIR)

    def store_dir(self) -> Path:
        """The checkpoint store: ``policy.checkpoint_dir`` against root, default ``run_root()/store``."""
        if self.recipe.policy.checkpoint_dir:
            return self._under_root(self.recipe.policy.checkpoint_dir)
        return self.run_root() / "store"

    def stage_policy(self, name: str) -> RunPolicy:
        """The recipe's policy with stage ``name``'s override merged over it."""
        return self.recipe.stage_policy(name)

    def resolved_yaml(self) -> str:
        """YAML of :attr:`resolved` that loads back (with ``root=self.root``) to an equal Recipe."""
        return f"# resolved by habitrun from {self.path}\n" + dump_yaml(_escaped(self.resolved))


def _escaped(data: dict[str, Any]) -> dict[str, Any]:
    """Resolved strings written so interpolation reads them back unchanged."""

    def walk(value: Any, runtime_ok: bool = False) -> Any:
        if isinstance(value, str):
            return escape(value, runtime_ok)
        if isinstance(value, dict):
            return {k: walk(v, runtime_ok) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, runtime_ok) for v in value]
        return value

    out = {k: walk(v) for k, v in data.items() if k != "stages"}
    if "stages" in data:
        out["stages"] = [
            {k: walk(v, s.get("kind") == "train" and k == "command") for k, v in s.items()}
            for s in data["stages"]
        ]
    return out


def _read(path: Path, source: str) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise RecipeError([f"{source}: no such recipe file"]) from None
    except IsADirectoryError:
        raise RecipeError([f"{source}: is a folder; give the recipe file (e.g. {source}/recipe.yaml)"]) from None
    except OSError as exc:
        raise RecipeError([f"{source}: cannot read the recipe: {exc.strerror or exc}"]) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise RecipeError([f"{source}:{line}:1: syntax: the recipe is not UTF-8 text"]) from None


def load_recipe(
    path: str | Path,
    overrides: Sequence[str] = (),
    root: str | Path | None = None,
) -> LoadedRecipe:
    """Read, override, interpolate and validate a recipe; raise RecipeError listing every problem."""
    source = str(path)
    file = Path(path).expanduser().absolute()
    text = _read(file, source)
    data, positions = load_with_positions(text, source)
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise RecipeError([
            f"{source}:1:1: (top level): expected a mapping (habitrun: 1, name, subjects, stages ...), got {got}"
        ])
    _ids_as_written(data, positions)
    overrides = tuple(overrides)
    data, origins = apply_overrides(data, overrides)
    locate = Locator(positions, origins)
    problems: list[str] = []

    def report(at: Path_, message: str) -> None:
        problems.append(f"{locate(at)}: {message}")

    resolved = Interpolator(data, report).document(data)
    if problems:
        raise RecipeError(problems)
    try:
        recipe = Recipe.model_validate(resolved)
    except ValidationError as exc:
        for problem in problems_of(exc, resolved, Recipe):
            problems.append(f"{locate(problem.path, key=problem.at_key)}: {problem.message}")
        raise RecipeError(_sorted(problems)) from None
    return LoadedRecipe(
        recipe=recipe,
        path=file,
        root=Path(root).expanduser().absolute() if root is not None else file.parent,
        text=text,
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        overrides=overrides,
        resolved=resolved,
        locate=locate,
    )


def _ids_as_written(data: dict[str, Any], positions: Positions) -> None:
    """Unquoted numbers in subjects.include/exclude become their text as written (``002``, not 2).

    Subject ids are text: YAML reads ``include: [1, 002]`` as the integers 1 and 2,
    while the manifest's id is '002'.
    """
    subjects = data.get("subjects")
    if not isinstance(subjects, dict):
        return
    for name in ("include", "exclude"):
        ids = subjects.get(name)
        if isinstance(ids, list):
            subjects[name] = [
                positions.ints.get(("subjects", name, i), item) if type(item) is int else item
                for i, item in enumerate(ids)
            ]


def _sorted(problems: list[str]) -> list[str]:
    """File order (by line, then column); override problems last, in the order given."""

    def key(problem: str) -> tuple[int, int, int]:
        parts = problem.split(":", 3)
        if len(parts) > 3 and parts[1].isdigit() and parts[2].isdigit():
            return (0, int(parts[1]), int(parts[2]))
        return (1, 0, 0)

    return sorted(dict.fromkeys(problems), key=key)

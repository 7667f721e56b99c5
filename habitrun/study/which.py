"""Which run a read command answers about, with which recipe and overrides: chosen in one place.

`status`, `results`, `trace` and `report` answer about a run: by default the
study's latest (wherever ``run_dir`` put it: :mod:`habitrun.store.runindex`),
planned with the resolved recipe that run stored, so its overrides and its store
are the ones read; ``--run ID`` picks another. Given ``key=value`` overrides
they answer about what those values select, from the recipe file as it is now
(the run named is then the latest made with exactly those overrides, if any).
`plan` and `gc` always take the recipe file with the overrides given.

A run made from the recipe file as it is now, without overrides and without
``${env:...}``, stored exactly what the file resolves to: the file already read
is taken then, instead of parsing the stored copy again (about 10 ms).

What chose a run's subjects to (re)run (``--retry-failed``, ``--rerun``: the
policy fields ``retry_failed_subjects`` and ``force_rerun_subjects``) selects no
result: a read command takes those fields from the recipe file, so a subject a
run was told to rerun is not shown as still to be forced.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from habitrun.errors import HabitrunError, RecipeError, StoreError, UsageError
from habitrun.spec.loader import LoadedRecipe, load_recipe

if TYPE_CHECKING:  # `plan` never lists runs: it does not import them (about 10 ms of start-up)
    from habitrun.store.runs import RunFolder

_SELECTION = re.compile(r"^(stages\.[^=]+\.)?policy\.(retry_failed_subjects|force_rerun_subjects)$")
_EMPTY = {"retry_failed_subjects": False, "force_rerun_subjects": []}


def override_key(override: str) -> str:
    return override.partition("=")[0].strip()


def selecting(overrides: Sequence[str]) -> tuple[str, ...]:
    """The overrides that select results: all but those that only chose what to (re)run."""
    return tuple(o for o in overrides if not _SELECTION.match(override_key(o)))


@dataclass(frozen=True)
class About:
    """What a read command answers about: a run (or none) and the overrides its recipe carries."""

    run: RunFolder | None
    overrides: tuple[str, ...]
    source: str  # "run": the recipe that run stored; "file": the recipe file with the overrides given

    def words(self) -> str:
        """``overrides: a=1 b=2`` or ``no overrides``."""
        return "overrides: " + " ".join(self.overrides) if self.overrides else "no overrides"

    def line(self) -> str:
        """The first line a read command prints: which run, which overrides."""
        if self.source == "run" and self.run is not None:
            used = ", as that run used them" if self.overrides else ""
            return f"about run {self.run.run_id} ({self.words()}{used})"
        if self.run is not None:
            return f"about {self.words()} (the recipe file as it is now; run {self.run.run_id} used them)"
        return f"about {self.words()} (the recipe file as it is now; no run used them)"

    def as_json(self) -> dict[str, Any]:
        return {"run": self.run.run_id if self.run is not None else None, "overrides": list(self.overrides),
                "recipe": "as run" if self.source == "run" else "file"}


def run_overrides(run: RunFolder) -> tuple[str, ...]:
    """The overrides a run recorded (in its provenance)."""
    return tuple(str(o) for o in run.read_provenance().get("overrides") or ())


def runs_of(home: LoadedRecipe, *more: Path) -> list[RunFolder]:
    """Every run of the study whose recipe file is ``home`` (loaded without overrides), oldest first."""
    from habitrun.store.runindex import study_runs

    return study_runs(home.run_root(), *more)


def find_run(runs: list[RunFolder], run_id: str, home: LoadedRecipe) -> RunFolder:
    """The run named ``run_id`` (UsageError naming the latest ones)."""
    for run in runs:
        if run.run_id == run_id:
            return run
    shown = ", ".join(r.run_id for r in runs[-5:]) or "none"
    raise UsageError(f"no run {run_id!r} of {home.path} (under {home.run_root() / 'runs'} or listed there; "
                     f"latest: {shown})")


def recipe_of_run(run: RunFolder, home: LoadedRecipe, extra: Sequence[str] = ()) -> LoadedRecipe:
    """The resolved recipe ``run`` stored, loaded against the study folder, with the recipe file's own
    selection fields and then ``extra`` overrides applied; it keeps the recipe file's path."""
    provenance = run.read_provenance()
    recorded = tuple(str(o) for o in provenance.get("overrides") or ())
    sha = (provenance.get("recipe") or {}).get("sha256")
    if not recorded and not extra and sha == home.sha256 and "${env:" not in home.text:
        return home  # the file as that run read it, with nothing over it: its resolved recipe, parsed once
    restore = [f"{override_key(o)}={_file_value(home, override_key(o))}"
               for o in recorded if _SELECTION.match(override_key(o))]
    try:
        loaded = load_recipe(run.recipe_file, (*restore, *extra), root=home.root)
    except RecipeError as exc:
        if extra:
            raise
        raise StoreError(f"the recipe stored in {run.path} no longer loads ({exc.problems[0]}); name the values "
                         "to read as overrides instead") from None
    loaded = _moved_data(loaded, home, recorded, extra)
    return dataclasses.replace(loaded, path=home.path, sha256=sha or loaded.sha256,
                               overrides=(*selecting(recorded), *extra))


def _moved_data(stored: LoadedRecipe, home: LoadedRecipe, recorded: Sequence[str],
                extra: Sequence[str]) -> LoadedRecipe:
    """The recipe file with the run's overrides, where it differs from the run's stored recipe only
    outside its stages and policy (a data folder moved and its ``vars`` value changed, a description):
    the run's results, read from where the study's files are now. Else the stored recipe."""
    kept = [o for o in recorded if not _SELECTION.match(override_key(o))]
    try:
        now = load_recipe(home.path, (*kept, *extra), root=home.root)
    except RecipeError:
        return stored
    same = all(now.resolved.get(part) == stored.resolved.get(part) for part in ("stages", "policy", "run_dir"))
    return now if same and now.resolved != stored.resolved else stored


def _file_value(home: LoadedRecipe, key: str) -> str:
    """The value the recipe file gives ``key`` (a selection field), as override text."""
    value: Any = home.resolved
    parts = key.split(".")
    for i, part in enumerate(parts):
        if isinstance(value, list) and i and parts[i - 1] == "stages":
            value = next((s for s in value if isinstance(s, dict) and s.get("name") == part), None)
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            value = None
        if value is None:
            value = _EMPTY[parts[-1]]
            break
    return json.dumps(value, ensure_ascii=False)  # JSON is YAML: read back as the same value


def home_elsewhere(loaded: LoadedRecipe, recipe_file: Path | None = None) -> Path | None:
    """The run root of the recipe file as written (no overrides), when ``loaded`` (what a run uses) keeps
    its runs elsewhere: where that run is listed (:mod:`habitrun.store.runindex`); else None.

    Only a recipe with overrides can differ from its file (a ``run_dir`` given, or a ``vars`` value it
    uses): the file is read again only then.
    """
    if not loaded.overrides:
        return None
    try:
        home = load_recipe(recipe_file or loaded.path).run_root()
    except HabitrunError:
        return None
    return None if os.path.realpath(home) == os.path.realpath(loaded.run_root()) else home


def choose(recipe: Path, overrides: Sequence[str] = (), run_id: str | None = None) -> tuple[LoadedRecipe, About]:
    """The recipe to read with and what it answers about (see the module docstring)."""
    home = load_recipe(recipe)
    overrides = tuple(overrides)
    if run_id is not None:
        extra = load_recipe(recipe, overrides) if overrides else None
        run = find_run(runs_of(home, *((extra.run_root(),) if extra else ())), run_id, home)
        loaded = recipe_of_run(run, home, overrides)
        return loaded, About(run, loaded.overrides, "run")
    if overrides:
        loaded = load_recipe(recipe, overrides)
        wanted = sorted(selecting(overrides))
        same = [r for r in runs_of(home, loaded.run_root()) if sorted(selecting(run_overrides(r))) == wanted]
        return loaded, About(same[-1] if same else None, selecting(overrides), "file")
    runs = runs_of(home)
    if not runs:
        return home, About(None, (), "file")
    loaded = recipe_of_run(runs[-1], home)
    return loaded, About(runs[-1], loaded.overrides, "run")

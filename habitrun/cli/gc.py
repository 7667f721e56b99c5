"""`habitrun gc RECIPE [--yes]`: delete work folders and stored records no current key uses.

Every cache key has its own work folder (``work/<stage>/<subject>/<key
folder>``), so changing a param and back never mixes versions; the price is
that old versions pile up. `gc` plans the recipe as it is now (with the
overrides given), and lists what no current key refers to: records of other
keys (and their result files) and key folders of other keys, of removed
stages and of subjects gone from the manifest, and the SLURM batch folders a run
merged for good (``closed``: none is read again). It deletes them only with
``--yes``, holding the study's lock, and prints the space freed. Anything in
``work/`` that is not a key folder (a file, or a folder written before work
folders were per key) is left alone and counted.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from habitrun.cli.app import app
from habitrun.cli.findrecipe import recipe_and_overrides
from habitrun.cli.plan import make_console
from habitrun.cli.text import command, esc
from habitrun.engine.slurm.backend import CLOSED_FILE, slurm_folder
from habitrun.engine.stage_inputs import GROUP_FILE_NAME
from habitrun.planner.plan import GROUP_SUBJECT, Plan
from habitrun.spec.loader import LoadedRecipe
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.runs import WORK, is_key_folder, key_folder
from habitrun.study.facade import Study

if TYPE_CHECKING:
    from rich.console import Console


@dataclass
class Garbage:
    """What no current key uses."""

    records: list[str] = field(default_factory=list)
    record_bytes: int = 0
    folders: list[Path] = field(default_factory=list)
    folder_bytes: int = 0
    left_alone: int = 0
    batches: list[Path] = field(default_factory=list)  # SLURM batch folders merged for good (closed)
    batch_bytes: int = 0


def _size(path: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def current_folders(loaded: LoadedRecipe, plan: Plan, subjects: Sequence[Any]) -> dict[tuple[str, str], str]:
    """(stage, subject folder name) -> the key folder its current key uses."""
    safe = {row.id: row.safe for row in subjects}
    out: dict[tuple[str, str], str] = {}
    for stage in plan:
        for sid, key in stage.keys.items():
            name = GROUP_FILE_NAME if sid == GROUP_SUBJECT else safe.get(sid)
            if name is not None:
                out[(stage.name, name)] = key_folder(key)
    return out


def find_garbage(loaded: LoadedRecipe, plan: Plan, subjects: Sequence[Any], store: CheckpointStore | None) -> Garbage:
    garbage = Garbage()
    current = {stage.name: set(stage.keys.values()) for stage in plan}
    if store is not None:
        for key, stage, _sid, size in store.entries():
            if key not in current.get(stage, ()):
                garbage.records.append(key)
                garbage.record_bytes += size
    wanted = current_folders(loaded, plan, subjects)
    work = loaded.run_root() / WORK
    for stage_dir in sorted(work.iterdir()) if work.is_dir() else ():
        for subject_dir in sorted(stage_dir.iterdir()) if stage_dir.is_dir() and not stage_dir.is_symlink() else ():
            if not subject_dir.is_dir() or subject_dir.is_symlink():
                garbage.left_alone += 1
                continue
            keep = wanted.get((stage_dir.name, subject_dir.name))
            for entry in sorted(subject_dir.iterdir()):
                if not is_key_folder(entry.name) or entry.is_symlink() or not entry.is_dir():
                    garbage.left_alone += 1
                elif entry.name != keep:
                    garbage.folders.append(entry)
                    garbage.folder_bytes += _size(entry)
    batches = slurm_folder(loaded.run_root())
    for batch in sorted(batches.iterdir()) if batches.is_dir() else ():
        if batch.is_dir() and not batch.is_symlink() and (batch / CLOSED_FILE).is_file():
            garbage.batches.append(batch)
            garbage.batch_bytes += _size(batch)
    return garbage


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _collect(study: Study, store: CheckpointStore | None) -> tuple[Sequence[Any], Garbage]:
    subjects = study.subjects()
    plan = study.plan(subjects, store)
    return subjects, find_garbage(study.loaded, plan, subjects, store)


@app.command()
def gc(
    recipe_word: Optional[str] = typer.Argument(None, metavar="RECIPE", help="The recipe file (default: recipe.yaml here or in the nearest parent folder)."),  # noqa: UP045
    overrides: list[str] = typer.Argument(None, help="Overrides, as for `run`: the keys they give are current."),
    yes: bool = typer.Option(False, "--yes", "--delete", help="Delete (without it: only list what would go)."),
    show: int = typer.Option(10, "--show", help="Work folders listed (0: all)."),
) -> None:
    """Delete work folders and stored records that no current cache key uses (dry run by default)."""
    recipe, overrides = recipe_and_overrides(recipe_word, overrides)
    study = Study.of_file(recipe, tuple(overrides or ()))
    loaded = study.loaded
    again = command("habitrun", "gc", recipe, *overrides, "--yes")  # the exact command that deletes
    console = make_console()
    if not CheckpointStore.exists(loaded.store_dir()) and not (loaded.run_root() / WORK).is_dir() \
            and not slurm_folder(loaded.run_root()).is_dir():
        _report(console, loaded, Garbage(), show, done=yes, again=again)  # nothing has run: nothing to create or delete
        return
    if not yes:
        store = study.store()
        try:
            _subjects, garbage = _collect(study, store)
        finally:
            if store is not None:
                store.close()
        _report(console, loaded, garbage, show, done=False, again=again)
        return
    with study.writing() as store:
        _subjects, garbage = _collect(study, store)
        if store is not None and garbage.records:
            store.discard(garbage.records)
        for folder in [*garbage.folders, *garbage.batches]:
            shutil.rmtree(folder, ignore_errors=True)
    _report(console, loaded, garbage, show, done=True, again=again)


def _report(console: Console, loaded: LoadedRecipe, garbage: Garbage, show: int, *, done: bool, again: str) -> None:
    verb = "deleted" if done else "would delete"
    total = garbage.record_bytes + garbage.folder_bytes
    shown = garbage.folders if show <= 0 else garbage.folders[:show]
    for folder in shown:
        console.print(f"  {esc(str(folder))}", highlight=False)
    if len(shown) < len(garbage.folders):
        console.print(f"  ... and {len(garbage.folders) - len(shown)} more")
    console.print(
        f"{verb} {len(garbage.folders)} work folder(s) ({_mb(garbage.folder_bytes)}) and "
        f"{len(garbage.records)} stored record(s) ({_mb(garbage.record_bytes)}) that no current key uses: "
        f"{'freed' if done else 'frees'} {_mb(total)}",
        highlight=False,
    )
    if garbage.batches:
        console.print(f"{verb} {len(garbage.batches)} merged SLURM batch folder(s) ({_mb(garbage.batch_bytes)}) in "
                      f"{esc(str(slurm_folder(loaded.run_root())))}", highlight=False)
    if garbage.left_alone:
        console.print(f"left alone: {garbage.left_alone} entries in {esc(str(loaded.run_root() / WORK))} "
                      "that are not per-key work folders", highlight=False)
    if not done and (garbage.folders or garbage.records or garbage.batches):
        console.print(f"run `{again}` to delete them", highlight=False)

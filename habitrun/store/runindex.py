"""Runs made outside a study's own run folder (``run_dir`` on the command line), listed where it keeps its runs.

``habitrun run recipe.yaml run_dir=/scratch/x`` puts its run folder, store and
work folders under ``/scratch/x``; the recipe file alone does not say so. So
that `status`, `results`, `trace` and `report` still find that run as the
study's latest, the runner's command appends one line per such run to
``<the study's own run root>/runs-elsewhere.jsonl``: the run id and its folder.
A listed folder that is gone (deleted, or on a disk not mounted now) is
skipped, never an error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from habitrun.errors import StoreError
from habitrun.store.runs import RunFolder, list_runs

INDEX_FILE = "runs-elsewhere.jsonl"


def note_run_elsewhere(home: Path, run: Path) -> None:
    """Record in the study's own run root ``home`` that run folder ``run`` lives elsewhere (OSError: not written)."""
    Path(home).mkdir(parents=True, exist_ok=True)
    line = json.dumps({"run_id": Path(run).name, "path": os.path.abspath(run)}, ensure_ascii=False) + "\n"
    with open(Path(home) / INDEX_FILE, "a", encoding="utf-8") as fh:
        fh.write(line)


def runs_elsewhere(home: Path) -> list[RunFolder]:
    """The complete run folders ``home``'s index lists that still exist (unreadable lines are skipped)."""
    try:
        text = (Path(home) / INDEX_FILE).read_text(encoding="utf-8")
    except OSError:
        return []
    found: dict[str, RunFolder] = {}
    for line in text.splitlines():
        try:
            path = Path(json.loads(line)["path"])
        except (ValueError, KeyError, TypeError):
            continue
        if RunFolder.is_complete(path):
            try:
                found[str(path)] = RunFolder.open(path)
            except StoreError:  # a damaged source.json: as list_runs does, not shown
                continue
    return list(found.values())


def study_runs(*run_roots: Path) -> list[RunFolder]:
    """Every run of the study: those under each of ``run_roots`` and those their indexes list, oldest first."""
    found: dict[str, RunFolder] = {}
    for root in run_roots:
        for run in (*list_runs(root), *runs_elsewhere(root)):
            found.setdefault(os.path.realpath(run.path), run)
    return sorted(found.values(), key=lambda r: (r.created_ts, r.run_id))

"""A real two-stage study in a temporary folder, run by the engine with the backend its policy names."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from habitrun.engine.runner import RunSummary, run_study
from habitrun.spec.loader import load_recipe
from tests.backends.conftest import BASE_POLICY, OPS_DIR, OPS_MODULE
from tests.backends.variants import Variant


def make_study(folder: Path, variant: Variant, subjects: Sequence[dict[str, Any]], **policy: Any) -> Path:
    """Stage ``work`` (each subject does its ``do``) then ``after`` (needs ``work``); returns the recipe.

    Subjects listed in ``folder/fail.txt`` fail in ``work`` (the file changes between runs, the keys do not);
    every operator call leaves a marker (see :func:`tests.backends.conftest.started`).
    """
    folder.mkdir(parents=True, exist_ok=True)
    markers = folder / "markers"
    markers.mkdir(exist_ok=True)
    shutil.copy(OPS_DIR / f"{OPS_MODULE}.py", folder / f"{OPS_MODULE}.py")
    rows = ["subject_id,do,sec"] + [f"{s['id']},{s.get('do', 'ok')},{s.get('sec', '')}" for s in subjects]
    (folder / "subjects.csv").write_text("\n".join(rows) + "\n")
    recipe = {
        "habitrun": 1,
        "name": "backend-suite",
        "subjects": {"manifest": "subjects.csv"},
        "policy": {**BASE_POLICY, **variant.policy, **policy},
        "stages": [
            {"name": "work", "operator": f"{OPS_MODULE}:act",
             "params": {"marker_dir": str(markers), "fail_file": str(folder / "fail.txt")}},
            {"name": "after", "operator": f"{OPS_MODULE}:second", "needs": ["work"],
             "params": {"marker_dir": str(markers)}},
        ],
    }
    path = folder / "recipe.yaml"
    path.write_text(json.dumps(recipe, indent=2))  # JSON is YAML
    return path


def run(recipe: Path, *overrides: str, **options: Any) -> RunSummary:
    """One run (or resume) of the study, as `habitrun run` does it, in this process (``options``: run_study's)."""
    return run_study(load_recipe(recipe, overrides), install_signal_handlers=False, **options)


def failed_ids(summary: RunSummary) -> list[tuple[str, str]]:
    return sorted((f.stage, f.subject_id) for f in summary.failures)

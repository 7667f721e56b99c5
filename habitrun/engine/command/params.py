"""What a stage's operator is built with: its params, or a command stage's whole definition.

Kept apart from :mod:`habitrun.engine.command.operator` so that the runner, which
only builds these, does not import the operator's machinery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from habitrun.spec.recipe import Recipe, StageSpec


def operator_params(stage: StageSpec, recipe: Recipe, root: Path, run_root: Path) -> dict[str, Any]:
    """The keyword arguments a stage's operator is built with: its params, or for a command
    stage everything :class:`CommandOperator` needs (picklable, sent to every worker)."""
    if not stage.runs_command:
        return dict(stage.params)
    return {
        "stage": stage.name,
        "command": list(stage.command or ()),
        "outputs": {k: v if isinstance(v, str) else list(v) for k, v in (stage.outputs or {}).items()},
        "env": dict(stage.env or {}),
        "shell": stage.shell,
        "container": stage.container.model_dump() if stage.container is not None else None,
        "params": dict(stage.params),
        "root": str(root),
        "run_root": str(run_root),
        "file_columns": sorted(recipe.subjects.file_columns()),
    }

"""`habitrun validate RECIPE [OVERRIDES...]`: everything a run would check before it starts.

Schema and stage graph (by loading), the manifest (by reading it), every
input file it names and every declared stage input (there and readable,
nothing hashed), and every operator and train entrypoint (by importing it from
the recipe's folder, in a child process, with each operator's params checked
against its signature).
Problems of the last two are collected together, so one pass shows them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import typer

from habitrun.cli.app import app
from habitrun.cli.findrecipe import recipe_and_overrides
from habitrun.cli.subjects_text import subjects_lines
from habitrun.errors import RecipeError
from habitrun.planner.context import build_context
from habitrun.spec.loader import LoadedRecipe, load_recipe
from habitrun.spec.opcheck import OperatorCheck
from habitrun.spec.policy import RunPolicy
from habitrun.spec.subjects import SubjectRow, load_subjects


def check_operators(loaded: LoadedRecipe) -> list[str]:
    """Import every stage's operator / entrypoint in a child process; one located problem per failure."""
    return OperatorCheck.start(loaded).problems()


def _policy_summary(policy: RunPolicy) -> str:
    defaults = RunPolicy().to_dict()
    shown = {"backend": policy.backend, "workers": policy.workers}
    for key, value in policy.to_dict().items():
        if value != defaults[key]:
            shown[key] = value
    return " ".join(f"{k}={v}" for k, v in shown.items())


def summary(loaded: LoadedRecipe, rows: Sequence[SubjectRow]) -> str:
    """A few lines: what the recipe is, how many subjects, the policy, the stages in order."""
    recipe = loaded.recipe
    found = subjects_lines(loaded, rows)
    lines = [
        f"recipe    {loaded.path}  ({recipe.name})",
        f"subjects  {found[0]}",
        *(f"          {line}" for line in found[1:]),
        f"policy    {_policy_summary(recipe.policy)}",
    ]
    files = recipe.subjects.file_columns()
    if files:
        lines.append("files     " + ", ".join(f"{c} ({'required' if r else 'optional'})" for c, r in files.items()))
    lines.append("stages")
    width = max(len(s.name) for s in recipe.stages)
    for stage in recipe.ordered_stages():
        target = " ".join(stage.command or ()) if stage.runs_command or stage.command else stage.operator or stage.entrypoint
        extra = f"  needs {', '.join(stage.needs)}" if stage.needs else ""
        override = stage.policy_override()
        if override:
            extra += "  policy " + " ".join(f"{k}={v}" for k, v in override.items())
        if stage.launch is not None:
            extra += f"  ranks {stage.launch.nproc_per_node}"
        if stage.fields is not None:
            extra += f"  fields {', '.join(stage.fields)}"
        if stage.inputs:
            extra += f"  inputs {', '.join(stage.inputs)}"
        if stage.code_version is not None:
            extra += f"  code_version {stage.code_version}"
        lines.append(f"  {stage.name:<{width}}  {stage.kind:<7}  {target}{extra}")
    return "\n".join(lines)


@app.command()
def validate(
    recipe_word: Optional[str] = typer.Argument(None, metavar="RECIPE", help="The recipe file (default: recipe.yaml here or in the nearest parent folder)."),  # noqa: UP045
    overrides: list[str] = typer.Argument(None, help="Overrides like policy.workers=8 (values read as YAML)."),
) -> None:
    """Check a recipe without running it: schema, stage graph, manifest, operators."""
    recipe, overrides = recipe_and_overrides(recipe_word, overrides)
    loaded = load_recipe(recipe, tuple(overrides or ()))
    problems: list[str] = []
    rows: Sequence[SubjectRow] = ()
    with OperatorCheck.start(loaded) as operators:  # imports in a child while the manifest loads
        try:
            rows = load_subjects(loaded)
        except RecipeError as exc:
            problems.extend(exc.problems)
        if rows:
            try:  # every input file there and readable (nothing is hashed here)
                build_context(loaded, rows, None, save=False, verify_only=True)
            except RecipeError as exc:
                problems.extend(exc.problems)
        problems.extend(operators.problems())
    if problems:
        raise RecipeError(problems)
    typer.echo(summary(loaded, rows))
    typer.echo("ok: the recipe is valid")

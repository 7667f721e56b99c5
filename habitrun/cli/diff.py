"""`habitrun diff [RUN_A] [RUN_B] [--json]`: what changed between two runs of a study.

By default the last two runs; one id compares that run with the latest. The
comparison itself is :mod:`habitrun.store.rundiff`; this prints it in words
(one line per change) or as JSON. Exit 0 whether or not anything changed,
2 for an unknown run id or a study with fewer than two runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from habitrun.cli.app import app
from habitrun.cli.findrecipe import given_or_found
from habitrun.cli.runpick import find_run
from habitrun.errors import UsageError
from habitrun.spec.loader import load_recipe
from habitrun.store.rundiff import RunDiff, diff_runs
from habitrun.store.runs import list_runs


@app.command()
def diff(
    run_a: Optional[str] = typer.Argument(None, metavar="RUN_A", help="The older run's id (or a unique prefix; default: the run before the latest)."),  # noqa: UP045
    run_b: Optional[str] = typer.Argument(None, metavar="RUN_B", help="The newer run's id (default: the latest run)."),  # noqa: UP045
    recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="The study's recipe (default: recipe.yaml here or in the nearest parent folder)."),  # noqa: UP045
    as_json: bool = typer.Option(False, "--json", help="Print the differences as JSON."),
) -> None:
    """Name what changed between two runs: recipe values, code files, packages, data files, habitrun, Python."""
    path = given_or_found(recipe)
    root = load_recipe(path).run_root()
    if run_a is None:
        runs = list_runs(root)
        if len(runs) < 2:
            found = f"only one run ({runs[0].run_id})" if runs else "no run yet"
            raise UsageError(f"{path} has {found}: diff compares two runs; give two run ids, or run the study again")
        a, b = runs[-2], runs[-1]
    else:
        a = find_run(root, run_a, recipe=path)
        b = find_run(root, run_b, recipe=path)
    changes = diff_runs(a, b)
    if as_json:
        typer.echo(json.dumps(changes.as_json(), indent=1, ensure_ascii=False, default=str))
    else:
        typer.echo("\n".join(words(changes)))


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def words(d: RunDiff) -> list[str]:
    """The differences, one line each, headed by the two runs."""
    lines = [f"run {d.run_a} -> run {d.run_b}"]
    lines.extend(f"  recipe: {c['path']}: {_value(c['a'])} -> {_value(c['b'])}" for c in d.recipe)
    if d.overrides is not None:
        lines.append(f"  overrides: {' '.join(d.overrides['a']) or '(none)'} -> {' '.join(d.overrides['b']) or '(none)'}")
    for c in d.code:
        lines.append(f"  code: {c['file']} {c['change']} (stage{'s' if len(c['stages']) > 1 else ''} "
                     f"{', '.join(c['stages'])})")
    for p in d.packages:
        used = f" (used by {', '.join(p['stages'])})" if p["stages"] else ""
        if p["a"] is None:
            lines.append(f"  package: {p['name']} {p['b']} installed{used}")
        elif p["b"] is None:
            lines.append(f"  package: {p['name']} {p['a']} removed{used}")
        else:
            lines.append(f"  package: {p['name']} {p['a']} -> {p['b']}{used}")
    data = d.data
    if data.any():
        lines.append(f"  data: {data.changed} file(s) changed, {data.added} added, {data.removed} removed "
                     f"(of {data.compared})")
        for label, count, paths in (("changed", data.changed, data.changed_paths),
                                    ("added", data.added, data.added_paths),
                                    ("removed", data.removed, data.removed_paths)):
            if paths:
                more = f" and {count - len(paths)} more" if count > len(paths) else ""
                lines.append(f"    {label}: {', '.join(paths)}{more}")
    for name, pair in (("habitrun", d.habitrun), ("python", d.python), ("platform", d.platform)):
        if pair is not None:
            lines.append(f"  {name}: {pair['a']} -> {pair['b']}")
    if d.git is not None:
        if d.git.get("a") != d.git.get("b"):
            lines.append(f"  git commit: {d.git['a'] or '(none)'} -> {d.git['b'] or '(none)'}")
        if "dirty_files" in d.git:
            lines.append("  uncommitted changes in the study's repository differ")
    lines.extend(f"  note: {n}" for n in d.not_compared)
    if d.same():
        lines.append("  no difference in recipe, code, packages, data, habitrun or Python")
    return lines

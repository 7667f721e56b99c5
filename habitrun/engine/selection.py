"""What a run was asked to run beyond the recipe: one stage and what it needs, chosen subjects.

Checked before anything is written, with a close match for a misspelled name.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from habitrun.errors import RecipeError
from habitrun.spec.loader import LoadedRecipe
from habitrun.spec.recipe import StageSpec
from habitrun.spec.subjects import SubjectRow, subject_ids


def stages_for(loaded: LoadedRecipe, only_stage: str | None) -> list[StageSpec]:
    """The stages a run runs, in order: all, or ``only_stage`` and what it needs."""
    ordered = loaded.recipe.ordered_stages()
    if only_stage is None:
        return ordered
    names = {s.name for s in ordered}
    if only_stage not in names:
        close = difflib.get_close_matches(only_stage, sorted(names), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; the stages are {', '.join(sorted(names))}"
        raise RecipeError(f"--stage {only_stage!r}: no such stage in the recipe{hint}")
    wanted, todo = set(), [only_stage]
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(loaded.recipe.stage(name).needs)
    return [s for s in ordered if s.name in wanted]


def unknown_ids(subjects: Sequence[SubjectRow], ids: Sequence[str]) -> None:
    """Refuse subject ids (from --rerun) that are not in the manifest, with a close match."""
    if not ids:
        return
    known = set(subject_ids(subjects))
    problems = []
    for sid in ids:
        if sid not in known:
            close = difflib.get_close_matches(sid, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(f"--rerun {sid!r}: no subject with this id in the manifest{hint}")
    if problems:
        raise RecipeError(problems)

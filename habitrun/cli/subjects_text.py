"""How many subjects a recipe has and from where, in words: shown by `validate` and `plan`.

Kept apart from `validate` so that `plan` does not import the operator check to say it.
"""

from __future__ import annotations

from collections.abc import Sequence

from habitrun.spec.loader import LoadedRecipe
from habitrun.spec.subjects import SubjectRow


def subjects_lines(loaded: LoadedRecipe, rows: Sequence[SubjectRow]) -> list[str]:
    """How many subjects, from where; for subjects found on disk also how many are incomplete and why."""
    spec = loaded.recipe.subjects
    report = getattr(rows, "discovery", None)
    notes = list(getattr(rows, "notes", ()))  # a sniffed delimiter, empty rows ignored
    if report is None:
        return [f"{len(rows)} from {spec.manifest} (id column {spec.id!r})", *notes]
    ident = "id sub-<label>[_ses-<label>]" if spec.bids is not None else f"id field {spec.id!r}"
    lines = [f"{len(rows)} of {report.found} found by {report.source} "
             f"({report.files} files; {ident}; file columns {', '.join(report.file_columns)})"]
    if report.incomplete:
        lines.append(report.incomplete_text())
    if report.manifest is not None:
        note = f"joined {report.manifest}"
        if report.without_manifest_row:
            few = ", ".join(report.without_manifest_row[:5])
            more = " ..." if len(report.without_manifest_row) > 5 else ""
            note += f"; {len(report.without_manifest_row)} found subject(s) without a row there: {few}{more}"
        if report.manifest_rows_without_files:
            note += f"; {report.manifest_rows_without_files} of its rows have no files"
        lines.append(note)
    return lines + notes

"""The subjects a run uses: from a manifest file or found on disk, filtered by include/exclude.

The manifest is read by :mod:`habitrun.spec.manifest`. Subject ids later become
file and folder names (logs, work folders), so each row also gets a safe name
(:mod:`habitrun.spec.safenames`): the id itself when it is a plain name, an
encoding that cannot leave its folder otherwise.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from habitrun.errors import RecipeError
from habitrun.spec.gcpause import gc_paused
from habitrun.spec.manifest import id_text, read_manifest
from habitrun.spec.safenames import apart_without_case, with_safe_names

if TYPE_CHECKING:
    from habitrun.spec.discover import Discovery
    from habitrun.spec.loader import LoadedRecipe

class SubjectRow(NamedTuple):
    """One subject: its id, its manifest row, and its file-name-safe id."""

    id: str
    fields: dict[str, Any]
    safe: str


class SubjectTable(list):  # type: ignore[type-arg]
    """The subjects a run uses (a list of SubjectRow), and what is known about its columns.

    ``file_columns`` name the columns whose values are paths of input files
    (every column discovery fills from the disk): the planner may fingerprint
    their content. ``discovery`` is the report of a ``from``/``bids`` table
    (found, incomplete, the columns), None for a manifest.
    """

    def __init__(self, rows: Any = (), *, file_columns: tuple[str, ...] = (),
                 required: tuple[str, ...] = (), discovery: Discovery | None = None) -> None:
        super().__init__(rows)
        self.file_columns = tuple(file_columns)
        self.required = tuple(required)
        self.discovery = discovery

    def file_needs(self) -> dict[str, bool]:
        """file column -> required (every row has a file there), as the planner's file keys want it."""
        return {column: column in self.required for column in self.file_columns}


def load_subjects(loaded: LoadedRecipe) -> SubjectTable:
    """The recipe's subjects, include/exclude applied: in manifest order, or found on disk sorted by id.

    Raises RecipeError for a missing or unreadable manifest, a missing id
    column, an empty or duplicate id, an empty manifest, an include/exclude
    id that is not in the manifest, or filters that leave no subject; for
    subjects found on disk, see :func:`habitrun.spec.discover.discover`.
    """
    with gc_paused():
        if loaded.recipe.subjects.found:
            return _found_subjects(loaded)
        return SubjectTable(_load_subjects(loaded))


def _found_subjects(loaded: LoadedRecipe) -> SubjectTable:
    from habitrun.spec.discover import discover

    found, report = discover(loaded)
    known = {sid: i for i, (sid, _) in enumerate(found)}
    known.update((sid, -1) for sid, _ in report.incomplete)
    problems = _filter_problems(loaded, known)
    if problems:
        raise RecipeError(problems)
    rows = apart_without_case(with_safe_names([SubjectRow(sid, row, sid) for sid, row in found]))
    if not rows:
        raise RecipeError([f"{loaded.locate(('subjects', 'required'))}: every subject found is incomplete: "
                           f"{report.incomplete_text()}"])
    rows = _filtered(loaded, rows)
    if not rows:
        raise RecipeError([f"{loaded.locate(('subjects',))}: include/exclude leave no subjects to run"])
    return SubjectTable(rows, file_columns=report.file_columns, required=loaded.recipe.subjects.required,
                        discovery=report)


def _filtered(loaded: LoadedRecipe, rows: list[SubjectRow]) -> list[SubjectRow]:
    spec = loaded.recipe.subjects
    if spec.include is not None:
        wanted = set(spec.include)
        rows = [r for r in rows if r.id in wanted]
    if spec.exclude:
        dropped = set(spec.exclude)
        rows = [r for r in rows if r.id not in dropped]
    return rows


def _load_subjects(loaded: LoadedRecipe) -> list[SubjectRow]:
    spec = loaded.recipe.subjects
    assert spec.manifest is not None  # the model requires one without 'from' / 'bids'

    path = Path(spec.manifest).expanduser()
    path = path if path.is_absolute() else loaded.root / path
    where = loaded.locate(("subjects", "manifest"))
    if not path.is_file():
        what = "is a folder, not a manifest file" if path.is_dir() else "does not exist"
        raise RecipeError([f"{where}: manifest {str(path)!r} {what}"])
    try:
        table = read_manifest(path, spec.manifest)
    except OSError as exc:
        raise RecipeError([f"{where}: cannot read {str(path)!r}: {exc.strerror or exc}"]) from None
    source, id_col = table.source, spec.id
    if not table.rows:
        raise RecipeError([f"{source}: the manifest has no subjects (rows)"])
    if table.columns is not None and id_col not in table.columns:
        close = difflib.get_close_matches(id_col, table.columns, n=1)
        hint = f" (did you mean {close[0]!r}? set subjects.id)" if close else " (set subjects.id)"
        raise RecipeError([f"{source}:1:1: no id column {id_col!r}; columns are {', '.join(table.columns)}{hint}"])
    problems: list[str] = []
    seen: dict[str, int] = {}
    rows: list[SubjectRow] = []
    for ref, fields in table.rows:
        subject_id = fields.get(id_col)
        if type(subject_id) is not str or not subject_id or subject_id != subject_id.strip():
            subject_id = id_text(subject_id)  # the slow path: ints, padding, blanks
        if subject_id is None:
            got = "missing" if id_col not in fields else f"{fields[id_col]!r}"
            problems.append(f"{source}:{table.line(ref)}:1: {id_col}: a subject needs a non-empty text or integer id, got {got}")
        elif subject_id in seen:
            first = table.line(seen[subject_id])
            problems.append(f"{source}:{table.line(ref)}:1: {id_col}: duplicate subject id {subject_id!r} (first on line {first})")
        else:
            seen[subject_id] = ref
            rows.append(SubjectRow(subject_id, fields, subject_id))  # safe names below
        if len(problems) >= 20:
            break
    problems += _filter_problems(loaded, seen)
    if problems:
        raise RecipeError(problems)
    rows = _filtered(loaded, apart_without_case(with_safe_names(rows)))
    if not rows:
        raise RecipeError([f"{loaded.locate(('subjects',))}: include/exclude leave no subjects to run"])
    return rows


def _filter_problems(loaded: LoadedRecipe, known: dict[str, int]) -> list[str]:
    """Ids in include/exclude that the manifest lacks: most likely a typo, so an error."""
    spec = loaded.recipe.subjects
    problems = []
    for name, ids in (("include", spec.include or ()), ("exclude", spec.exclude)):
        for i, subject_id in enumerate(ids):
            if subject_id not in known:
                hint = _missing_id_hint(name, subject_id, known)
                where = "found on disk" if spec.found else "in the manifest"
                problems.append(f"{loaded.locate(('subjects', name, i))}: subject {subject_id!r} is not {where}{hint}")
    return problems


_INT_TEXT = re.compile(r"-?[0-9]{1,4300}")


def _missing_id_hint(name: str, subject_id: str, known: dict[str, int]) -> str:
    """A close manifest id; for a number, the manifest id it is as written (``2`` for '002')."""
    if _INT_TEXT.fullmatch(subject_id):
        same = next((k for k in known if k != subject_id and _INT_TEXT.fullmatch(k) and int(k) == int(subject_id)), None)
        if same is not None:
            return f" (did you mean {same!r}? write {name}: [{same!r}] — ids are text)"
    close = difflib.get_close_matches(subject_id, list(known), n=1) if len(known) <= 5000 else []
    return f" (did you mean {close[0]!r}?)" if close else ""


def row_locations(loaded: LoadedRecipe, ids: set[str]) -> dict[str, str]:
    """subject id -> ``manifest:line`` of its row, for messages about a few subjects.

    Reads the manifest again: this is the error path, and rows do not carry their lines.
    """
    spec = loaded.recipe.subjects
    path = Path(spec.manifest).expanduser()
    path = path if path.is_absolute() else loaded.root / path
    try:
        table = read_manifest(path, spec.manifest)
    except (OSError, RecipeError):
        return {}
    out: dict[str, str] = {}
    for ref, fields in table.rows:
        sid = id_text(fields.get(spec.id))
        if sid in ids and sid not in out:
            out[sid] = f"{table.source}:{table.line(ref)}"
    return out

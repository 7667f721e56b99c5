"""The subjects a run uses: from a manifest file or found on disk, filtered by include/exclude.

The manifest is read by :mod:`habitrun.spec.manifest`. Subject ids later become
file and folder names (logs, work folders), so each row also gets a safe name
(:mod:`habitrun.spec.safenames`): the id itself when it is a plain name, an
encoding that cannot leave its folder otherwise.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, overload

from habitrun.errors import RecipeError
from habitrun.spec.manifest import ManifestRows, id_text, read_manifest
from habitrun.spec.safenames import all_plain, apart_without_case, safe_names

if TYPE_CHECKING:
    from habitrun.spec.discover import Discovery
    from habitrun.spec.loader import LoadedRecipe

class SubjectRow(NamedTuple):
    """One subject: its id, its manifest row, and its file-name-safe id."""

    id: str
    fields: dict[str, Any]
    safe: str


class SubjectTable(Sequence[SubjectRow]):
    """The subjects a run uses (a sequence of SubjectRow), and what is known about its columns.

    Kept as columns, not a row object per subject: ``ids``, ``safe_names`` and the manifest's
    rows (a plain CSV's lines), a row's fields built when it is first looked at. A million
    subjects then cost their ids and lines, and the planner reads their values in bulk
    (:meth:`columns`, :meth:`values`).

    ``file_columns`` name the columns whose values are paths of input files
    (every column discovery fills from the disk): the planner may fingerprint
    their content. ``discovery`` is the report of a ``from``/``bids`` table
    (found, incomplete, the columns), None for a manifest.
    """

    def __init__(self, rows: Iterable[SubjectRow] = (), *, file_columns: tuple[str, ...] = (),
                 required: tuple[str, ...] = (), discovery: Discovery | None = None) -> None:
        rows = list(rows)
        self.ids: list[str] = [row.id for row in rows]
        self.safe_names: list[str] = [row.safe for row in rows]
        self._manifest: ManifestRows | None = None
        self._fields: list[dict[str, Any]] | None = [row.fields for row in rows]
        self._index: Sequence[int] = range(len(rows))
        self._by_id: dict[str, int] | None = None
        self._made: dict[int, dict[str, Any]] = {}  # lazy rows' fields, kept once looked at
        self._looked_up: dict[int, SubjectRow] = {}  # rows looked up by id, kept
        self.file_columns = tuple(file_columns)
        self.required = tuple(required)
        self.discovery = discovery
        self.notes: list[str] = []  # what reading the manifest decided for the user (see ManifestRows.notes)
        self.excluded: list[str] = []  # ids include/exclude left out (found, or in the manifest)

    @classmethod
    def of_manifest(cls, manifest: ManifestRows, ids: list[str], safe: list[str],
                    index: Sequence[int] | None = None) -> SubjectTable:
        """The subjects of manifest rows ``index`` (default: every row), with their ids and safe names."""
        table = cls()
        table.ids, table.safe_names, table._manifest, table._fields = ids, safe, manifest, None
        table._index = index if index is not None else range(len(ids))
        return table

    def fields(self, i: int) -> dict[str, Any]:
        """The manifest row of subject ``i``: built at its first lookup, then kept (a run looks
        each subject up several times a stage, and a row is one dict whatever the manifest)."""
        if self._fields is not None:
            return self._fields[i]
        made = self._made.get(i)
        if made is None:
            assert self._manifest is not None
            made = self._made[i] = self._manifest.fields(self._index[i])
        return made

    def columns(self) -> tuple[str, ...] | None:
        """The columns every subject's row has, in order, when that is known without reading
        the rows (a plain CSV/TSV); None otherwise."""
        if self._manifest is not None and self._manifest.lines is not None and self._manifest.columns:
            return tuple(self._manifest.columns)
        return None

    def plain_values(self) -> bool:
        """Whether every value is text whose repr is itself in quotes (no ``'``, backslash or
        control character): the planner then makes a row's text by joining its values."""
        return self.columns() is not None and self._manifest is not None and self._manifest.plain_values

    def values(self, columns: Sequence[str], start: int = 0, stop: int | None = None) -> Iterator[tuple[Any, ...]]:
        """Every subject's values in ``columns`` (given by :meth:`columns`), as tuples, in order
        (those from ``start`` to ``stop`` only, when given)."""
        assert self._manifest is not None
        return self._manifest.values(self._index[start:stop], columns)

    def column(self, name: str) -> list[Any]:
        """Every subject's value in column ``name`` (None where its row has none)."""
        if self._fields is None and self._manifest is not None and isinstance(self._index, range):
            return self._manifest.column(name)
        return [self.fields(i).get(name) for i in range(len(self.ids))]

    def by_id(self, subject_id: str) -> SubjectRow | None:
        """The subject with ``subject_id``, or None."""
        if self._by_id is None:
            self._by_id = {sid: i for i, sid in enumerate(self.ids)}
        i = self._by_id.get(subject_id)
        if i is None:
            return None
        row = self._looked_up.get(i)
        if row is None:  # kept: a run looks its subjects up by id several times a stage
            row = self._looked_up[i] = SubjectRow(subject_id, self.fields(i), self.safe_names[i])
        return row

    def subset(self, positions: list[int]) -> SubjectTable:
        """The subjects at ``positions``, in that order (include/exclude)."""
        table = SubjectTable(file_columns=self.file_columns, required=self.required, discovery=self.discovery)
        table.ids = [self.ids[i] for i in positions]
        table.safe_names = [self.safe_names[i] for i in positions]
        table._manifest = self._manifest
        if self._fields is not None:
            table._fields = [self._fields[i] for i in positions]
        else:
            table._fields, table._index = None, [self._index[i] for i in positions]
        return table

    @overload
    def __getitem__(self, i: int) -> SubjectRow: ...
    @overload
    def __getitem__(self, i: slice) -> list[SubjectRow]: ...

    def __getitem__(self, i: int | slice) -> SubjectRow | list[SubjectRow]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self.ids)))]
        sid = self.ids[i]  # IndexError past the end, as a list
        return SubjectRow(sid, self.fields(i if i >= 0 else len(self.ids) + i), self.safe_names[i])

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[SubjectRow]:
        for i, (sid, safe) in enumerate(zip(self.ids, self.safe_names, strict=True)):
            yield SubjectRow(sid, self.fields(i), safe)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, SubjectTable)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as the list it replaces

    def __repr__(self) -> str:
        return f"SubjectTable({len(self.ids)} subjects)"

    def file_needs(self) -> dict[str, bool]:
        """file column -> required (every row has a file there), as the planner's file keys want it."""
        return {column: column in self.required for column in self.file_columns}


class _RowsById(Mapping[str, SubjectRow]):
    """id -> row of a SubjectTable, each row built at its first lookup and kept: a run looks
    up the subjects it runs once a stage (a dict lookup then, as for a list of rows).

    A found subject's file columns hold its paths as stored (relative to a root: see
    :mod:`habitrun.spec.roots`); the rows given here, to operators, hold the files' absolute
    paths today."""

    def __init__(self, table: SubjectTable) -> None:
        self._table = table
        self._built: dict[str, SubjectRow] = {}
        report = table.discovery
        self._roots = report.roots if report is not None else None
        self._files = tuple(c for c in table.file_columns) if self._roots is not None else ()

    def _resolved(self, row: SubjectRow) -> SubjectRow:
        if not self._files:
            return row
        fields = dict(row.fields)
        resolve = self._roots.resolve_cell  # type: ignore[union-attr]
        for col in self._files:
            if col in fields:
                fields[col] = resolve(fields[col])
        return SubjectRow(row.id, fields, row.safe)

    def __getitem__(self, subject_id: str) -> SubjectRow:
        row = self._built.get(subject_id)
        if row is None:
            row = self._table.by_id(subject_id)
            if row is None:
                raise KeyError(subject_id)
            row = self._built[subject_id] = self._resolved(row)
        return row

    def __contains__(self, subject_id: object) -> bool:
        return isinstance(subject_id, str) and (subject_id in self._built or self._table.by_id(subject_id) is not None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._table.ids)

    def __len__(self) -> int:
        return len(self._table.ids)


def rows_by_id(subjects: Sequence[SubjectRow]) -> Mapping[str, SubjectRow]:
    """id -> row of ``subjects`` (a SubjectTable's rows built only when looked up), as operators
    see it: a found subject's files by their absolute paths."""
    if isinstance(subjects, SubjectTable):
        return _RowsById(subjects)
    return {row.id: row for row in subjects}


def subject_ids(subjects: Sequence[SubjectRow]) -> list[str]:
    """The ids of ``subjects`` (a SubjectTable's without building its rows)."""
    ids = getattr(subjects, "ids", None)
    return ids if isinstance(ids, list) else [row.id for row in subjects]


def load_subjects(loaded: LoadedRecipe) -> SubjectTable:
    """The recipe's subjects, include/exclude applied: in manifest order, or found on disk sorted by id.

    Raises RecipeError for a missing or unreadable manifest, a missing id
    column, an empty or duplicate id, an empty manifest, an include/exclude
    id that is not in the manifest, or filters that leave no subject; for
    subjects found on disk, see :func:`habitrun.spec.discover.discover`.
    """
    if loaded.recipe.subjects.found:
        return _found_subjects(loaded)
    return _load_subjects(loaded)


def _found_subjects(loaded: LoadedRecipe) -> SubjectTable:
    from habitrun.spec.discover import discover

    found, report = discover(loaded)
    known = {sid: i for i, (sid, _) in enumerate(found)}
    known.update((sid, -1) for sid, _ in report.incomplete)
    problems = _filter_problems(loaded, known)
    if problems:
        raise RecipeError(problems)
    ids = [sid for sid, _ in found]
    safe = apart_without_case(ids, safe_names(ids))
    if not ids:
        raise RecipeError([f"{loaded.locate(('subjects', 'required'))}: every subject found is incomplete: "
                           f"{report.incomplete_text()}"])
    rows = [SubjectRow(sid, row, name) for (sid, row), name in zip(found, safe, strict=True)]
    table = _filtered(loaded, SubjectTable(rows, file_columns=report.file_columns,
                                           required=loaded.recipe.subjects.required, discovery=report))
    if not table:
        raise RecipeError([f"{loaded.locate(('subjects',))}: include/exclude leave no subjects to run"])
    table.notes = list(report.notes)
    spec = loaded.recipe.subjects  # an incomplete subject include/exclude leaves out is excluded, not incomplete
    table.excluded = sorted([*table.excluded, *(sid for sid, _ in report.incomplete
                             if (spec.include is not None and sid not in spec.include) or sid in spec.exclude)])
    return table


def _filtered(loaded: LoadedRecipe, table: SubjectTable) -> SubjectTable:
    spec = loaded.recipe.subjects
    if spec.include is None and not spec.exclude:
        return table
    wanted = set(spec.include) if spec.include is not None else None
    dropped = set(spec.exclude)
    keep = [(wanted is None or sid in wanted) and sid not in dropped for sid in table.ids]
    subset = table.subset([i for i, kept in enumerate(keep) if kept])
    subset.excluded = [sid for sid, kept in zip(table.ids, keep, strict=True) if not kept]
    return subset


def _load_subjects(loaded: LoadedRecipe) -> SubjectTable:
    spec = loaded.recipe.subjects
    assert spec.manifest is not None  # the model requires one without 'from' / 'bids'

    path = Path(spec.manifest).expanduser()
    path = path if path.is_absolute() else loaded.root / path
    where = loaded.locate(("subjects", "manifest"))
    if not path.is_file():
        what = "is a folder, not a manifest file" if path.is_dir() else "does not exist"
        raise RecipeError([f"{where}: manifest {str(path)!r} {what}"])
    try:
        table = read_manifest(path, spec.manifest, manifest_delimiter(loaded, path))
    except OSError as exc:
        raise RecipeError([f"{where}: cannot read {str(path)!r}: {exc.strerror or exc}"]) from None
    source, id_col = table.source, spec.id
    if not len(table):
        raise RecipeError([f"{source}: the manifest has no subjects (rows)"])
    if table.columns is not None and id_col not in table.columns:
        close = difflib.get_close_matches(id_col, table.columns, n=1)
        hint = f" (did you mean {close[0]!r}? set subjects.id)" if close else " (set subjects.id)"
        raise RecipeError([f"{source}:1:1: no id column {id_col!r}; columns are {', '.join(table.columns)}{hint}"])
    values = table.column(id_col)
    if table.lines is not None and all_plain(values) and _distinct(values):
        ids, index, safe = values, None, values  # plain ids, each once: the usual case, in bulk
        problems = _filter_problems(loaded, dict.fromkeys(ids)) if spec.include is not None or spec.exclude else []
    else:
        ids, index, problems = _checked_ids(table, id_col, values, loaded)
        safe = safe_names(ids)
    if problems:
        raise RecipeError(problems)
    safe = apart_without_case(ids, safe, distinct=safe is ids)  # plain ids: their names differ as they do
    subjects = _filtered(loaded, SubjectTable.of_manifest(table, ids, safe, index))
    if not subjects:
        raise RecipeError([f"{loaded.locate(('subjects',))}: include/exclude leave no subjects to run"])
    subjects.notes = list(table.notes)
    return subjects


def manifest_delimiter(loaded: LoadedRecipe, path: Path) -> str | None:
    """``subjects.delimiter``, refused for a manifest that is not a .csv/.tsv (it would be ignored)."""
    delimiter = loaded.recipe.subjects.delimiter
    if delimiter is not None and path.suffix.lower() not in (".csv", ".tsv"):
        raise RecipeError([f"{loaded.locate(('subjects', 'delimiter'))}: a delimiter applies to a .csv or .tsv "
                           f"manifest, not {path.suffix or 'one without a suffix'}"])
    return delimiter


def _distinct(ids: list[str]) -> bool:
    """Whether no id appears twice: in C-level passes, without a set when the ids are sorted."""
    if all(map(operator.lt, ids, islice(ids, 1, None))):
        return True
    return len(set(ids)) == len(ids)


def _checked_ids(table: ManifestRows, id_col: str, values: list[Any],
                 loaded: LoadedRecipe) -> tuple[list[str], list[int], list[str]]:
    """Each row's id as text, row by row: (ids, their rows, problems: blank, missing or duplicate ids)."""
    source = table.source
    problems: list[str] = []
    seen: dict[str, int] = {}
    ids: list[str] = []
    index: list[int] = []
    for i, value in enumerate(values):
        subject_id = value
        if type(subject_id) is not str or not subject_id or subject_id != subject_id.strip():
            subject_id = id_text(subject_id)  # the slow path: ints, padding, blanks
        ref = table.ref(i)
        if subject_id is None:
            got = f"{value!r}" if table.lines is not None or id_col in table.fields(i) else "missing"
            problems.append(f"{source}:{table.line(ref)}:1: {id_col}: a subject needs a non-empty text or integer id, got {got}")
        elif subject_id in seen:
            first = table.line(seen[subject_id])
            problems.append(f"{source}:{table.line(ref)}:1: {id_col}: duplicate subject id {subject_id!r} (first on line {first})")
        else:
            seen[subject_id] = ref
            ids.append(subject_id)
            index.append(i)
        if len(problems) >= 20:
            break
    return ids, index, problems + _filter_problems(loaded, seen)


def _filter_problems(loaded: LoadedRecipe, known: Mapping[str, Any]) -> list[str]:
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


def _missing_id_hint(name: str, subject_id: str, known: Mapping[str, Any]) -> str:
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
    if spec.manifest is None:
        return {}
    path = Path(spec.manifest).expanduser()
    path = path if path.is_absolute() else loaded.root / path
    try:
        table = read_manifest(path, spec.manifest, manifest_delimiter(loaded, path))
    except (OSError, RecipeError):
        return {}
    out: dict[str, str] = {}
    for ref, fields in table.pairs():
        sid = id_text(fields.get(spec.id))
        if sid in ids and sid not in out:
            out[sid] = f"{table.source}:{table.line(ref)}"
    return out

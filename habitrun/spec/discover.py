"""Subjects found from files on disk: templates -> walk -> one row per subject.

Each match gives field values and a file. Rows are merged per subject id:
fields become columns, files go to their file column (the pivot field's
value, the template's name in a ``from:`` mapping, else ``path``), written
relative to a root (:mod:`habitrun.spec.roots`: a declared data root or the
study folder) so that the table survives a move. Two
different values for one subject and column are an error listing them
(without a pivot, that is a duplicate id). A subject missing a ``required``
column is *incomplete*: reported, not run. A manifest, if given, is joined on
the id and adds its columns. Rows are sorted by id, so the table is the same
on every machine; :func:`write_table` writes it into the run folder.
"""

from __future__ import annotations

import csv
import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from habitrun.errors import RecipeError
from habitrun.spec.bids import PARTICIPANTS, bids_id
from habitrun.spec.found_checks import PATH_COLUMN
from habitrun.spec.pathtemplate import parse_template
from habitrun.spec.roots import PathRoots, declared_roots
from habitrun.spec.walk import WalkResult, walk

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe

MAX_LISTED = 20
_BIDS_HIDDEN = ("extension", "suffix")


@dataclass
class Discovery:
    """What discovery found: the table's columns, and the subjects it cannot run."""

    source: str
    """The templates (or the BIDS folder), as the recipe writes them."""
    columns: tuple[str, ...]
    file_columns: tuple[str, ...]
    """Columns that hold paths of files (their content is what a stage reads)."""
    files: int = 0
    found: int = 0
    """Subjects found, complete or not."""
    incomplete: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    """(id, missing required columns), sorted by id."""
    manifest: str | None = None
    without_manifest_row: list[str] = field(default_factory=list)
    manifest_rows_without_files: int = 0
    notes: list[str] = field(default_factory=list)
    """What reading the joined manifest decided for the user (a sniffed delimiter, empty rows ignored)."""
    roots: PathRoots | None = None
    """What the file columns' paths are relative to (see :mod:`habitrun.spec.roots`)."""

    def incomplete_text(self, limit: int = 5) -> str:
        """``3 incomplete, not run: S04 (missing mask), S09 (missing ct, mask) ...``."""
        shown = [f"{sid} (missing {', '.join(cols)})" for sid, cols in self.incomplete[:limit]]
        more = f" ... and {len(self.incomplete) - limit} more" if len(self.incomplete) > limit else ""
        return f"{len(self.incomplete)} incomplete, not run: {', '.join(shown)}{more}"


class _Merge:
    """Rows by id; (id, column) pairs given two different values, to report with their files."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, str]] = {}
        self.conflicts: set[tuple[str, str]] = set()

    def put(self, sid: str, column: str, value: str) -> None:
        row = self.rows.get(sid)
        if row is None:
            self.rows[sid] = {column: value}
            return
        old = row.setdefault(column, value)
        if old != value:
            self.conflicts.add((sid, column))

    def add(self, matches: list[tuple[str, dict[str, str]]], id_field: str, pivot: str | None, plain: str) -> None:
        """Every match of one template: its fields, and its file under the pivot's value (or ``plain``)."""
        rows, conflicts = self.rows, self.conflicts
        for path, values in matches:
            sid = values[id_field]
            row = rows.get(sid)
            if row is None:
                row = rows[sid] = {}
            for name, value in values.items():
                if name != pivot and row.setdefault(name, value) != value:
                    conflicts.add((sid, name))
            target = values[pivot] if pivot is not None else plain
            if row.setdefault(target, path) != path:
                conflicts.add((sid, target))


def _conflict_messages(merge: _Merge, sources: list[tuple[str | None, WalkResult]],
                       columns_of: Callable[[dict[str, str], str | None], dict[str, str]],
                       id_of: Callable[[dict[str, str]], str], where: str, pivot: str | None) -> list[str]:
    """One message per (id, column) with two values, naming the files that gave them (error path only)."""
    wanted = sorted(merge.conflicts)[:MAX_LISTED]
    files: dict[tuple[str, str], list[str]] = {pair: [] for pair in wanted}
    for column, result in sources:
        for path, values in result.matches:
            sid = id_of(values)
            for name in columns_of(values, column):
                listed = files.get((sid, name))
                if listed is not None and result.rel(path) not in listed:
                    listed.append(result.rel(path))
    out = []
    for (sid, column), paths in files.items():
        shown = ", ".join(paths)
        if column == PATH_COLUMN and pivot is None:
            out.append(f"{where}: duplicate subject id {sid!r}: {shown} (each match is one subject: "
                       "set subjects.pivot, or a field regex, to tell them apart)")
        else:
            out.append(f"{where}: subject {sid!r} has two values for column {column!r}: {shown}")
    if len(merge.conflicts) > MAX_LISTED:
        out.append(f"{where}: ... and {len(merge.conflicts) - MAX_LISTED} more subjects with two values for one column")
    return out


class _Found:
    """What the recipe's templates matched: rows merged per subject, columns in order of appearance."""

    def __init__(self, loaded: LoadedRecipe) -> None:
        spec = self.spec = loaded.recipe.subjects
        self.loaded = loaded
        self.bids = spec.bids is not None
        self.patterns = spec.patterns()
        self.pivot = "suffix" if self.bids else spec.pivot
        self.merge = _Merge()
        self.field_columns: list[str] = ["participant_id", "subject", "session"] if self.bids else []
        self.file_columns: list[str] = []
        self.empty: list[tuple[tuple[Any, ...], str, str]] = []  # (recipe key, template, where it looked)
        self.files = 0
        self.texts: list[str] = []
        self.sources: list[tuple[str | None, WalkResult]] = []
        self.where = loaded.locate(("subjects", "bids" if self.bids else "from"))
        self.roots: PathRoots = declared_roots(loaded)

    def id_of(self, values: dict[str, str]) -> str:
        return bids_id(values) if self.bids else values[self.spec.id]

    def columns_of(self, values: dict[str, str], column: str | None) -> dict[str, str]:
        """The columns one match fills, besides its file: fields, or the BIDS entities."""
        if self.bids:
            return {"participant_id": f"sub-{values['subject']}", "subject": values["subject"],
                    "session": values.get("session", "")}
        return {k: v for k, v in values.items() if k != self.pivot}

    def walk(self, at: tuple[Any, ...], column: str | None, text: str) -> None:
        """Walk one template and merge its matches (one that matches nothing is noted in ``empty``)."""
        pivot, bids = self.pivot, self.bids
        template = parse_template(text, self.patterns)
        self.texts.append(text)
        result = walk(template, self.loaded.root, self.patterns)
        if not result.matches:
            self.empty.append((at, text, result.nearest()))
            return
        self.files += len(result.matches)
        self.sources.append((column, result))
        portable = self.roots.portable
        matches = [(portable(path), values) for path, values in result.matches]
        for name in template.fields:
            if name != pivot and not (bids and name in _BIDS_HIDDEN) and name not in self.field_columns:
                self.field_columns.append(name)
        plain = column or PATH_COLUMN
        if bids:
            for path, values in matches:
                sid = bids_id(values)
                for name, value in self.columns_of(values, column).items():
                    self.merge.put(sid, name, value)
                self.merge.put(sid, values["suffix"], path)
        else:
            self.merge.add(matches, self.spec.id, pivot if pivot in template.fields else None, plain)
        targets = {values[pivot] for _, values in result.matches} if pivot in template.fields else {plain}
        self.file_columns.extend(sorted(t for t in targets if t not in self.file_columns))

    def check(self) -> None:
        """Raise RecipeError for templates that matched nothing or a subject with two values for a column."""
        spec, where, empty = self.spec, self.where, self.empty
        if self.bids and len(empty) == len(self.texts):
            raise RecipeError([f"{where}: no file matches the BIDS layout {spec.bids!r} "
                               f"(datatype {spec.datatype}, suffix {', '.join(spec.suffix or ())}): {empty[0][2]}"])
        if empty and not self.bids:
            raise RecipeError([f"{self.loaded.locate(('subjects', *at))}: no file matches {text!r}: {nearest}"
                               for at, text, nearest in empty])
        if self.merge.conflicts:
            raise RecipeError(_conflict_messages(self.merge, self.sources, _with_file(self.columns_of, self.pivot),
                                                 self.id_of, where, self.pivot))

    def columns(self) -> list[str]:
        """The table's columns (fields, then files) after putting the file columns in their order."""
        if self.pivot is not None:
            if self.bids:
                self.file_columns = [s for s in self.spec.suffix or () if s in self.file_columns]
            else:
                self.file_columns = sorted(self.file_columns)
        columns = [c for c in self.field_columns if c not in self.file_columns] + self.file_columns
        unknown = [(j, name) for j, name in enumerate(self.spec.required) if name not in columns]
        if unknown:
            raise RecipeError([
                f"{self.loaded.locate(('subjects', 'required', j))}: {name!r} is not a column found on disk "
                f"({_did_you_mean(name, columns)}columns: {', '.join(columns)})" for j, name in unknown
            ])
        return columns


def discover(loaded: LoadedRecipe) -> tuple[list[tuple[str, dict[str, Any]]], Discovery]:
    """(id, row) of every subject found, sorted by id, and the Discovery report.

    Incomplete subjects are in the report, not in the rows. Raises RecipeError
    (located at the recipe key) for a template that matches nothing, two values
    for one subject and column, an unknown required column, or a bad manifest.
    """
    spec = loaded.recipe.subjects
    found = _Found(loaded)
    for at, column, text in spec.templates():
        found.walk(at, column, text)
    found.check()
    columns = found.columns()
    report = Discovery(" + ".join(found.texts) if not found.bids else f"bids {spec.bids}", tuple(columns),
                       tuple(found.file_columns), found.files, roots=found.roots)
    rows = _complete_rows(found.merge.rows, columns, spec.required, report)
    manifest = spec.manifest
    if manifest is None and found.bids:
        default = _under(loaded, spec.bids or ".") / PARTICIPANTS
        manifest = str(default) if default.is_file() else None
    if manifest is not None:
        rows = _join(loaded, manifest, rows, report, join="participant_id" if found.bids else spec.id)
    return rows, report


def _complete_rows(merged: dict[str, dict[str, str]], columns: list[str], required: Sequence[str],
                   report: Discovery) -> list[tuple[str, dict[str, Any]]]:
    """Each subject's row with every column, sorted by id; those missing a required column go to the report."""
    rows: list[tuple[str, dict[str, Any]]] = []
    width = len(columns)
    for sid in sorted(merged):
        row = merged[sid]
        full = row if len(row) == width else {c: row.get(c, "") for c in columns}
        missing = tuple(c for c in required if not full[c])
        if missing:
            report.incomplete.append((sid, missing))
        else:
            rows.append((sid, full))
    report.found = len(merged)
    return rows


def _did_you_mean(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def _with_file(columns_of: Callable[[dict[str, str], str | None], dict[str, str]],
               pivot: str | None) -> Callable[[dict[str, str], str | None], dict[str, str]]:
    """Every column one match fills, its file's column included (for conflict messages)."""

    def columns(values: dict[str, str], column: str | None) -> dict[str, str]:
        target = values[pivot] if pivot is not None and pivot in values else (column or PATH_COLUMN)
        return {**columns_of(values, column), target: ""}

    return columns


def _under(loaded: LoadedRecipe, text: str) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else loaded.root / path


def _join(loaded: LoadedRecipe, manifest: str, rows: list[tuple[str, dict[str, Any]]], report: Discovery,
          join: str) -> list[tuple[str, dict[str, Any]]]:
    """Add the manifest's columns to each found subject, matched on ``join``."""
    from habitrun.spec.manifest import read_manifest
    from habitrun.spec.subjects import manifest_delimiter

    where = loaded.locate(("subjects", "manifest")) if loaded.recipe.subjects.manifest else loaded.locate(("subjects", "bids"))
    path = _under(loaded, manifest)
    if not path.is_file():
        what = "is a folder, not a manifest file" if path.is_dir() else "does not exist"
        raise RecipeError([f"{where}: manifest {str(path)!r} {what}"])
    try:
        table = read_manifest(path, manifest, manifest_delimiter(loaded, path))
    except OSError as exc:
        raise RecipeError([f"{where}: cannot read {str(path)!r}: {exc.strerror or exc}"]) from None
    report.notes.extend(table.notes)
    columns = table.columns if table.columns is not None else list(dict.fromkeys(k for _, r in table.pairs() for k in r))
    if join not in columns:
        raise RecipeError([f"{where}: manifest {manifest} has no column {join!r} to join the found subjects on "
                           f"(its columns: {', '.join(columns)})"])
    clash = [c for c in columns if c != join and c in report.columns]
    if clash:
        raise RecipeError([f"{where}: manifest column(s) {', '.join(map(repr, clash))} are also found on disk: rename them"])
    by_id: dict[str, dict[str, Any]] = {}
    problems = []
    for ref, pair in table.pairs():
        key = str(pair.get(join, "")).strip()
        if key in by_id:
            problems.append(f"{table.source}:{table.line(ref)}:1: {join}: duplicate id {key!r}")
        by_id[key] = pair
    if problems:
        raise RecipeError(problems[:MAX_LISTED])
    extra = [c for c in columns if c != join]
    out = []
    used: set[str] = set()
    for sid, row in rows:
        key = row[join] if join in row else sid
        record = by_id.get(key)
        if record is None:
            report.without_manifest_row.append(sid)
            record = {}
        else:
            used.add(key)
        row.update({c: record.get(c, "") for c in extra})
        out.append((sid, row))
    report.manifest = manifest
    report.columns = (*report.columns, *extra)
    report.manifest_rows_without_files = len(by_id) - len(used)
    return out


def write_table(path: Path, columns: tuple[str, ...], rows: list[tuple[str, dict[str, Any]]]) -> None:
    """The subject table actually used, as CSV (id first): a run's record of what it found."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", *columns])
        for sid, row in rows:
            writer.writerow([sid, *(row.get(c, "") for c in columns)])

"""Subjects from a manifest file (.csv .tsv .json .jsonl .yaml), filtered by include/exclude.

Subject ids later become file and folder names (logs, work folders), so each
row also gets :func:`safe_name`: the id itself when it is a plain name, an
encoding that cannot leave its folder otherwise. CSV/TSV go through the csv
module (100,000 rows in a fraction of a second); problems name the manifest
file and line.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import io
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from habitrun.errors import RecipeError
from habitrun.spec.gcpause import gc_paused

if TYPE_CHECKING:
    from habitrun.spec.discover import Discovery
    from habitrun.spec.loader import LoadedRecipe

FORMATS = (".csv", ".tsv", ".json", ".jsonl", ".ndjson", ".yaml", ".yml")
MAX_SAFE_LEN = 100
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_KEEP = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


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


def safe_name(subject_id: str) -> str:
    """A file-name-safe, unique, deterministic name for ``subject_id``.

    Plain ids (letters, digits, ``_ . -``, not starting with ``.`` or ``-``,
    at most 100 characters) are returned unchanged. Any other id is
    percent-encoded (``%`` never appears in a plain id, so encoded and plain
    names cannot collide); a name still too long keeps a prefix and adds
    ``~`` and a hash of the whole id. The result never contains ``/``, NUL or
    a control character and is never ``.`` or ``..``.
    """
    if _PLAIN.fullmatch(subject_id) and len(subject_id) <= MAX_SAFE_LEN:
        return subject_id
    out = []
    for i, ch in enumerate(subject_id):
        if ch in _KEEP and not (i == 0 and ch in ".-"):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    encoded = "".join(out) or "%"
    if len(encoded) <= MAX_SAFE_LEN:
        return encoded
    digest = hashlib.sha256(subject_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    prefix = encoded[:MAX_SAFE_LEN - 17]
    prefix = prefix[: prefix.rfind("%")] if "%" in prefix[-2:] else prefix  # no cut escape
    return f"{prefix}~{digest}"


class _Rows:
    """Raw rows of a manifest; each row's ``ref`` maps to its line only when a message needs it."""

    def __init__(self, source: str, lines: Callable[[], list[int] | None] | None = None) -> None:
        self.source = source
        self.rows: list[tuple[int, dict[str, Any]]] = []
        self.columns: list[str] | None = None
        self._lines = lines
        self._known: list[int] | None = None

    def line(self, ref: int) -> int:
        """Line of the row with ``ref`` (CSV: the ref is the line; lists: the item's index)."""
        if self._lines is None:
            return ref
        if self._known is None:
            self._known = self._lines() or []
        return self._known[ref] if ref < len(self._known) else ref + 1


def _read_delimited(text: str, source: str, delimiter: str) -> _Rows:
    out = _Rows(source)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    problems: list[str] = []
    try:
        header = next((row for row in reader if any(cell.strip() for cell in row)), None)
        if header is None:
            return out
        header = [c.strip() for c in header]
        dupes = sorted({c for c in header if header.count(c) > 1})
        if dupes:
            raise RecipeError([f"{source}:{reader.line_num}:1: header: column {dupes[0]!r} appears twice"])
        width = len(header)
        rows = out.rows
        for row in reader:
            if len(row) == width:
                rows.append((reader.line_num, dict(zip(header, row, strict=False))))
            elif row and any(cell.strip() for cell in row):
                problems.append(f"{source}:{reader.line_num}:1: row has {len(row)} fields, the header has {width}")
                if len(problems) >= 20:
                    break
    except csv.Error as exc:
        raise RecipeError([f"{source}:{reader.line_num}:1: cannot read the manifest: {exc}"]) from None
    if problems:
        raise RecipeError(problems)
    out.columns = header
    return out


class _LongInt(str):
    """A JSON integer with more digits than Python converts (sys.get_int_max_str_digits)."""


class _IntReader:
    """json's ``parse_int``: too long an integer becomes a _LongInt, reported with its row."""

    def __init__(self) -> None:
        self.long = False

    def __call__(self, text: str) -> int | _LongInt:
        try:
            return int(text)
        except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
            self.long = True
            return _LongInt(text)


def _long_int_in(value: Any) -> _LongInt | None:
    if isinstance(value, _LongInt):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((found for item in items if (found := _long_int_in(item)) is not None), None)


def _long_int_problem(record: dict[Any, Any], where: str) -> str | None:
    for key, value in record.items():
        found = _long_int_in(value)
        if found is not None:
            digits = len(found.lstrip("-"))
            limit = sys.get_int_max_str_digits()
            return (f"{where}.{key}: a number of {digits} digits is too long to read (at most {limit}); "
                    "write a long id as a string in quotes")
    return None


def _read_records(records: Any, source: str, lines: Callable[[], list[int] | None], long_ints: bool = False) -> _Rows:
    out = _Rows(source, lines)
    if not isinstance(records, list):
        raise RecipeError([f"{source}:1:1: expected a list of objects (one per subject), got {type(records).__name__}"])
    problems = []
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            problems.append(f"{source}:{out.line(i)}:1: [{i}]: expected an object (one subject's fields), got {type(record).__name__}")
            if len(problems) >= 20:
                break
            continue
        long_int = _long_int_problem(record, f"{source}:{out.line(i)}:1: [{i}]") if long_ints else None
        if long_int is not None:
            problems.append(long_int)
            continue
        out.rows.append((i, {str(k): v for k, v in record.items()}))
    if problems:
        raise RecipeError(problems)
    return out


def _read_json(text: str, source: str) -> _Rows:
    ints = _IntReader()
    try:
        data = json.loads(text, parse_int=ints)
    except json.JSONDecodeError as exc:
        raise RecipeError([f"{source}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}"]) from None
    return _read_records(data, source, lambda: _json_item_lines(text), ints.long)


def _json_item_lines(text: str) -> list[int] | None:
    """Line of each top-level item of a JSON list, found by decoding it again (error path only)."""
    decoder = json.JSONDecoder(parse_int=_IntReader())
    lines: list[int] = []
    line, counted = 1, 0
    i = text.index("[") + 1
    try:
        while True:
            while i < len(text) and text[i] in " \t\r\n,":
                i += 1
            if i >= len(text) or text[i] == "]":
                return lines
            line += text.count("\n", counted, i)
            counted = i
            lines.append(line)
            _, i = decoder.raw_decode(text, i)
    except (ValueError, IndexError):
        return None


def _read_jsonl(text: str, source: str) -> _Rows:
    records, lines, ints = [], [], _IntReader()
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line, parse_int=ints))
        except json.JSONDecodeError as exc:
            raise RecipeError([f"{source}:{n}:{exc.colno}: not valid JSON: {exc.msg}"]) from None
        lines.append(n)
    return _read_records(records, source, lambda: lines, ints.long)


def _read_yaml(text: str, source: str) -> _Rows:
    from habitrun.spec.yamlpos import load_with_positions

    data, positions = load_with_positions(text, source)
    if data is None:
        data = []
    count = len(data) if isinstance(data, list) else 0
    return _read_records(data, source, lambda: [positions.locate((i,))[0] for i in range(count)])


def read_manifest(path: Path, source: str) -> _Rows:
    """Rows of a manifest file by its suffix; a RecipeError for anything unreadable."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise RecipeError([f"{source}: unknown manifest format {suffix or '(no suffix)'!r}; use one of {', '.join(FORMATS)}"])
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise RecipeError([f"{source}: the manifest is not UTF-8 text"]) from None
    if suffix in (".csv", ".tsv"):
        return _read_delimited(text, source, "," if suffix == ".csv" else "\t")
    if suffix == ".json":
        return _read_json(text, source)
    if suffix in (".jsonl", ".ndjson"):
        return _read_jsonl(text, source)
    return _read_yaml(text, source)


def _id_text(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


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
    rows = _apart_without_case(_with_safe_names([SubjectRow(sid, row, sid) for sid, row in found]))
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
            subject_id = _id_text(subject_id)  # the slow path: ints, padding, blanks
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
    rows = _filtered(loaded, _apart_without_case(_with_safe_names(rows)))
    if not rows:
        raise RecipeError([f"{loaded.locate(('subjects',))}: include/exclude leave no subjects to run"])
    return rows


_ALL_PLAIN = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_.\-]{0,%s}\n)*".replace("%s", str(MAX_SAFE_LEN - 1)))


def _with_safe_names(rows: list[SubjectRow]) -> list[SubjectRow]:
    """Rows whose ``safe`` is :func:`safe_name` of their id.

    Ids are nearly always plain names, their own safe names: one regex over all of
    them (a newline inside an id shows in the count) decides that in a few ms for
    100,000 subjects, instead of a call per subject.
    """
    joined = "".join([row.id + "\n" for row in rows])
    if joined.count("\n") == len(rows) and _ALL_PLAIN.fullmatch(joined):
        return rows
    return [row._replace(safe=safe_name(row.id)) for row in rows]


def _apart_without_case(rows: list[SubjectRow]) -> list[SubjectRow]:
    """Ids equal but for case (``S1``, ``s1``) get ``~`` and a hash of the id in their safe names.

    Their folders and logs would otherwise be one on a case-insensitive file system
    (macOS, Windows). Done for the whole manifest before include/exclude, so a
    subject's folder does not depend on which subjects a run selects.
    """
    if len({row.safe.casefold() for row in rows}) == len(rows):
        return rows  # the usual case, decided in one pass
    seen: dict[str, int] = {}
    for row in rows:
        folded = row.safe.casefold()
        seen[folded] = seen.get(folded, 0) + 1
    out = []
    for row in rows:
        if seen[row.safe.casefold()] > 1:
            digest = hashlib.sha256(row.id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
            row = row._replace(safe=f"{row.safe[:MAX_SAFE_LEN - 9]}~{digest}")
        out.append(row)
    return out


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
        sid = _id_text(fields.get(spec.id))
        if sid in ids and sid not in out:
            out[sid] = f"{table.source}:{table.line(ref)}"
    return out

"""Reading a subjects manifest file (.csv .tsv .json .jsonl .yaml) into raw rows.

A CSV/TSV file without quotes, whose every row has the header's width, is kept
as its lines: a row's fields become a dict only when someone asks for them (a
dict per row is most of the memory of a million-row manifest). Any other
CSV/TSV goes through the csv module. Problems name the manifest file and line;
a row's line is found only when a message needs it.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter, methodcaller
from pathlib import Path
from typing import Any

from habitrun.errors import RecipeError

FORMATS = (".csv", ".tsv", ".json", ".jsonl", ".ndjson", ".yaml", ".yml")


class ManifestRows:
    """Raw rows of a manifest; each row's ``ref`` maps to its line only when a message needs it.

    Rows are either ``rows`` ((ref, fields) pairs) or, for a plain CSV/TSV, ``lines``: the
    text of each row (split at ``delimiter`` into the ``columns``), the first on line ``first``.
    """

    def __init__(self, source: str, lines: Callable[[], list[int] | None] | None = None) -> None:
        self.source = source
        self.rows: list[tuple[int, dict[str, Any]]] = []
        self.columns: list[str] | None = None
        self.lines: list[str] | None = None
        self.delimiter = ","
        self.first = 0
        self.plain_values = False  # lines only: no value needs an escape in its repr (no ' \\ or control)
        self.notes: list[str] = []  # what reading it decided on the user's behalf (a sniffed delimiter, empty rows)
        self._lines = lines
        self._known: list[int] | None = None

    def __len__(self) -> int:
        return len(self.lines) if self.lines is not None else len(self.rows)

    def ref(self, i: int) -> int:
        """The ref of row ``i`` (see :meth:`line`)."""
        return self.first + i if self.lines is not None else self.rows[i][0]

    def fields(self, i: int) -> dict[str, Any]:
        """Row ``i`` as column -> value (for plain lines a new dict on each call)."""
        if self.lines is not None:
            return dict(zip(self.columns or (), self.lines[i].split(self.delimiter), strict=True))
        return self.rows[i][1]

    def pairs(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(ref, fields) of every row, in order."""
        if self.lines is None:
            yield from self.rows
            return
        for i in range(len(self.lines)):
            yield self.first + i, self.fields(i)

    def column(self, name: str) -> list[Any]:
        """Every row's value in column ``name`` (None where a row has none)."""
        if self.lines is not None and self.columns is not None and name in self.columns:
            k = self.columns.index(name)
            return list(map(itemgetter(k), map(methodcaller("split", self.delimiter, k + 1), self.lines)))
        return [fields.get(name) for _, fields in self.pairs()]

    def values(self, index: Sequence[int], columns: Sequence[str]) -> Iterator[tuple[str, ...]]:
        """Rows ``index`` of plain lines as tuples of their values in ``columns`` (all in the header)."""
        assert self.lines is not None and self.columns is not None
        positions = [self.columns.index(c) for c in columns]
        if len(positions) == 1:
            return zip(map(itemgetter(positions[0]), self._cells(index)))
        return map(itemgetter(*positions), self._cells(index))

    def _cells(self, index: Sequence[int]) -> Iterator[list[str]]:
        lines = self.lines or []
        rows = lines if isinstance(index, range) and len(index) == len(lines) else map(lines.__getitem__, index)
        return map(methodcaller("split", self.delimiter), rows)

    def line(self, ref: int) -> int:
        """Line of the row with ``ref`` (CSV: the ref is the line; lists: the item's index)."""
        if self._lines is None:
            return ref
        if self._known is None:
            self._known = self._lines() or []
        return self._known[ref] if ref < len(self._known) else ref + 1


def _read_plain(text: str, source: str, delimiter: str) -> ManifestRows | None:
    """A CSV/TSV as its lines, when the csv module would read exactly the same: no quotes, no
    NUL, no carriage return but in a line end, no blank line and every row as wide as the
    header. None otherwise.

    Reads a million rows in a few C-level passes; :meth:`ManifestRows.fields` splits a line
    the way the csv module does when there are no quotes."""
    if "\r" in text and text.count("\r") == text.count("\r\n"):
        text = text.replace("\r\n", "\n")  # Windows line ends, each one line as for the csv module
    if '"' in text or "\r" in text or "\x00" in text:
        return None
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    start = 0
    while start < len(lines) and not lines[start].replace(delimiter, "").strip():
        start += 1
    if start >= len(lines):
        return None
    header = [c.strip() for c in lines[start].split(delimiter)]
    data = lines[start + 1:]
    del lines
    trailing = 0
    while data and not data[-1].replace(delimiter, "").strip():  # Excel's ';;;' rows and blank lines at the end
        data.pop()
        trailing += 1
    if (len(set(header)) != len(header) or "" in data or delimiter * (len(header) - 1) in data
            or not _as_wide(data, delimiter, len(header))):
        return None  # an empty row among the others: the csv module's reading notes its line
    out = ManifestRows(source)
    if trailing:
        end = start + 2 + len(data)
        out.notes.append(empty_rows_note(source, list(range(end, end + trailing))))
    out.columns, out.lines, out.delimiter, out.first = header, data, delimiter, start + 2
    out.plain_values = "'" not in text and "\\" not in text and _printable(text, delimiter)
    return out


def _as_wide(data: list[str], delimiter: str, width: int) -> bool:
    """Whether every line has ``width`` cells, in C-level passes: of the lines' UTF-8 bytes only
    delimiters and line ends are kept (no other character's bytes are those ASCII bytes), and
    what is left must be ``width - 1`` delimiters a line (half the time of a count per line)."""
    sep, end = delimiter.encode(), b"\n"
    if len(sep) != 1:
        return list(map(methodcaller("count", delimiter), data)).count(width - 1) == len(data)
    others = bytes(b for b in range(256) if b not in (sep[0], end[0]))
    left = "\n".join(data).encode("utf-8", "surrogatepass").translate(None, others)
    return left == ((sep * (width - 1) + end) * len(data))[:-1]


def _printable(text: str, delimiter: str) -> bool:
    """Whether the text is printable but for line ends and delimiters: for ASCII text in one
    C-level pass (every printable byte deleted, nothing may be left)."""
    if text.isascii():
        return not text.encode().translate(None, _ASCII_PRINTABLE + b"\n" + delimiter.encode())
    return text.replace("\n", "").replace(delimiter, "").isprintable()


_ASCII_PRINTABLE = bytes(range(0x20, 0x7F))


def _read_delimited(text: str, source: str, delimiter: str) -> ManifestRows:
    plain = _read_plain(text, source, delimiter)
    if plain is not None:
        return plain
    out = ManifestRows(source)
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
        empty: list[int] = []
        for row in reader:
            if len(row) == width and (row[0].strip() or any(cell.strip() for cell in row)):
                rows.append((reader.line_num, dict(zip(header, row, strict=False))))
            elif not any(cell.strip() for cell in row):
                empty.append(reader.line_num)
            else:
                problems.append(f"{source}:{reader.line_num}:1: row has {len(row)} fields, the header has {width}")
                if len(problems) >= 20:
                    break
    except csv.Error as exc:
        raise RecipeError([f"{source}:{reader.line_num}:1: cannot read the manifest: {exc}"]) from None
    if problems:
        raise RecipeError(problems)
    out.columns = header
    if empty:
        out.notes.append(empty_rows_note(source, empty))
    return out


def empty_rows_note(source: str, lines: list[int]) -> str:
    """``subjects.csv: 3 empty rows ignored (lines 41-43)``: rows with no value carry no subject."""
    if lines == list(range(lines[0], lines[0] + len(lines))):
        where = f"line {lines[0]}" if len(lines) == 1 else f"lines {lines[0]}-{lines[-1]}"
    else:
        where = "lines " + ", ".join(map(str, lines[:5])) + (" ..." if len(lines) > 5 else "")
    return f"{source}: {len(lines)} empty row{'s' if len(lines) > 1 else ''} ignored ({where})"


DELIMITERS = ",;\t|"  # what a manifest's header is sniffed for
_NAMES = {",": "','", ";": "';'", "\t": "tab", "|": "'|'"}


def sniff_delimiter(text: str, default: str) -> str:
    """The delimiter of a CSV/TSV: the suffix's own when the header line has it, else what
    :class:`csv.Sniffer` finds in the header among , ; tab | (Excel writes ';' where the decimal
    mark is a comma), else the suffix's own."""
    header = next((line for line in text.splitlines() if line.strip()), "")
    if default in header:
        return default
    try:
        return csv.Sniffer().sniff(header, delimiters=DELIMITERS).delimiter
    except csv.Error:
        return default


def delimiter_name(delimiter: str) -> str:
    return _NAMES.get(delimiter, repr(delimiter))


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


def _read_records(records: Any, source: str, lines: Callable[[], list[int] | None], long_ints: bool = False) -> ManifestRows:
    out = ManifestRows(source, lines)
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


def _read_json(text: str, source: str) -> ManifestRows:
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


def _read_jsonl(text: str, source: str) -> ManifestRows:
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


def _read_yaml(text: str, source: str) -> ManifestRows:
    from habitrun.spec.yamlpos import load_with_positions

    data, positions = load_with_positions(text, source)
    if data is None:
        data = []
    count = len(data) if isinstance(data, list) else 0
    return _read_records(data, source, lambda: [positions.locate((i,))[0] for i in range(count)])


def read_manifest(path: Path, source: str, delimiter: str | None = None) -> ManifestRows:
    """Rows of a manifest file by its suffix; a RecipeError for anything unreadable.

    A CSV/TSV is split at ``delimiter`` (``subjects.delimiter``), else at the one sniffed
    from its header (:func:`sniff_delimiter`), noted when it is not the suffix's own."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise RecipeError([f"{source}: unknown manifest format {suffix or '(no suffix)'!r}; use one of {', '.join(FORMATS)}"])
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise RecipeError([f"{source}: the manifest is not UTF-8 text"]) from None
    if suffix in (".csv", ".tsv"):
        default = "," if suffix == ".csv" else "\t"
        chosen = delimiter or sniff_delimiter(text, default)
        rows = _read_delimited(text, source, chosen)
        if delimiter is None and chosen != default:
            rows.notes.insert(0, f"{source}: read with {delimiter_name(chosen)} as the delimiter (found in its "
                                 f"header; set subjects.delimiter to choose)")
        return rows
    if suffix == ".json":
        return _read_json(text, source)
    if suffix in (".jsonl", ".ndjson"):
        return _read_jsonl(text, source)
    return _read_yaml(text, source)


def id_text(value: Any) -> str | None:
    """A subject id as text: an int or a non-blank string (stripped); None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None

"""Every subject's input files, from the manifest's file columns: one scan per plan.

Which columns hold files (:func:`file_columns`), the paths in a cell
(:func:`cell_paths`) and, per subject, the text of its files that enters its
keys (:func:`scan_subjects`). Each file's digest comes from a
:class:`~habitrun.planner.files.Digester`; a column whose paths and stats are
those the last plan saw takes its digests from that plan's snapshot.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from habitrun.errors import RecipeError
from habitrun.planner.files import MAX_PROBLEMS, Digester, FileProblem
from habitrun.spec.roots import VAR_HEAD, PathRoots
from habitrun.spec.subjects import row_locations, subject_ids
from habitrun.store.filetable import DIGEST_CHARS

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe


def file_columns(loaded: LoadedRecipe, subjects: Any = None) -> dict[str, bool]:
    """column -> required, for every column holding input files.

    The one place the planner asks which columns are files: the manifest's
    (``subjects.files``) and, for subjects found on disk (``subjects.from`` /
    ``bids``), every column discovery filled with a file (``SubjectTable.file_needs``).
    """
    columns = dict(loaded.recipe.subjects.file_columns())
    needs = getattr(subjects, "file_needs", None)
    if needs is not None:
        columns.update(needs())
    return columns


def cell_paths(cell: Any) -> list[str]:
    """The paths in a manifest cell: ``a;b`` (or a JSON/YAML list), blanks dropped."""
    if cell is None:
        return []
    if isinstance(cell, (list, tuple)):
        return [str(p).strip() for p in cell if str(p).strip()]
    text = cell if isinstance(cell, str) else str(cell)
    if ";" in text:
        return [p.strip() for p in text.split(";") if p.strip()]
    text = text.strip()
    return [text] if text else []


@dataclass
class SubjectFiles:
    """Per subject, the text of its files that enters its keys: for each file column (sorted),
    the digests of the cell's paths joined by ``;`` (a folder: ``/`` and its listing's digest),
    the columns joined by ``\x1e``. The paths themselves are in the manifest row."""

    columns: tuple[str, ...]
    content: dict[str, str]  # empty when no stage reads content
    lenient: dict[str, str]  # sizes instead of digests; empty when no stage is lenient

    def per_column(self, sid: str, lenient: bool) -> tuple[str, ...]:
        text = (self.lenient if lenient else self.content).get(sid)
        return tuple(text.split("\x1e")) if text is not None else ()


_PLAIN_CELLS = re.compile(r"(?:[^\s;~/\n][^;\n]*[^\s;]\n|[^\s;~/\n]\n|\n)*")  # one relative path a cell, or none


def _column_stats(root: str, cells: list[Any], required: bool) -> list[os.stat_result | None] | None:
    """The stat of each cell's file (None for an empty cell of an optional column) when every
    cell is one plain relative path to a regular file readable by all, or empty (the common
    case, decided for the whole column at once); else None."""
    if not all(cell.__class__ is str for cell in cells):
        return None
    joined = "\n".join(cells) + "\n"
    if not _PLAIN_CELLS.fullmatch(joined) or (required and "\n\n" in "\n" + joined):
        return None
    stat = os.stat
    out: list[os.stat_result | None] = []
    put = out.append
    try:
        for cell in cells:
            if not cell:
                put(None)
                continue
            st = stat(root + cell)
            if st.st_mode & 0o170444 != 0o100444:
                return None
            put(st)
    except OSError:
        return None
    return out


def _column_from_table(root: str, cells: list[str], stats: list[os.stat_result | None],
                       known: Mapping[str, str]) -> list[str | None]:
    """Per cell, the digest the store's table has for its file when the file's stat is the one
    it was hashed at ("" for an empty cell), else None."""
    cut = -DIGEST_CHARS
    out: list[str | None] = []
    put = out.append
    known_get = known.get
    for cell, st in zip(cells, stats, strict=True):
        if st is None:
            put("")
            continue
        k = known_get(root + cell)
        put(k[cut:] if k is not None and k[:cut] == f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:" else None)
    return out


def _stats_digest(cells: list[str], stats: list[os.stat_result | None]) -> str:
    """One digest of a column's paths and their files' stats: equal, and no file changed."""
    sigs = [f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}" if st is not None else "" for st in stats]
    text = "\n".join(cells) + "\x00" + "\n".join(sigs)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def scan_subjects(
    loaded: LoadedRecipe,
    subjects: Sequence[Any],
    columns: Mapping[str, bool],
    digester: Digester,
    *,
    lenient: bool = False,
) -> SubjectFiles:
    """Every subject's files, fingerprinted; a RecipeError (exit 2) naming manifest line, column
    and path for each missing or unreadable file, and each required cell left empty.

    ``lenient``: also the size texts. Column by column, the common case (one plain relative
    path a cell) is decided at once: every file is ``stat``-ed, and when the paths and stats
    are those of the column's snapshot (kept by the last plan that saw them: its stats' digest
    and its files' digests) the digests are taken from it, nothing else read. Otherwise each
    file whose stat is the one in the store's file table takes its digest from there; every
    other cell goes through :meth:`Digester.entry`.
    """
    cols = tuple(sorted(columns))
    ids = subject_ids(subjects)
    report = getattr(subjects, "discovery", None)
    scan = _Scan(str(loaded.root) + os.sep, ids, digester, getattr(report, "roots", None))
    per_column: list[list[str]] = []
    per_column_l: list[list[str]] = []
    fast = digester.content and not digester.deep and not lenient
    for col in cols:
        texts, sizes = scan.column(col, _column(subjects, col), columns[col], fast)
        per_column.append(texts)
        per_column_l.append(sizes)
        if len(scan.problems) >= MAX_PROBLEMS:
            break
    if scan.problems:
        where = row_locations(loaded, {sid for sid, _, _ in scan.problems})
        source = loaded.recipe.subjects.manifest
        raise RecipeError([
            f"{where.get(sid, source)}: {col}: subject {sid!r}: {message}" for sid, col, message in scan.problems
        ])
    content = _per_subject(ids, per_column) if digester.content else {}
    return SubjectFiles(cols, content, _per_subject(ids, per_column_l) if lenient else {})


def _per_subject(ids: list[str], per_column: list[list[str]]) -> dict[str, str]:
    """subject -> its texts of every column joined by ``\x1e``."""
    joined = per_column[0] if len(per_column) == 1 else list(map("\x1e".join, zip(*per_column, strict=True)))
    return dict(zip(ids, joined, strict=True))


@dataclass
class _Scan:
    """One scan of the subjects' file columns (see :func:`scan_subjects`), and the problems it found."""

    root: str  # the recipe's folder, ending in a separator
    ids: list[str]
    digester: Digester
    roots: PathRoots | None = None  # found subjects' paths: relative to these (habitrun.spec.roots)
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (subject, column, message)

    def column(self, col: str, cells: list[Any], required: bool, fast: bool) -> tuple[list[str], list[str]]:
        """One column's content texts and size texts (sizes only from cells read one by one)."""
        digester = self.digester
        found: list[str | None] | None = None
        if fast and self.roots is not None and self.roots.data:
            fast = not any(cell.__class__ is str and cell.startswith(VAR_HEAD) for cell in cells)
        stats = _column_stats(self.root, cells, required) if fast else None
        if stats is not None:
            stamp = _stats_digest(cells, stats)
            snap = digester.snapshot(f"files:{col}")
            if snap is not None and snap.startswith(stamp + "\n"):
                digests = snap[len(stamp) + 1:].split(";")
                if len(digests) == len(cells):
                    digester.files += len(cells)
                    return digests, []
            found = _column_from_table(self.root, cells, stats, digester.known)
        texts: list[str] = []
        sizes: list[str] = []
        for i, cell in enumerate(cells):
            if found is not None:
                text = found[i]
                if text is None and stats is not None and (st := stats[i]) is not None:  # found comes with stats
                    text = self._changed(col, i, cell, st)
                if text is not None:
                    texts.append(text)
                    continue
            content, size = self._cell(col, i, cell, required)
            texts.append(content)
            sizes.append(size)
            if len(self.problems) >= MAX_PROBLEMS:
                break
        if stats is not None and not self.problems:
            digester.snapshots[f"files:{col}"] = stamp + "\n" + ";".join(texts)
        return texts, sizes

    def _changed(self, col: str, i: int, cell: str, st: os.stat_result) -> str:
        """A plain path whose file changed (or is new) since the table's digest: hash it."""
        try:
            text = self.digester.content_of(self.root + cell, st)
        except FileProblem as exc:
            self.problems.append((self.ids[i], col, f"{cell} {exc}"))
            text = ""
        self.digester.files += 1
        return text

    def _cell(self, col: str, i: int, cell: Any, required: bool) -> tuple[str, str]:
        """(content text, size text) of any cell: each of its paths, a file or a folder."""
        paths = cell_paths(cell)
        if not paths and required:
            self.problems.append((self.ids[i], col, "no file given (the column is required; mark it optional in subjects.files)"))
        cs: list[str] = []
        ls: list[str] = []
        for written in paths:
            if written.startswith(VAR_HEAD) and self.roots is not None:
                full = self.roots.resolve(written)
            else:
                full = written if written.startswith(os.sep) else self.root + written
            try:
                c, lt = self.digester.entry(written, os.path.expanduser(full) if full.startswith("~") else full)
            except FileProblem as exc:
                self.problems.append((self.ids[i], col, f"{written} {exc}"))
                continue
            cs.append(c)
            ls.append(lt)
        return ";".join(cs), ";".join(ls)


def _column(subjects: Sequence[Any], name: str) -> list[Any]:
    """Every subject's value in column ``name`` (a SubjectTable's without building its rows)."""
    column = getattr(subjects, "column", None)
    return column(name) if column is not None else [row.fields.get(name) for row in subjects]


def outside_inputs(loaded: LoadedRecipe, subjects: Any, limit: int = 3) -> dict[str, list[str]]:
    """map stage -> the first ``limit`` input files its subjects name by an absolute path (outside
    the study and every declared data root: see :mod:`habitrun.spec.roots`): what a moved or
    cloned study still needs at the same place."""
    columns = file_columns(loaded, subjects)
    found: dict[str, list[str]] = {}
    for col in sorted(columns):
        cells = _column(subjects, col)
        try:  # the usual column, decided at once: no cell starts with / or ~ (nor a blank or a list)
            joined = "\n" + "\n".join(cells)
        except TypeError:
            joined = "\n/"
        if not any(mark in joined for mark in ("\n/", "\n~", "\n ", ";")):
            continue
        absolute = [p for cell in cells if cell.__class__ is not str or "/" in cell[:1] or "~" in cell[:1] or ";" in cell
                    for p in cell_paths(cell) if p.startswith(("/", "~"))]
        if absolute:
            found[col] = absolute
    if not found:
        return {}
    out: dict[str, list[str]] = {}
    for stage in loaded.recipe.stages:
        if stage.kind != "map":
            continue
        paths = [p for col, ps in found.items() if stage.fields is None or col in stage.fields for p in ps]
        if paths:
            out[stage.name] = paths[:limit] if limit else paths
    return out

"""Input files in keys: manifest file columns and a stage's declared inputs, by content.

A file's digest comes from the store's table (:mod:`habitrun.store.filetable`)
when its size, mtime and inode are the ones recorded with it (one ``stat``, no
read); otherwise the file is read and hashed (blake2b, 128 bits). The three
cache modes (``policy.cache``, per stage too):

* ``standard``: as above; a touched file, or a copy with equal content, is
  hashed again and found unchanged.
* ``deep``: every file is read and hashed on every plan.
* ``lenient``: a file counts by its path and size only, and is never read
  (for file systems whose mtimes drift).

A folder counts as every file under it (recursively, sorted): one digest of
their relative paths and digests (or sizes).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import stat as statmod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from habitrun.errors import RecipeError
from habitrun.spec.subjects import row_locations
from habitrun.store.filetable import (
    DIGEST_CHARS,
    known_files,
    remember_files,
    remember_snapshots,
    stat_text,
)

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe
    from habitrun.store.checkpoint import CheckpointStore

MAX_PROBLEMS = 20
_CHUNK = 1 << 20


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


def hash_file(path: str) -> str:
    """blake2b (128 bits) of a file's bytes (``os.read`` on a descriptor: no file object, so a
    small file costs an open, a read or two and a close)."""
    h = hashlib.blake2b(digest_size=16)
    fd = os.open(path, os.O_RDONLY)
    try:
        while chunk := os.read(fd, _CHUNK):
            h.update(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


class FileProblem(Exception):
    """A file that is not there, or cannot be read (a message without its location)."""


@dataclass
class Digester:
    """Digests of files, from the store's table where a stat allows, else by reading them."""

    store: CheckpointStore | None
    deep: bool = False
    content: bool = True  # False: lenient only, nothing is read
    check_readable: bool = False  # lenient only: still say which files cannot be read (validate)
    fresh: list[tuple[str, int, int, int, str]] = field(default_factory=list)  # rows for the table
    bytes_read: int = 0
    files: int = 0
    _memo: dict[str, str] = field(default_factory=dict)
    _known: Mapping[str, str] | None = None
    snapshots: dict[str, str] = field(default_factory=dict)  # to write: meta name -> value

    @property
    def known(self) -> Mapping[str, str]:
        """path -> size:mtime_ns:inode:digest (habitrun.store.filetable), loaded when first asked."""
        if self._known is None:
            self._known = known_files(self.store)
        return self._known

    def snapshot(self, name: str) -> str | None:
        """A column's snapshot kept by an earlier plan (see :func:`scan_subjects`)."""
        if self.store is None:
            return None
        try:
            return self.store.meta(name)
        except Exception:  # noqa: BLE001 - a cache: a store that cannot say means "none"
            return None

    def _content(self, path: str, st: os.stat_result) -> str:
        k = self.known.get(path)
        if not self.deep and k is not None and k[:-DIGEST_CHARS] == stat_text(st.st_size, st.st_mtime_ns, st.st_ino):
            if (st.st_mode & 0o444) != 0o444 and not os.access(path, os.R_OK):
                raise FileProblem("cannot be read (permission denied)")
            return k[-DIGEST_CHARS:]
        done = self._memo.get(path)
        if done is not None:
            return done
        try:
            digest = hash_file(path)
        except PermissionError:
            raise FileProblem("cannot be read (permission denied)") from None
        except OSError as exc:
            raise FileProblem(f"cannot be read ({exc.strerror or exc})") from None
        self.bytes_read += st.st_size
        self.fresh.append((path, st.st_size, st.st_mtime_ns, st.st_ino, digest))
        self._memo[path] = digest
        return digest

    def content_of(self, path: str, st: os.stat_result) -> str:
        """The digest of a regular file whose ``stat`` the caller has taken."""
        return self._content(path, st)

    def entry(self, written: str, path: str) -> tuple[str, str]:
        """(content text, lenient text) of one path: a file's digest and size; for a folder of
        files, ``/`` and a digest of their relative paths and digests (and sizes)."""
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise FileProblem("does not exist") from None
        except OSError as exc:
            raise FileProblem(f"cannot be read ({exc.strerror or exc})") from None
        self.files += 1
        if not statmod.S_ISDIR(st.st_mode):
            if self.check_readable and not self.content and not os.access(path, os.R_OK):
                raise FileProblem("cannot be read (permission denied)")
            return (self._content(path, st) if self.content else ""), str(st.st_size)
        listing_c = hashlib.blake2b(digest_size=16)
        listing_l = hashlib.blake2b(digest_size=16)
        for rel, full, sub in _walk(path):
            self.files += 1
            if self.content:
                listing_c.update(f"{rel}={self._content(full, sub)}\n".encode("utf-8", "surrogatepass"))
            listing_l.update(f"{rel}#{sub.st_size}\n".encode("utf-8", "surrogatepass"))
        return ("/" + listing_c.hexdigest() if self.content else ""), "/" + listing_l.hexdigest()

    def save(self, store: CheckpointStore | None) -> None:
        """Remember what was hashed (best effort) so the next plan does not read it again."""
        if store is not None and self.fresh:
            remember_files(store, self.fresh)
            self.fresh = []
        if store is not None and self.snapshots:
            remember_snapshots(store, self.snapshots)
            self.snapshots = {}


def _walk(folder: str) -> list[tuple[str, str, os.stat_result]]:
    out: list[tuple[str, str, os.stat_result]] = []
    stack = [(folder, "")]
    while stack:
        here, rel = stack.pop()
        try:
            entries = list(os.scandir(here))
        except OSError as exc:
            raise FileProblem(f"folder {rel or '.'} cannot be listed ({exc.strerror or exc})") from None
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=True):
                stack.append((entry.path, name))
            else:
                try:
                    out.append((name, entry.path, entry.stat(follow_symlinks=True)))
                except OSError:
                    raise FileProblem(f"{name} does not exist (a broken link?)") from None
    out.sort(key=lambda item: item[0])
    return out


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
    root = str(loaded.root) + os.sep
    sep = os.sep
    ids = [row.id for row in subjects]
    problems: list[tuple[str, str, str]] = []  # (subject, column, message)
    per_column: list[list[str]] = []
    per_column_l: list[list[str]] = []
    fast = digester.content and not digester.deep and not lenient
    for col in cols:
        required = columns[col]
        cells = [row.fields.get(col) for row in subjects]
        found: list[str | None] | None = None
        stats = _column_stats(root, cells, required) if fast else None
        if stats is not None:
            name = f"files:{col}"
            stamp = _stats_digest(cells, stats)
            snap = digester.snapshot(name)
            if snap is not None and snap.startswith(stamp + "\n"):
                digests = snap[len(stamp) + 1:].split(";")
                if len(digests) == len(cells):
                    digester.files += len(cells)
                    per_column.append(digests)
                    per_column_l.append([])
                    continue
            found = _column_from_table(root, cells, stats, digester.known)
        texts: list[str] = []
        sizes: list[str] = []
        for i, cell in enumerate(cells):
            if found is not None:
                if found[i] is not None:
                    texts.append(found[i])  # type: ignore[arg-type]
                    continue
                st = stats[i]  # type: ignore[index]
                if st is not None:  # a plain path whose file changed (or is new): hash it
                    try:
                        texts.append(digester.content_of(root + cell, st))
                    except FileProblem as exc:
                        problems.append((ids[i], col, f"{cell} {exc}"))
                        texts.append("")
                    digester.files += 1
                    continue
            paths = cell_paths(cell)
            if not paths and required:
                problems.append((ids[i], col, "no file given (the column is required; mark it optional in subjects.files)"))
            cs: list[str] = []
            ls: list[str] = []
            for written in paths:
                full = written if written.startswith(sep) else root + written
                try:
                    c, lt = digester.entry(written, os.path.expanduser(full) if full.startswith("~") else full)
                except FileProblem as exc:
                    problems.append((ids[i], col, f"{written} {exc}"))
                    continue
                cs.append(c)
                ls.append(lt)
            texts.append(";".join(cs))
            sizes.append(";".join(ls))
            if len(problems) >= MAX_PROBLEMS:
                break
        per_column.append(texts)
        per_column_l.append(sizes)
        if stats is not None and not problems:
            digester.snapshots[f"files:{col}"] = stamp + "\n" + ";".join(texts)
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        where = row_locations(loaded, {sid for sid, _, _ in problems})
        source = loaded.recipe.subjects.manifest
        raise RecipeError([
            f"{where.get(sid, source)}: {col}: subject {sid!r}: {message}" for sid, col, message in problems
        ])
    content: dict[str, str] = {}
    if digester.content:
        joined = per_column[0] if len(per_column) == 1 else list(map("\x1e".join, zip(*per_column, strict=True)))
        content = dict(zip(ids, joined, strict=True))
    lenients: dict[str, str] = {}
    if lenient:
        joined = per_column_l[0] if len(per_column_l) == 1 else list(map("\x1e".join, zip(*per_column_l, strict=True)))
        lenients = dict(zip(ids, joined, strict=True))
    return SubjectFiles(cols, content, lenients)


def stage_inputs(loaded: LoadedRecipe, stage_index: int, digester: Digester, *, lenient: bool) -> dict[str, str]:
    """A stage's declared ``inputs`` (paths or globs under the recipe's folder): written -> digest
    text; a RecipeError at the recipe line of a path that does not exist or a glob matching nothing."""
    stage = loaded.recipe.stages[stage_index]
    root = str(loaded.root)
    out: dict[str, str] = {}
    problems: list[str] = []
    for j, pattern in enumerate(stage.inputs):
        full = os.path.expanduser(pattern if os.path.isabs(os.path.expanduser(pattern)) else os.path.join(root, pattern))
        if glob.has_magic(pattern):
            matches = sorted(glob.glob(full, recursive=True))
            if not matches:
                problems.append(f"{loaded.locate(('stages', stage_index, 'inputs', j))}: {pattern!r} matches no file")
                continue
            pairs = [(os.path.relpath(m, root) if not os.path.isabs(pattern) else m, m) for m in matches]
        else:
            pairs = [(pattern, full)]
        for written, path in pairs:
            try:
                c, lt = digester.entry(written, path)
            except FileProblem as exc:
                problems.append(f"{loaded.locate(('stages', stage_index, 'inputs', j))}: {written} {exc}")
                continue
            out[written] = lt if lenient else c
    if problems:
        raise RecipeError(problems)
    return out

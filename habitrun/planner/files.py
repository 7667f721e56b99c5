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
import stat as statmod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from habitrun.errors import RecipeError
from habitrun.spec.subjects import row_locations
from habitrun.store.filetable import DIGEST_CHARS, known_files, remember_files, stat_text

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe
    from habitrun.store.checkpoint import CheckpointStore

MAX_PROBLEMS = 20
_CHUNK = 1 << 20


def file_columns(loaded: LoadedRecipe) -> dict[str, bool]:
    """column -> required, for every manifest column holding input files.

    The one place the planner asks which columns are files: another source of
    subjects fills its columns in through ``subjects.files`` the same way.
    """
    return loaded.recipe.subjects.file_columns()


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
    """blake2b (128 bits) of a file's bytes."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class FileProblem(Exception):
    """A file that is not there, or cannot be read (a message without its location)."""


@dataclass
class Digester:
    """Digests of files, from the store's table where a stat allows, else by reading them."""

    known: Mapping[str, str]  # path -> size:mtime_ns:inode:digest (habitrun.store.filetable)
    deep: bool = False
    content: bool = True  # False: lenient only, nothing is read
    check_readable: bool = False  # lenient only: still say which files cannot be read (validate)
    fresh: list[tuple[str, int, int, int, str]] = field(default_factory=list)  # rows for the table
    bytes_read: int = 0
    files: int = 0
    _memo: dict[str, str] = field(default_factory=dict)

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

    ``lenient``: also the size texts. The loop is written for the common case (one readable
    file per cell, its stat as the store's table has it): a ``stat``, a dict lookup and a
    compare; anything else goes through :meth:`Digester.entry`.
    """
    cols = tuple(sorted(columns))
    plan = [(col, columns[col]) for col in cols]
    root = str(loaded.root) + os.sep
    content: dict[str, str] = {}
    lenients: dict[str, str] = {}
    problems: list[tuple[str, str, str]] = []  # (subject, column, message)
    entry = digester.entry
    known_get = digester.known.get
    fast = digester.content and not digester.deep and not lenient
    stat = os.stat
    sep = os.sep
    odd_first = " ~" + sep
    cut = -DIGEST_CHARS
    for row in subjects:
        fields = row.fields
        per_c: list[str] = []
        per_l: list[str] = []
        for col, required in plan:
            cell = fields.get(col)
            if fast and cell.__class__ is str and cell and ";" not in cell and cell[0] not in odd_first \
                    and cell[-1] != " ":
                full = root + cell
                try:
                    st = stat(full)
                except OSError:
                    st = None
                # a regular file readable by all, whose stat is the one its digest was taken at
                if st is not None and st.st_mode & 0o170444 == 0o100444:
                    k = known_get(full)
                    if k is not None and k[:cut] == f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:":
                        per_c.append(k[cut:])
                        continue
            paths = cell_paths(cell)
            if not paths:
                if required:
                    problems.append((row.id, col, "no file given (the column is required; mark it optional in subjects.files)"))
                per_c.append("")
                per_l.append("")
                continue
            cs: list[str] = []
            ls: list[str] = []
            for written in paths:
                full = written if written.startswith(sep) else root + written
                try:
                    c, lt = entry(written, os.path.expanduser(full) if full.startswith("~") else full)
                except FileProblem as exc:
                    problems.append((row.id, col, f"{written} {exc}"))
                    continue
                cs.append(c)
                ls.append(lt)
            per_c.append(";".join(cs))
            per_l.append(";".join(ls))
        if problems and len(problems) >= MAX_PROBLEMS:
            break
        content[row.id] = "\x1e".join(per_c)
        if lenient:
            lenients[row.id] = "\x1e".join(per_l)
    if problems:
        where = row_locations(loaded, {sid for sid, _, _ in problems})
        source = loaded.recipe.subjects.manifest
        raise RecipeError([
            f"{where.get(sid, source)}: {col}: subject {sid!r}: {message}" for sid, col, message in problems
        ])
    return SubjectFiles(cols, content if digester.content else {}, lenients)


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


def load_known(store: CheckpointStore | None) -> dict[str, str]:
    """The store's file table (see :mod:`habitrun.store.filetable`)."""
    return known_files(store)

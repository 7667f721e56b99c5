"""Input files in keys, by content: the digest of a file or folder, and a stage's declared inputs.

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
their relative paths and digests (or sizes). The manifest's file columns are
scanned in :mod:`habitrun.planner.subject_files`.
"""

from __future__ import annotations

import glob
import hashlib
import os
import stat as statmod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from habitrun.errors import RecipeError
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

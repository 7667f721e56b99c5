"""Making the folders a run writes to, with errors that say which folder and how to move it.

A study's runs, store and lock go under ``run_dir`` (default ``.habitrun``
beside the recipe) and the store may be moved with ``policy.checkpoint_dir``.
When one of them cannot be made or written — a read-only study folder, a
plain file (or ``/dev/null``) where a folder belongs, a full disk — the user
needs the folder named and those two settings as the way out, not an
``OSError`` traceback.
"""

from __future__ import annotations

import errno
from pathlib import Path

from habitrun.errors import StoreError

WAY_OUT = ("set the recipe's run_dir (runs, store and lock) or policy.checkpoint_dir (the store) "
           "to a folder you can write")
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DENIED_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


def _blocker(folder: Path) -> Path | None:
    """The nearest existing ancestor of ``folder`` (itself included) that is not a folder."""
    for path in (folder, *folder.parents):
        if path.exists() or path.is_symlink():
            return None if path.is_dir() else path
    return None


def _what(path: Path) -> str:
    if path.is_symlink():
        try:
            return f"a symbolic link to {path.readlink()}, not a folder"
        except OSError:
            return "a symbolic link, not a folder"
    if path.exists() and not path.is_file():
        return "a device or other special file, not a folder"
    return "a file, not a folder" if path.exists() else "a dangling symbolic link"


def folder_error(folder: Path, exc: OSError, *, doing: str = "write in") -> StoreError:
    """A StoreError for ``exc`` met while using ``folder``: what is wrong there and the way out."""
    folder = Path(folder)
    blocker = _blocker(folder)
    if blocker is not None or exc.errno in (errno.EEXIST, errno.ENOTDIR):
        where = blocker or folder
        needs = "a folder there" if where == folder else f"a folder there to make {folder}"
        special = where.exists() and not where.is_file()  # /dev/null and friends: not the user's to move
        way = WAY_OUT[0].upper() + WAY_OUT[1:] if special else f"Move it away, or {WAY_OUT}"
        return StoreError(f"{where} is {_what(where)}: habitrun needs {needs}. {way}.")
    reason = exc.strerror or str(exc)
    if exc.errno in FULL_ERRNOS:
        return StoreError(f"cannot {doing} {folder}: {reason}. Free space on that disk, or {WAY_OUT} "
                          "on another disk.")
    if exc.errno in DENIED_ERRNOS:
        return StoreError(f"cannot {doing} {folder}: {reason}. habitrun keeps the study's runs and "
                          f"checkpoint store there; make it writable, or {WAY_OUT}.")
    return StoreError(f"cannot {doing} {folder}: {reason}. Fix that folder, or {WAY_OUT}.")


def ensure_folder(folder: Path) -> Path:
    """Create ``folder`` (and its parents) or raise a StoreError naming it and the way out."""
    folder = Path(folder)
    blocker = _blocker(folder)
    if blocker is not None:
        raise folder_error(folder, FileExistsError(errno.EEXIST, "File exists"))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise folder_error(folder, exc, doing="create") from None
    return folder

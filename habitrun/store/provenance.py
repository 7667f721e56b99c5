"""What a run records about itself, so a result can be traced to code, data and machine.

Nothing here imports a study's operator modules: their packages' versions
come from the installed distributions' metadata.
"""

from __future__ import annotations

import getpass
import importlib.metadata as md
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import habitrun


def _user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return os.environ.get("USER")


def package_versions(modules: Iterable[str]) -> dict[str, dict[str, str] | None]:
    """For each module, ``{distribution: version}`` of the distribution(s) that ship its top level.

    A module not installed from a distribution (a study's own ``study_ops``) maps to None.
    Cheap in the usual cases, as it runs before every run: a module nothing on
    ``sys.path`` holds, or one in a folder without installed distributions, is
    the study's own; a distribution named like the module that ships it is the
    owner. Only what is left (``yaml`` from PyYAML, namespace packages) needs
    the full scan of every installed distribution's file list.
    """
    tops = {module: module.split(".", 1)[0] for module in set(modules)}
    owners: dict[str, list[str]] = {}
    unresolved = []
    for top in sorted(set(tops.values())):
        where = _where(top)
        if where is None:
            continue  # nothing installed here holds it
        if where.is_dir() and not _holds_distributions(where):
            continue  # a plain folder of code: the study's own
        named = _named_owner(top) if _single_location(top) else None
        if named is not None:
            owners[top] = [named]
        else:
            unresolved.append(top)
    if unresolved:
        try:
            every = md.packages_distributions()
        except Exception:  # noqa: BLE001 - broken metadata of an unrelated package
            every = {}
        for top in unresolved:
            owners[top] = list(every.get(top, []))
    out: dict[str, dict[str, str] | None] = {}
    for module in sorted(tops):
        versions: dict[str, str] = {}
        for dist in sorted(set(owners.get(tops[module], []))):
            try:
                versions[dist] = md.version(dist)
            except md.PackageNotFoundError:
                continue
        out[module] = versions or None
    return out


def _spec(top: str) -> Any:
    try:
        return importlib.util.find_spec(top)  # a top-level name: finds it, imports nothing
    except (ImportError, ValueError):
        return None


def _where(top: str) -> Path | None:
    """The folder holding the top-level module (its ``sys.path`` entry), or a path that is not a folder."""
    spec = _spec(top)
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("built-in", "frozen") and spec.submodule_search_locations is None:
        return Path(spec.origin).parent
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return Path(spec.origin).parent.parent
    locations = list(spec.submodule_search_locations or [])
    return Path(locations[0]).parent if locations else Path(spec.origin or top)


def _single_location(top: str) -> bool:
    """Not a namespace package (whose parts several distributions may ship)."""
    spec = _spec(top)
    return spec is not None and spec.origin not in (None, "namespace")


def _holds_distributions(folder: Path) -> bool:
    try:
        return any(entry.name.endswith((".dist-info", ".egg-info")) for entry in os.scandir(folder))
    except OSError:
        return True  # cannot tell: let the scan decide


def _named_owner(top: str) -> str | None:
    """The distribution named like ``top`` (``-``/``_``/case aside), when it ships ``top``."""
    try:
        dist = md.distribution(top)
    except (md.PackageNotFoundError, ValueError):
        return None
    declared = (dist.read_text("top_level.txt") or "").split()
    shipped = set(declared) or {
        f.parts[0] if len(f.parts) > 1 else f.with_suffix("").name
        for f in (dist.files or []) if f.suffix == ".py"
    }
    name = dist.metadata["Name"]
    return name if top in shipped and name else None


def _git(folder: Path, *args: str, strip: bool = True) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() if strip else done.stdout


def _changed_paths(porcelain: str) -> list[str]:
    """The paths in ``git status --porcelain -z`` output (a rename's or copy's new path only)."""
    paths: list[str] = []
    entries = iter(porcelain.split("\0"))
    for entry in entries:
        if len(entry) < 4:
            continue
        paths.append(entry[3:])
        if entry[0] in "RC":
            next(entries, None)  # the path it was renamed or copied from
    return sorted(set(paths))


_early_git: dict[Path, tuple[threading.Thread, dict[str, Any]]] = {}


def start_git_state(folder: Path) -> None:
    """Read :func:`git_state` of ``folder`` in a thread now, for the run's provenance to take later.

    `run` starts it first thing: three ``git`` processes (more than 10 ms, far more in a large
    repository) then overlap with the imports and the plan instead of delaying the run folder.
    The thread also fills ``platform.platform()``'s cache: on Linux that runs ``uname -p`` and
    reads the Python executable for its libc version (5-10 ms), the same for the whole process.
    """
    folder = Path(folder).resolve()
    if folder in _early_git:
        return
    state: dict[str, Any] = {}

    def read() -> None:
        state.update(git_state(folder))
        platform.platform()

    thread = threading.Thread(target=read, name="habitrun-git-state",
                              daemon=True)  # not waited for by an exit (a run with nothing to do never asks)
    thread.start()
    _early_git[folder] = (thread, state)


def _started_git_state(folder: Path) -> dict[str, Any]:
    """What :func:`start_git_state` read of ``folder`` (waited for), else read now."""
    early = _early_git.pop(folder, None)
    if early is not None:
        early[0].join()
        if early[1]:
            return early[1]
    return git_state(folder)


def git_state(folder: Path) -> dict[str, Any]:
    """The commit and dirty flag of the git repository holding ``folder`` (nulls without git), and the
    tracked files with uncommitted changes (``changed``, relative to the repository's root)."""
    state: dict[str, Any] = {"commit": None, "dirty": None, "root": None}
    if shutil.which("git") is None:
        return state
    commit = _git(folder, "rev-parse", "HEAD")
    if commit is None:
        return state
    state["commit"] = commit
    state["root"] = _git(folder, "rev-parse", "--show-toplevel")
    status = _git(folder, "status", "--porcelain", "-z", "--untracked-files=no", strip=False)
    state["dirty"] = None if status is None else bool(status)
    if status:
        state["changed"] = _changed_paths(status)
    return state


def collect_provenance(
    *,
    recipe_path: Path,
    recipe_sha256: str,
    argv: list[str],
    operator_modules: Iterable[str],
    backend: dict[str, Any],
    operator_packages: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The provenance record a run writes when it starts (``finish`` adds the end).

    ``operator_packages``: per stage, the distributions its code imports with their versions (the
    runner has them from its plan); without it, per operator module, the distribution shipping it.
    """
    recipe_path = Path(recipe_path).resolve()
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    git = _started_git_state(recipe_path.parent)  # before platform(): its thread has filled that cache too
    return {
        "started_at": started_at,
        "user": _user(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(argv),
        "cwd": os.getcwd(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "habitrun": habitrun.__version__,
        "recipe": {"path": str(recipe_path), "sha256": recipe_sha256},
        "git": git,
        "operator_packages": package_versions(operator_modules) if operator_packages is None
        else operator_packages,
        "backend": dict(backend),
    }

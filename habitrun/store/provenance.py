"""What a run records about itself, so a result can be traced to code, data and machine.

Nothing here imports a study's operator modules: their packages' versions
come from the installed distributions' metadata.
"""

from __future__ import annotations

import getpass
import importlib.metadata as md
import os
import platform
import shutil
import socket
import subprocess
import sys
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
    """
    try:
        owners = md.packages_distributions()
    except Exception:  # noqa: BLE001 - broken metadata of an unrelated package
        owners = {}
    out: dict[str, dict[str, str] | None] = {}
    for module in sorted(set(modules)):
        top = module.split(".", 1)[0]
        dists = owners.get(top)
        if not dists:
            out[module] = None
            continue
        versions: dict[str, str] = {}
        for dist in sorted(set(dists)):
            try:
                versions[dist] = md.version(dist)
            except md.PackageNotFoundError:
                continue
        out[module] = versions or None
    return out


def _git(folder: Path, *args: str) -> str | None:
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
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(folder: Path) -> dict[str, Any]:
    """The commit and dirty flag of the git repository holding ``folder`` (nulls without git)."""
    state: dict[str, Any] = {"commit": None, "dirty": None, "root": None}
    if shutil.which("git") is None:
        return state
    commit = _git(folder, "rev-parse", "HEAD")
    if commit is None:
        return state
    state["commit"] = commit
    state["root"] = _git(folder, "rev-parse", "--show-toplevel")
    status = _git(folder, "status", "--porcelain", "--untracked-files=no")
    state["dirty"] = None if status is None else bool(status)
    return state


def collect_provenance(
    *,
    recipe_path: Path,
    recipe_sha256: str,
    argv: list[str],
    operator_modules: Iterable[str],
    backend: dict[str, Any],
) -> dict[str, Any]:
    """The provenance record a run writes when it starts (``finish`` adds the end)."""
    recipe_path = Path(recipe_path).resolve()
    return {
        "started_at": datetime.now().astimezone().isoformat(timespec="seconds"),
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
        "git": git_state(recipe_path.parent),
        "operator_packages": package_versions(operator_modules),
        "backend": dict(backend),
    }

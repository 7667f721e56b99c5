"""A run's environment lock: the interpreter, the platform, every installed distribution, the repo, the code.

Each run folder holds ``environment.json`` (written when the run starts) and
``inputs.tsv`` (every input file the run's keys read, with its digest), so two
runs can be compared (`habitrun diff`) and a run exported (`habitrun export`)
years later. The distributions are listed by reading each ``*.dist-info`` /
``*.egg-info`` folder's first header lines on ``sys.path`` (the set
``importlib.metadata.distributions()`` finds, first one on the path winning,
as there): about 2 ms for 150 distributions where parsing every METADATA with
``importlib.metadata`` takes 30-250 ms, which a run would feel.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import habitrun
from habitrun.errors import StoreError

ENVIRONMENT_FILE = "environment.json"
INPUTS_FILE = "inputs.tsv"
INPUTS_HEADER = "subject\tcolumn\tpath\tdigest\n"
FORMAT = 1


def installed_distributions(path: Iterable[str] | None = None) -> dict[str, str]:
    """Every installed distribution -> its version (what ``pip freeze`` lists), sorted by name.

    ``path`` defaults to ``sys.path``; a name found twice keeps its first folder's version, as
    ``import`` and ``importlib.metadata`` do.
    """
    found: dict[str, tuple[str, str]] = {}
    for entry in (sys.path if path is None else path):
        try:
            listing = os.scandir(entry or ".")
        except OSError:
            continue
        with listing:
            for item in listing:
                name_version = _read_header(item)
                if name_version is not None:
                    key = _canonical(name_version[0])
                    found.setdefault(key, name_version)
    return dict(sorted(found.values(), key=lambda nv: nv[0].lower()))


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _read_header(item: os.DirEntry[str]) -> tuple[str, str] | None:
    """(Name, Version) from a ``.dist-info`` / ``.egg-info`` entry's metadata headers, else None."""
    if item.name.endswith(".dist-info"):
        meta = os.path.join(item.path, "METADATA")
    elif item.name.endswith(".egg-info"):
        meta = os.path.join(item.path, "PKG-INFO") if item.is_dir() else item.path
    else:
        return None
    name = version = None
    try:
        with open(meta, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line in ("\n", "\r\n"):
                    break  # the end of the headers
                if line.startswith("Name:"):
                    name = line[5:].strip()
                elif line.startswith("Version:"):
                    version = line[8:].strip()
                if name and version:
                    break
    except OSError:
        return None
    return (name, version or "") if name else None


def file_sha256(path: Path) -> str | None:
    """The sha256 of a file's bytes (None: it cannot be read, e.g. deleted)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def repo_lock(git: Mapping[str, Any]) -> dict[str, Any]:
    """The study repo's part of the lock, from provenance's git state: its commit and each dirty
    tracked file's sha256 (null: deleted), or why there is no commit to name."""
    commit = git.get("commit")
    if shutil.which("git") is None:
        return {"status": "git is not installed on this machine", "commit": None}
    if commit is None:
        return {"status": "the study is not in a git repository (or it has no commit)", "commit": None}
    root = Path(git.get("root") or ".")
    changed = list(git.get("changed") or ())
    return {
        "status": "uncommitted changes" if changed else "clean",
        "commit": commit,
        "root": str(root),
        "dirty_files": {rel: file_sha256(root / rel) for rel in changed},
    }


def environment(*, git: Mapping[str, Any], stages: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``environment.json`` of a run: ``stages`` gives each stage's code digest, study files and packages."""
    return {
        "format": FORMAT,
        "habitrun": habitrun.__version__,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "platform": {
            "platform": platform.platform(),
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
        },
        "git": repo_lock(git),
        "stages": {name: dict(info) for name, info in stages.items()},
        "distributions": installed_distributions(),
    }


def write_environment(folder: Path, env: Mapping[str, Any], input_lines: Sequence[str]) -> None:
    """Write ``environment.json`` and ``inputs.tsv`` (its lines: subject, column, path, digest; see
    :func:`tsv_line`) into a run folder."""
    folder = Path(folder)
    text = INPUTS_HEADER + "".join(line + "\n" for line in input_lines)
    data = {**env, "inputs": {"file": INPUTS_FILE, "count": len(input_lines),
                              "sha256": hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()}}
    try:
        (folder / INPUTS_FILE).write_text(text, encoding="utf-8", errors="surrogateescape")
        with open(folder / ENVIRONMENT_FILE, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, ensure_ascii=False, default=str)
            fh.write("\n")
    except OSError as exc:
        raise StoreError(f"cannot write the environment lock in {folder}: {exc}") from None


def tsv_line(*values: str) -> str:
    """One line of ``inputs.tsv``: a tab or line break inside a value becomes a space."""
    return "\t".join(str(v).replace("\t", " ").replace("\n", " ").replace("\r", " ") for v in values)


def read_environment(folder: Path) -> dict[str, Any] | None:
    """A run folder's ``environment.json``, or None for a run written before habitrun kept one."""
    path = Path(folder) / ENVIRONMENT_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path} cannot be read ({exc}); the run folder is damaged") from None
    if not isinstance(data, dict):
        raise StoreError(f"{path} does not hold a JSON object; the run folder is damaged")
    return data


def read_inputs(folder: Path) -> dict[tuple[str, str, str], str] | None:
    """(subject, column, path) -> digest of every input file a run read (None: no ``inputs.tsv``)."""
    path = Path(folder) / INPUTS_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"{path} cannot be read ({exc}); the run folder is damaged") from None
    out: dict[tuple[str, str, str], str] = {}
    for line in text.splitlines()[1:]:
        parts = line.split("\t")
        if len(parts) == 4:
            out[(parts[0], parts[1], parts[2])] = parts[3]
    return out

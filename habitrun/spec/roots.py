"""Where a study's files are, by name: the study folder and the data roots its recipe declares.

A found subject's file is stored (in its row, hence in its keys, its run's
subjects table and its records' reasons) relative to a root, so that copying,
moving or cloning the study, or moving its data and changing one ``vars``
value, changes no key:

* under a data root: ``${vars.NAME}/sub/S1/ct.nii.gz``, where ``NAME`` is a
  top-level ``vars`` entry whose value (a folder, absolute or relative to the
  recipe) begins the recipe's ``subjects.from`` template(s), ``subjects.bids``
  or ``subjects.manifest``: writing ``from: "${vars.data}/{subject}/ct.nii.gz"``
  declares it;
* under the study folder (the recipe's): the path relative to it, as a
  manifest writes it (``data/S1/ct.nii.gz``);
* anywhere else: the absolute path, as found (``plan`` names the stages
  that depend on such files: they do not survive a move).

:meth:`PathRoots.resolve` turns a stored path back into the file's absolute
path today: operators receive that (:func:`habitrun.spec.subjects.rows_by_id`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe

VAR_HEAD = "${vars."


@dataclass(frozen=True)
class PathRoots:
    """The study folder and the declared data roots (name -> absolute folder)."""

    study: str
    data: tuple[tuple[str, str], ...] = ()  # (vars name, absolute folder), longest folder first

    def portable(self, path: str) -> str:
        """An absolute path as stored: under a data root, under the study, or as it is."""
        if "/." in path or "//" in path:
            path = os.path.normpath(path)
        for name, folder in self.data:
            if path.startswith(folder) and path[len(folder):len(folder) + 1] == "/":
                return f"{VAR_HEAD}{name}}}{path[len(folder):]}"
        study = self.study
        if path.startswith(study) and path[len(study):len(study) + 1] == "/":
            return path[len(study) + 1:]
        return path

    def resolve(self, stored: str) -> str:
        """A stored path as the file's absolute path today."""
        if stored.startswith(VAR_HEAD):
            name, close, rest = stored[len(VAR_HEAD):].partition("}")
            for known, folder in self.data:
                if close and known == name:
                    return folder + rest
            return stored
        if not stored or stored.startswith("/") or stored.startswith("~"):
            return os.path.expanduser(stored) if stored.startswith("~") else stored
        return f"{self.study}/{stored}"

    def resolve_cell(self, cell: Any) -> Any:
        """A file cell (one path, or several joined by ``;``) resolved."""
        if cell.__class__ is not str or not cell:
            return cell
        if ";" in cell:
            return ";".join(self.resolve(p.strip()) for p in cell.split(";") if p.strip())
        return self.resolve(cell)

    def outside(self, stored: Iterable[Any]) -> list[str]:
        """The stored paths (cells) that are under no root: absolute paths."""
        return [c for c in stored if c.__class__ is str and c.startswith("/")]


def _folder(root: str, value: str) -> str:
    path = os.path.expanduser(value)
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(root, path))


def declared_roots(loaded: LoadedRecipe) -> PathRoots:
    """The recipe's roots: its folder, and each ``vars`` folder its subjects' paths begin with."""
    study = os.path.normpath(os.path.abspath(loaded.root))
    spec = loaded.recipe.subjects
    uses = [text for _, _, text in spec.templates()] if spec.found else []
    uses += [p for p in (spec.bids, spec.manifest) if p]
    data: list[tuple[str, str]] = []
    for name, value in loaded.recipe.vars.items():
        if not isinstance(value, str) or not value.strip() or "{" in value:
            continue
        head = value.rstrip("/")
        if any(u == head or u.startswith(head + "/") for u in uses):
            folder = _folder(study, head)
            if folder != study and folder != "/":
                data.append((str(name), folder))
    data.sort(key=lambda item: (-len(item[1]), item[0]))
    return PathRoots(study, tuple(data))

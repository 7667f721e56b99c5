"""Find the files a path template names: one walk, level by level, with os.scandir.

Why not glob or a full index: the walk starts at the template's literal
prefix and lists only folders that matched so far, down to the template's
depth, so a 100,000-subject tree costs one ``scandir`` per subject folder and
nothing for the rest of the disk (pybids indexes every file of a dataset
first). Hidden names (``.DS_Store``, ``.git``) are skipped. A symlinked folder
is followed once: a link to one of its own ancestors, or to a folder already
reached at the same level, is not entered again. The result is sorted by path.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

from habitrun.spec.pathtemplate import Segment, Template

Match = tuple[str, dict[str, str]]
"""(the path on disk, field values)."""


@dataclass
class WalkResult:
    """Matches, sorted by path, and what the walk saw (for a message when nothing matched)."""

    template: Template
    start: Path
    matches: list[Match] = field(default_factory=list)
    reached: list[int] = field(default_factory=list)
    """Per level: how many folders (or files, at the last level) matched so far."""
    _levels: list[list[tuple[str, dict[str, str]]]] = field(default_factory=list, repr=False)

    def rel(self, path: str) -> str:
        """A matched path as the template writes it (``data/S1/ct.nii.gz``), for messages."""
        return self.template.base_text() + path[len(str(self.start)) + 1:]

    def nearest(self) -> str:
        """Where the walk stopped and the existing path closest to what it looked for."""
        return _nearest(self)


def start_folder(template: Template, root: Path) -> Path:
    """The folder the walk starts in: the template's literal prefix, against ``root``."""
    base = Path("/" if template.absolute else ".", *template.base)
    base = base.expanduser() if template.base and template.base[0].startswith("~") else base
    return base if base.is_absolute() else (root / base)


def walk(template: Template, root: Path, patterns: Mapping[str, str] | None = None) -> WalkResult:
    """Every file that ``template`` names below ``root`` (a relative template is against it)."""
    patterns = patterns or {}
    start = start_folder(template, root)
    result = WalkResult(template, start)
    top = str(start)
    level: list[tuple[str, dict[str, str]]] = [(top, {})]
    last_index = len(template.segments) - 1
    for index, segment in enumerate(template.segments):
        result._levels.append(level)
        last = index == last_index
        if segment.literal is not None:
            level = _literal(level, segment.literal, last)
        else:
            level = _listed(level, segment, last, patterns)
        result.reached.append(len(level))
        if not level:
            break
    if level and len(result.reached) == len(template.segments):
        level.sort(key=itemgetter(0))
        result.matches = level
    return result


def _literal(level: list[tuple[str, dict[str, str]]], name: str, last: bool) -> list[tuple[str, dict[str, str]]]:
    out = []
    for path, values in level:
        child = f"{path}/{name}"
        if last and not os.path.isfile(child):
            continue  # a folder level is checked when the next level lists it
        out.append((child, values))
    return out


def _listed(level: list[tuple[str, dict[str, str]]], segment: Segment, last: bool,
            patterns: Mapping[str, str]) -> list[tuple[str, dict[str, str]]]:
    out: list[tuple[str, dict[str, str]]] = []
    append = out.append
    links: list[tuple[str, str, dict[str, str]]] = []
    fullmatch = segment.regex.fullmatch  # type: ignore[union-attr]
    hidden_ok = segment.show_hidden
    repeated = segment.repeated
    may_be_empty = segment.may_be_empty
    single = segment.fields[0] if len(segment.fields) == 1 and not repeated else None
    scandir = os.scandir
    for path, values in level:
        try:
            entries = scandir(path)
        except OSError:  # missing (a literal level above did not exist), not a folder, no permission
            continue
        with entries:
            for entry in entries:
                name = entry.name
                if name[0] == "." and not hidden_ok:
                    continue
                m = fullmatch(name)
                if m is None:
                    continue
                if single is not None:  # one new field: no groupdict, one small dict
                    merged = values.copy()
                    merged[single] = m[1]
                else:
                    found = m.groupdict()
                    if repeated and any(found[f] != values[f] for f in repeated):
                        m = segment.bound_regex(values, patterns).fullmatch(name)
                        if m is None:
                            continue
                        found = {**m.groupdict(), **{f: values[f] for f in repeated}}
                    merged = {**values, **found}
                if may_be_empty and "" in merged.values():
                    continue  # a field is never empty
                try:
                    if last:
                        if not entry.is_file():
                            continue
                    elif not entry.is_dir():
                        continue
                    elif entry.is_symlink():
                        links.append((entry.path, path, merged))
                        continue
                except OSError:
                    continue
                append((entry.path, merged))
    if links:
        _follow_once(links, out)
    return out


def _follow_once(links: list[tuple[str, str, dict[str, str]]], out: list[tuple[str, dict[str, str]]]) -> None:
    """Add the symlinked folders that reach a folder not reached yet at this level, and no ancestor."""
    seen: set[tuple[int, int]] = set()
    for path, _ in out:
        try:
            st = os.stat(path)
        except OSError:
            continue
        seen.add((st.st_dev, st.st_ino))
    for path, parent, values in sorted(links):
        try:
            st = os.stat(path)
        except OSError:
            continue
        ident = (st.st_dev, st.st_ino)
        target = os.path.realpath(path)
        home = os.path.realpath(parent)
        if ident in seen or home == target or home.startswith(target.rstrip("/") + "/"):
            continue  # the same folder again, or a loop back up the tree
        seen.add(ident)
        out.append((path, values))


def _closest(names: list[str], wanted: str) -> str | None:
    close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.0)
    return close[0] if close else None


def _nearest(result: WalkResult) -> str:
    template = result.template
    start = result.start
    if not start.is_dir():
        probe = start
        while not probe.is_dir() and probe != probe.parent:
            probe = probe.parent
        missing = start.relative_to(probe) if start.is_relative_to(probe) else start
        close = _closest(_names(str(probe)), str(missing).split("/")[0])
        near = f"; nearest existing path: {probe / close}" if close else f"; the nearest existing folder is {probe}"
        return f"folder {start} does not exist{near}"
    failed = len(result.reached) - 1
    dirs = [path for path, _ in result._levels[failed]][:50]
    existing = [d for d in dirs if os.path.isdir(d)]
    if not existing and failed > 0:  # a folder level without a field was not there: say so at its parent
        failed -= 1
        existing = list(dict.fromkeys(path for path, _ in result._levels[failed][:50]))
    segment = template.segments[failed]
    wanted = template.base_text() + "".join(s.text + "/" for s in template.segments[:failed])
    where = f"{len(result._levels[failed])} folder(s) match {wanted!r}" if failed else f"looked in {start}"
    for folder in existing[:20]:
        close = _closest(_names(folder), segment.text)
        if close:
            return (f"{where}, but no name there matches {segment.text!r}; "
                    f"nearest existing path: {Path(folder) / close}")
    shown = existing[0] if existing else str(start)
    return f"{where}, but no name there matches {segment.text!r} ({shown} is empty)"


def _names(folder: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(folder) if not n.startswith("."))
    except OSError:
        return []

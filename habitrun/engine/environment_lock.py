"""A run's environment lock from its plan: each stage's code and packages, and every input file it read.

The plan already read all of it (stage code and package versions in
:mod:`habitrun.planner.code`, file digests in :mod:`habitrun.planner.subject_files`):
this turns it into the run folder's ``environment.json`` and ``inputs.tsv``
(:mod:`habitrun.store.environment`), and the per-stage ``operator_packages`` of
the run's provenance, without reading any file again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from habitrun.planner.context import KeyContext
from habitrun.planner.subject_files import cell_paths
from habitrun.spec.subjects import subject_ids
from habitrun.store.environment import environment, tsv_line, write_environment


def stage_packages(context: KeyContext) -> dict[str, dict[str, str]]:
    """stage -> {distribution: version} of the packages its code imports (its own, when installed)."""
    return {name: dict(info.code.packages) for name, info in context.stages.items()}


def stage_code(context: KeyContext) -> dict[str, dict[str, Any]]:
    """stage -> its code digest, the study files it is made of (path -> digest), packages and declared inputs."""
    out: dict[str, dict[str, Any]] = {}
    for name, info in context.stages.items():
        out[name] = {
            "code": info.code.fingerprint,
            "files": dict(info.code.modules),
            "packages": dict(info.code.packages),
            "inputs": dict(info.inputs),
            "file_columns": list(info.file_cols),  # the subjects' file columns in its keys
        }
    return out


def input_lines(context: KeyContext, subjects: Sequence[Any]) -> list[str]:
    """``inputs.tsv``'s lines: (subject, column, path as written, digest) of every input file, column by
    column; a stage's declared inputs as subject ``*`` and column ``<stage>.inputs``. A path under the
    study's folder is written relative to it. A digest only the file's size and time stamp gave (every
    stage ``cache: lenient``) is written ``size:...``.

    Read column-wise from the plan's tables, no subject row built: a column whose cells each hold one
    path (the usual case) is a few list passes at C speed, about 0.5 us a file; other cells one by one.
    """
    lines = [tsv_line("*", f"{name}.inputs", written, digest)
             for name, info in context.stages.items() for written, digest in sorted(info.inputs.items())]
    files = context.files
    if files is None:
        return lines
    lenient = not files.content
    texts = files.lenient if lenient else files.content
    root = str(context.loaded.root).rstrip(os.sep) + os.sep
    cut = len(root)
    prefix = "size:" if lenient else ""
    ids = subject_ids(subjects)
    width = len(files.columns)
    joined = [texts.get(sid, "") for sid in ids]
    per_column = [joined] if width == 1 else [
        list(c) for c in zip(*[_padded(t.split("\x1e"), width) for t in joined], strict=True)]
    odd_ids = _odd("\x00".join(ids))
    for col, digests in zip(files.columns, per_column or [[]] * width, strict=True):
        cells = _column(subjects, col)
        if not odd_ids and all(c.__class__ is str for c in cells) and not _odd(";".join(cells)) \
                and ";" not in "".join(cells) and ";" not in "".join(digests):
            shown = [c[cut:] if c.startswith(root) else c for c in (c.strip() for c in cells)]
            lines.extend(f"{sid}\t{col}\t{path}\t{prefix}{digest}"
                         for sid, path, digest in zip(ids, shown, digests, strict=True) if path)
            continue
        for sid, cell, text in zip(ids, cells, digests, strict=True):
            found = text.split(";") if text else []
            for j, written in enumerate(cell_paths(cell)):
                where = written[cut:] if written.startswith(root) else written
                lines.append(tsv_line(sid, col, where, prefix + (found[j] if j < len(found) else "")))
    return lines


def _padded(parts: list[str], width: int) -> list[str]:
    return parts if len(parts) == width else (parts + [""] * width)[:width]


def _odd(text: str) -> bool:
    """Holds a tab or a line break: the TSV line needs :func:`tsv_line`."""
    return "\t" in text or "\n" in text or "\r" in text


def _column(subjects: Sequence[Any], name: str) -> list[Any]:
    """Every subject's value in column ``name`` (a SubjectTable's without building its rows)."""
    column = getattr(subjects, "column", None)
    return column(name) if column is not None else [row.fields.get(name) for row in subjects]


def write_lock(folder: Path, *, git: Mapping[str, Any], context: KeyContext, subjects: Sequence[Any]) -> None:
    """Write the run folder's environment lock (see the module docstring)."""
    write_environment(folder, environment(git=git, stages=stage_code(context)), input_lines(context, subjects))

"""A run's environment lock from its plan: each stage's code and packages, and every input file it read.

The plan already read all of it (stage code and package versions in
:mod:`habitrun.planner.code`, file digests in :mod:`habitrun.planner.subject_files`):
this turns it into the run folder's ``environment.json`` and ``inputs.tsv``
(:mod:`habitrun.store.environment`), and the per-stage ``operator_packages`` of
the run's provenance, without reading any file again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from habitrun.planner.context import KeyContext
from habitrun.planner.subject_files import cell_paths
from habitrun.store.environment import environment, write_environment


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


def input_rows(context: KeyContext, subjects: Sequence[Any]) -> Iterator[tuple[str, str, str, str]]:
    """(subject, column, path as written, digest) of every input file; a stage's declared inputs
    as subject ``*`` and column ``<stage>.inputs``. A path under the study's folder is written
    relative to it. A digest only the file's size and time stamp
    gave (every stage ``cache: lenient``) is written ``size:...``."""
    for name, info in context.stages.items():
        for written, digest in sorted(info.inputs.items()):
            yield "*", f"{name}.inputs", written, digest
    files = context.files
    if files is None:
        return
    lenient = not files.content
    root = str(context.loaded.root).rstrip(os.sep) + os.sep
    for row in subjects:
        texts = files.per_column(row.id, lenient)
        for col, text in zip(files.columns, texts, strict=False):
            paths = cell_paths(row.fields.get(col))
            digests = text.split(";") if text else []
            for i, written in enumerate(paths):
                digest = digests[i] if i < len(digests) else ""
                shown = written[len(root):] if written.startswith(root) else written  # a moved study diffs clean
                yield row.id, col, shown, f"size:{digest}" if lenient else digest


def write_lock(folder: Path, *, git: Mapping[str, Any], context: KeyContext, subjects: Sequence[Any]) -> None:
    """Write the run folder's environment lock (see the module docstring)."""
    write_environment(folder, environment(git=git, stages=stage_code(context)), input_rows(context, subjects))

"""The files a stored result names inside a folder: Paths, or strings holding absolute paths.

A result passes files around as values anywhere in its dicts, lists and tuples. Only those under the
run's work folders are a stage's own outputs (an input path a result passes on is not): publishing
(engine/publish.py) copies them, the report (cli/htmlreport/science.py) reads the tables among them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def files_named(value: Any, folder: Path | str) -> Iterator[Path]:
    """Every existing file under ``folder`` that ``value`` names, in order (a file named twice, twice)."""
    yield from _walk(value, os.path.join(os.path.abspath(folder), ""))


def _walk(value: Any, inside: str) -> Iterator[Path]:
    if isinstance(value, (Path, str)):
        text = os.fspath(value)
        if os.path.isabs(text):
            text = os.path.abspath(text)
            if text.startswith(inside) and os.path.isfile(text):
                yield Path(text)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _walk(item, inside)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _walk(item, inside)

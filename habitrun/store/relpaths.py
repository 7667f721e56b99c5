"""Paths in results are stored relative to the study, so a moved study keeps its results.

Before a result is stored, every string or ``Path`` in it (through lists,
tuples and dicts) that names something under the run folder or the
study folder is replaced by a :class:`StudyPath` (which root, and the rest
of the path). Unpickling one calls :func:`_resolve`, which joins it to the
roots of whoever reads the store now: after ``mv study-a study-b`` a result
names ``study-b/.habitrun/work/...``. An absolute path outside both roots is
kept as it is and reported (the first one per record) so ``plan`` can say
that stored results point outside the study.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath
from typing import Any

_ATOMS = frozenset({int, float, bool, type(None), bytes, complex})
_MAX_PATH = 4096
_roots: dict[str, str] = {}  # the reader's roots: tag -> absolute folder (set by the store that reads)


def set_reader_roots(roots: dict[str, str]) -> None:
    """Where stored relative paths resolve in this process (the store of the study being read)."""
    _roots.clear()
    _roots.update(roots)


def _resolve(tag: str, rel: str, as_path: bool) -> Any:
    base = _roots.get(tag)
    text = os.path.join(base, rel) if base else rel
    return Path(text) if as_path else text


class StudyPath:
    """A path under one of the study's roots, as stored (pickles as a call to :func:`_resolve`)."""

    __slots__ = ("as_path", "rel", "tag")

    def __init__(self, tag: str, rel: str, as_path: bool) -> None:
        self.tag, self.rel, self.as_path = tag, rel, as_path

    def __reduce__(self) -> tuple:
        return (_resolve, (self.tag, self.rel, self.as_path))


class Relativizer:
    """Rewrites results for storing; ``roots`` are (tag, absolute folder) pairs, most specific first."""

    __slots__ = ("_prefixes", "outside")

    def __init__(self, roots: list[tuple[str, str]]) -> None:
        self._prefixes = [(tag, os.path.join(os.path.abspath(folder), "")) for tag, folder in roots]
        self.outside: str | None = None  # the first absolute path outside every root seen by the last call

    def __call__(self, value: Any) -> Any:
        """``value`` with study paths made relative (the same object when nothing changed)."""
        self.outside = None
        if value.__class__ in _ATOMS:
            return value
        return self._walk(value, 0)

    def _text(self, text: str, as_path: bool) -> Any:
        if not text.startswith("/") or len(text) > _MAX_PATH or "\n" in text or text.count("/") < 2:
            return text if not as_path else None
        for tag, prefix in self._prefixes:
            if text.startswith(prefix) or text + "/" == prefix:
                return StudyPath(tag, text[len(prefix):], as_path)
        if self.outside is None:
            self.outside = text
        return None

    def _walk(self, value: Any, depth: int) -> Any:
        cls = value.__class__
        if cls in _ATOMS or depth > 50:
            return value
        if cls is str:
            found = self._text(value, False)
            return value if found is None or found.__class__ is str else found
        if isinstance(value, PurePath):
            found = self._text(str(value), True)
            return value if found is None else found
        if cls is list:
            items = [self._walk(v, depth + 1) for v in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        if cls is tuple:
            items = [self._walk(v, depth + 1) for v in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else tuple(items)
        if cls is dict:
            out = {k: self._walk(v, depth + 1) for k, v in value.items()}
            return value if all(out[k] is v for k, v in value.items()) else out
        return value  # other objects (numpy arrays, dataclasses...) are stored as they are

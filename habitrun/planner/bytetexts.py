"""Subject parts' texts made as bytes from a plain manifest's lines: one ``%`` a row, no encode.

The text a subject part digests (:func:`habitrun.planner.keys.subject_part`) is, for a plain
CSV/TSV whose values need no escape, ``<len(id)>:<id>\\x00c(<columns>)('<v1>', '<v2>', ...)``.
Its UTF-8 bytes are the same text made from the line's UTF-8 cells (a delimiter, an ASCII
byte, never occurs inside another character's bytes). So a chunk of lines is encoded at once,
split into cells, and each row's text made by one bytes ``%``: no per-row join, zip or encode
(with the digests made hex a chunk at a time: 1.1 -> 0.84 s of CPU for a million subjects'
parts, hashing included).

The subjects must be the manifest's lines in order, each id its line's cell as it stands
(:meth:`habitrun.spec.subjects.SubjectTable.plain_lines` says so, and where), and a chunk goes
this way only when every id in it has one length (written into the template). Otherwise
:meth:`ByteTexts.texts` says None and the caller makes that chunk's texts as text.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import itemgetter, methodcaller

CHUNK = 50_000  # subjects a chunk: its cells (a few MB) are made, used and dropped


class ByteTexts:
    """The row texts of a plain manifest's lines, a chunk of subjects at a time."""

    def __init__(self, lines: list[str], delimiter: str, id_cell: int, columns: Sequence[str],
                 order: Sequence[str]) -> None:
        self._lines = lines
        self._split = methodcaller("split", delimiter.encode())
        self._getter = itemgetter(id_cell, *(list(columns).index(c) for c in order))  # the id, then the values
        body = "('%s',)" if len(order) == 1 else "(" + ", ".join(["'%s'"] * len(order)) + ")"
        self._tail = ("\x00c" + repr(tuple(order))).replace("%", "%%").encode() + body.encode()

    def texts(self, start: int, ids: list[str]) -> Iterator[bytes] | None:
        """The UTF-8 texts of the subjects ``ids``, whose lines start at ``start``; None when
        this chunk cannot be made as bytes (see the module docstring). Each row's cells are
        made and dropped in turn: materialised, a chunk's cells would cost a third more."""
        size = len(ids[0]) if ids else 0
        if not ids or min(map(len, ids)) != size or max(map(len, ids)) != size:
            return None
        try:
            rows = "\n".join(self._lines[start:start + len(ids)]).encode().split(b"\n")
        except UnicodeEncodeError:  # a lone surrogate: the text path meets and reports it
            return None
        if len(rows) != len(ids):
            return None
        template = b"%d:%%s" % size + self._tail
        return map(template.__mod__, map(self._getter, map(self._split, rows)))

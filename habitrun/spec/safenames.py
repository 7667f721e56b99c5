"""File-name-safe subject ids: logs and work folders are named after subjects.

A plain id is its own safe name; any other id is encoded so that it cannot
leave its folder, and ids equal but for case are told apart (a case-insensitive
file system would make their folders one).
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from habitrun.spec.subjects import SubjectRow

MAX_SAFE_LEN = 100
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_KEEP = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def safe_name(subject_id: str) -> str:
    """A file-name-safe, unique, deterministic name for ``subject_id``.

    Plain ids (letters, digits, ``_ . -``, not starting with ``.`` or ``-``,
    at most 100 characters) are returned unchanged. Any other id is
    percent-encoded (``%`` never appears in a plain id, so encoded and plain
    names cannot collide); a name still too long keeps a prefix and adds
    ``~`` and a hash of the whole id. The result never contains ``/``, NUL or
    a control character and is never ``.`` or ``..``.
    """
    if _PLAIN.fullmatch(subject_id) and len(subject_id) <= MAX_SAFE_LEN:
        return subject_id
    out = []
    for i, ch in enumerate(subject_id):
        if ch in _KEEP and not (i == 0 and ch in ".-"):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    encoded = "".join(out) or "%"
    if len(encoded) <= MAX_SAFE_LEN:
        return encoded
    digest = hashlib.sha256(subject_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    prefix = encoded[:MAX_SAFE_LEN - 17]
    prefix = prefix[: prefix.rfind("%")] if "%" in prefix[-2:] else prefix  # no cut escape
    return f"{prefix}~{digest}"



_ALL_PLAIN = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_.\-]{0,%s}\n)*".replace("%s", str(MAX_SAFE_LEN - 1)))


def with_safe_names(rows: list[SubjectRow]) -> list[SubjectRow]:
    """Rows whose ``safe`` is :func:`safe_name` of their id.

    Ids are nearly always plain names, their own safe names: one regex over all of
    them (a newline inside an id shows in the count) decides that in a few ms for
    100,000 subjects, instead of a call per subject.
    """
    joined = "".join([row.id + "\n" for row in rows])
    if joined.count("\n") == len(rows) and _ALL_PLAIN.fullmatch(joined):
        return rows
    return [row._replace(safe=safe_name(row.id)) for row in rows]


def apart_without_case(rows: list[SubjectRow]) -> list[SubjectRow]:
    """Ids equal but for case (``S1``, ``s1``) get ``~`` and a hash of the id in their safe names.

    Their folders and logs would otherwise be one on a case-insensitive file system
    (macOS, Windows). Done for the whole manifest before include/exclude, so a
    subject's folder does not depend on which subjects a run selects.
    """
    if len({row.safe.casefold() for row in rows}) == len(rows):
        return rows  # the usual case, decided in one pass
    seen: dict[str, int] = {}
    for row in rows:
        folded = row.safe.casefold()
        seen[folded] = seen.get(folded, 0) + 1
    out = []
    for row in rows:
        if seen[row.safe.casefold()] > 1:
            digest = hashlib.sha256(row.id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
            row = row._replace(safe=f"{row.safe[:MAX_SAFE_LEN - 9]}~{digest}")
        out.append(row)
    return out

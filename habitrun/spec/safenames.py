"""File-name-safe subject ids: logs and work folders are named after subjects.

A plain id is its own safe name; any other id is encoded so that it cannot
leave its folder, and ids equal but for case are told apart (a case-insensitive
file system would make their folders one).
"""

from __future__ import annotations

import hashlib
import re

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


_PLAIN_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-\n"


def all_plain(ids: list[str]) -> bool:
    """Whether every id is plain (see :func:`safe_name`): its own safe name.

    Ids nearly always are: a few C-level passes over all of them decide it (a newline
    inside an id shows in the count) instead of a call per subject.
    """
    if not ids:
        return True
    joined = "\n".join(ids)
    if not joined.isascii() or joined.count("\n") != len(ids) - 1:
        return False
    if min(map(len, ids)) == 0 or max(map(len, ids)) > MAX_SAFE_LEN:
        return False
    starts = "\n" + joined
    if "\n." in starts or "\n-" in starts:
        return False
    return not joined.encode("ascii").translate(None, _PLAIN_BYTES)


def safe_names(ids: list[str]) -> list[str]:
    """:func:`safe_name` of every id: ``ids`` itself when every id is plain (nearly always)."""
    if all_plain(ids):
        return ids
    return [safe_name(sid) for sid in ids]


def apart_without_case(ids: list[str], safe: list[str], *, distinct: bool = False) -> list[str]:
    """The safe names, those of ids equal but for case (``S1``, ``s1``) given ``~`` and a hash of the id.

    Their folders and logs would otherwise be one on a case-insensitive file system
    (macOS, Windows). Done for the whole manifest before include/exclude, so a
    subject's folder does not depend on which subjects a run selects. ``distinct``:
    the safe names are known to differ (the usual case is then decided without a set
    when they are ASCII in one case).
    """
    joined = "\n".join(safe)
    if joined.isascii() and (joined == joined.upper() or joined == joined.lower()):
        if distinct or len(set(safe)) == len(safe):
            return safe  # ASCII in one case: apart without case when apart
    elif len({name.casefold() for name in safe}) == len(safe):
        return safe  # the usual case, decided in one pass
    seen: dict[str, int] = {}
    for name in safe:
        folded = name.casefold()
        seen[folded] = seen.get(folded, 0) + 1
    out = []
    for sid, name in zip(ids, safe, strict=True):
        if seen[name.casefold()] > 1:
            digest = hashlib.sha256(sid.encode("utf-8", "surrogatepass")).hexdigest()[:8]
            name = f"{name[:MAX_SAFE_LEN - 9]}~{digest}"
        out.append(name)
    return out

"""Cache keys: a digest of everything a stage's result for a subject depends on.

A map subject's key is ``<stage part>.<subject part>``:

* the *subject part* (128 bits) digests the subject's id and manifest row;
  it is computed once per plan and is the same in every map stage;
* the *stage part* (64 bits) digests the stage identity (name, kind,
  operator path, params, code fingerprint) and the stage parts of the map
  stages it needs (or the whole key of a collect stage it needs).

Because an upstream map key is ``<its stage part>.<the same subject part>``,
hashing the upstream stage parts into this stage's part covers the upstream
keys exactly: change a param, the code, a row or anything upstream and the
key changes; change nothing and it stays, run after run. Per subject and
stage this costs a string concatenation, so 300,000 keys take a fraction of
a second instead of a hash each.

A collect or train stage's key digests its identity and the keys of every
member it takes (:func:`group_key`).
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from operator import itemgetter
from typing import Any

from habitrun.spec.recipe import StageSpec

SUBJECT_BYTES = 16  # 128-bit subject part: no collision among any number of subjects
STAGE_BYTES = 8  # 64-bit stage part: a stage has a handful of versions, not billions
PART_SEP = "\x1f"  # joins subject parts in bulk, as the store joins keys (store.queries.SEP)
CHUNK = 50_000  # subjects whose texts are made, hashed and dropped at once (a few MB)

_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal data, equal text."""
    return _canonical(value)


def short_digest(text: str, size: int = SUBJECT_BYTES) -> str:
    """A hex blake2b digest of ``text``."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=size).hexdigest()


def stage_definition(stage: StageSpec) -> dict[str, Any]:
    """The parts of a stage that decide what it computes (not its policy or launch options)."""
    if stage.runs_command:  # and a command stage's outputs, env, shell and container (not its engine's options)
        container = stage.container.model_dump(exclude={"engine_options", "run_options"}) if stage.container else None
        return {"name": stage.name, "kind": stage.kind, "command": list(stage.command or ()),
                "params": stage.params, "outputs": stage.outputs, "env": stage.env, "shell": stage.shell,
                "container": container}
    return {
        "name": stage.name,
        "kind": stage.kind,
        "operator": stage.operator,
        "entrypoint": stage.entrypoint,
        "command": list(stage.command) if stage.command is not None else None,
        "params": stage.params,
    }


def stage_identity(stage: StageSpec, fingerprint: str) -> str:
    """Digest of the stage's definition and its code fingerprint."""
    return short_digest(canonical_json(stage_definition(stage)) + "\x00" + fingerprint)


def _part_digest(text: str, blake: Any = hashlib.blake2b, size: int = SUBJECT_BYTES) -> str:
    """The hex digest of a subject part's text (the defaults bind blake2b once: it runs per subject)."""
    try:
        raw = text.encode()
    except UnicodeEncodeError:  # a lone surrogate (a file name's undecodable bytes)
        raw = text.encode("utf-8", "surrogatepass")
    return blake(raw, digest_size=size).hexdigest()


def _subject_part(subject_id: str, row_text: str) -> str:
    return _part_digest(f"{len(subject_id)}:{subject_id}\x00{row_text}")


def _row_head(cols: tuple[str, ...]) -> str:
    """The start of the text of a row with these (sorted) columns; its values' repr follows.

    The one definition of a subject part's text (the key representation): ``<len(id)>:<id>``,
    NUL, ``c`` and the sorted column names, then the row's values in that order as a tuple's
    repr. Row by row (:func:`_row_text`) and in bulk (:func:`_chunk_texts`) it is made from here.
    """
    return "c" + repr(cols)


def _row_text(fields: Mapping[str, Any], memo: list) -> str:
    """Deterministic text of a manifest row: column names, then the values' repr in that order.

    Rows of one manifest share their columns, so ``memo`` keeps the sorted columns and an
    itemgetter for them (one C call per row). Rows with other columns, or keys that are not
    strings, are handled from scratch; the text is the same either way.
    """
    if memo:
        cols, getter, head = memo
        if len(fields) == len(cols):
            try:
                values = getter(fields)
            except KeyError:
                pass
            else:
                return head + (repr(values) if len(cols) != 1 else f"({values!r},)")
    keys = list(fields)
    if not all(isinstance(k, str) for k in keys):
        return "j" + canonical_json({str(k): v for k, v in fields.items()})
    cols = tuple(sorted(keys))
    if not cols:
        return "c()()"
    memo[:] = [cols, itemgetter(*cols), _row_head(cols)]
    return _row_text(fields, memo)


def subject_part(subject_id: str, fields: Mapping[str, Any]) -> str:
    """The subject part of a map key: id and manifest row."""
    return _subject_part(subject_id, _row_text(fields, []))


def _bulk_parts(subjects: Any) -> Mapping[str, str] | None:
    """:func:`subject_parts` of a table that knows its columns (a plain CSV manifest): the text of
    every row made in C-level passes, a chunk of subjects at a time, and hashed. None when the
    table cannot say (or an id cannot be encoded as plain UTF-8: see :func:`_part_digest`)."""
    columns = getattr(subjects, "columns", None)
    cols = columns() if callable(columns) else None
    if not cols or not all(type(c) is str for c in cols):
        return None
    # A copy of a made hasher, fed, digested: a fifth cheaper than a hasher made from keyword
    # arguments per row. A chunk's 16-byte digests are made hex at once, joined as the store
    # joins keys (:meth:`SubjectParts.in_id_order`): by chunk, a third of the time of one
    # ``hex`` of all. A Python loop also lets another thread (the store reading ahead) take
    # Python's lock between rows.
    fresh, hexes = hashlib.blake2b(digest_size=SUBJECT_BYTES).copy, []
    try:
        for chunk in _chunk_texts(subjects, cols):
            digests: list[bytes] = []
            keep = digests.append
            for raw in chunk:
                hasher = fresh()
                hasher.update(raw)
                keep(hasher.digest())
            hexes.append(b"".join(digests).hex(PART_SEP, SUBJECT_BYTES))
    except UnicodeEncodeError:
        return None
    return SubjectParts(subjects.ids, PART_SEP.join(hexes))


def _chunk_texts(subjects: Any, cols: Sequence[str]) -> Iterator[Iterable[bytes]]:
    """Every subject's text (as :func:`subject_part` makes it) in UTF-8, a chunk of subjects at
    a time, from the table's values read by column: one ``%`` of a template per row.

    (Until issue 31 a second builder made the same text as bytes from a plain CSV's lines;
    it saved 0.1 s of CPU per million subjects, a copy of the key representation not worth
    keeping in step.)"""
    order = tuple(sorted(cols))
    template = "%d:%s\x00" + _row_head(order).replace("%", "%%") + "%r"  # % of a zip: a fifth cheaper than str.format
    plain = subjects.plain_values()
    if plain:  # each value's repr is itself in quotes: a row's repr is a join
        template = template[:-2] + ("('%s',)" if len(order) == 1 else "('%s')")
    ids = subjects.ids
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start:start + CHUNK]
        values = subjects.values(order, start, start + len(chunk))
        if plain:
            values = map("', '".join, values)
        yield map(str.encode, map(template.__mod__, zip(map(len, chunk), chunk, values, strict=True)))


class SubjectParts(Mapping[str, str]):
    """subject id -> subject part, kept as the ids and their parts joined by ``PART_SEP``, in
    subject order.

    A plan where everything is done never looks a subject up: it compares all the parts at
    once with the store (:meth:`in_id_order`). So the parts are split into a list, and the
    id -> part dict built, only at the first lookup, not for every plan of a million
    subjects; a run then looks each subject up several times a stage, a dict lookup each."""

    __slots__ = ("_ids", "_joined", "_list", "_by_id")

    def __init__(self, ids: list[str], joined: str) -> None:
        self._ids, self._joined = ids, joined
        self._list: list[str] | None = None
        self._by_id: dict[str, str] | None = None

    @property
    def _parts(self) -> list[str]:
        if self._list is None:
            self._list = self._joined.split(PART_SEP) if self._ids else []
        return self._list

    def _lookup(self) -> dict[str, str]:
        if self._by_id is None:
            self._by_id = dict(zip(self._ids, self._parts, strict=True))
        return self._by_id

    def __getitem__(self, sid: str) -> str:
        by_id = self._by_id
        return (by_id if by_id is not None else self._lookup())[sid]

    def get(self, sid: str, default: Any = None) -> Any:
        return self._lookup().get(sid, default)

    def __contains__(self, sid: object) -> bool:
        return isinstance(sid, str) and sid in self._lookup()

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def values(self) -> Any:
        return list(self._parts)

    def items(self) -> Any:
        return list(zip(self._ids, self._parts, strict=True))

    def in_id_order(self, ids: Sequence[str], sep: str) -> str | None:
        """The parts joined by ``sep`` in the order of their sorted ids, when ``ids`` are the
        ids of these parts (the same list); else None."""
        if ids is not self._ids:
            return None
        if all(map(operator.lt, ids, islice(ids, 1, None))):
            return self._joined if sep == PART_SEP else sep.join(self._parts)
        return sep.join(map(self._parts.__getitem__, sorted(range(len(ids)), key=ids.__getitem__)))


def subject_parts(subjects: Sequence[Any]) -> Mapping[str, str]:
    """subject id -> subject part for every subject (``row.id``, ``row.fields``), once per plan.

    The same text as :func:`subject_part`, with the common case (a row with the manifest's
    columns) inlined: this loop is most of the cost of planning a large study.
    """
    bulk = _bulk_parts(subjects)
    if bulk is not None:
        return bulk
    memo: list = []
    out: dict[str, str] = {}
    digest = _part_digest
    for row in subjects:
        sid, fields = row.id, row.fields
        if memo and len(fields) == len(memo[0]) and len(memo[0]) > 1:
            try:
                text = memo[2] + repr(memo[1](fields))
            except KeyError:
                text = _row_text(fields, memo)
        else:
            text = _row_text(fields, memo)
        out[sid] = digest(f"{len(sid)}:{sid}\x00{text}")
    return out


def stage_part(stage_ident: str, upstream_parts: Sequence[str]) -> str:
    """The stage part of a map stage's keys: its identity and what it needs, per :mod:`keys`."""
    return short_digest("map\x00" + stage_ident + "\x00" + ",".join(upstream_parts), STAGE_BYTES)


def upstream_part(upstream_key: str, subject: str) -> str:
    """What of an upstream key goes into the stage part: a map key's stage part (its subject
    part is this subject's own), or a whole key (a collect stage's)."""
    prefix, dot, rest = upstream_key.partition(".")
    return prefix if dot and rest == subject else upstream_key


def subject_key(stage_ident: str, subject_id: str, fields: Mapping[str, Any], upstream_keys: Sequence[str]) -> str:
    """The key of one subject in a map stage (the planner computes the same in bulk)."""
    subj = subject_part(subject_id, fields)
    return f"{stage_part(stage_ident, [upstream_part(k, subj) for k in upstream_keys])}.{subj}"


def group_key(stage_ident: str, members: Mapping[str, Sequence[str]]) -> str:
    """The key of a collect or train stage: its identity and, per needed stage, its members' keys."""
    h = hashlib.blake2b(b"group\x00" + stage_ident.encode() + b"\x00", digest_size=SUBJECT_BYTES)
    for need in sorted(members):
        h.update(f"{len(need)}:{need}\x00{','.join(members[need])}\x00".encode())
    return h.hexdigest()


def variant_parts(
    subjects: Sequence[Any],
    fields: Sequence[str] | None,
    files: Mapping[str, str] | None,
    file_columns: Sequence[str] = (),
    *,
    resolve: tuple[Sequence[str], Callable[[Any], Any]] | None = None,
) -> Mapping[str, str]:
    """subject id -> subject part over only the manifest columns ``fields`` (None: all) and the
    text of the subject's input files (``files``: id -> text of ``file_columns``, in order;
    None: no file columns).

    ``resolve`` (columns, function): those columns' values are first passed through the
    function (the parts before issue 31, when a found subject's files were absolute paths).

    With neither, this is :func:`subject_parts` (so keys of a study without file columns are
    the ones habitrun always computed).
    """
    if fields is None and files is None:
        return subject_parts(subjects)
    digest = _part_digest
    out: dict[str, str] = {}
    cols = tuple(sorted(fields)) if fields is not None else None
    getter = itemgetter(*cols) if cols else None
    head = "f" + repr(cols) if cols is not None else ""  # a stage's own columns: a head of their own
    tail = "\x00files\x00" + repr(tuple(file_columns)) + "\x00" if files is not None else ""
    memo: list = []
    if cols is None and subjects:
        _row_text(subjects[0].fields, memo)  # the manifest's columns, sorted, and a getter for them
    width = len(memo[0]) if memo else -1
    for row in subjects:
        sid, row_fields = row.id, row.fields
        if resolve is not None:
            row_fields = dict(row_fields)
            for col in resolve[0]:
                if col in row_fields:
                    row_fields[col] = resolve[1](row_fields[col])
        if cols is None:
            text = None
            if len(row_fields) == width and width > 1:
                try:
                    text = memo[2] + repr(memo[1](row_fields))
                except KeyError:
                    pass
            if text is None:
                text = _row_text(row_fields, [])
        elif not cols:
            text = head
        else:
            try:
                values = getter(row_fields)  # type: ignore[misc]
            except KeyError:
                values = tuple(row_fields.get(c) for c in cols) if len(cols) > 1 else row_fields.get(cols[0])
            text = head + (repr(values) if len(cols) > 1 else f"({values!r},)")
        out[sid] = digest(f"{len(sid)}:{sid}\x00{text}{tail}{files[sid]}" if files is not None
                          else f"{len(sid)}:{sid}\x00{text}")
    return out


def combined_parts(own: Mapping[str, str], others: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """Subject parts that also cover other stages' subject parts (an upstream stage that keys its
    subjects on other columns or files): one digest per subject."""
    blake = hashlib.blake2b
    return {
        sid: blake(",".join([part, *(o[sid] for o in others)]).encode(), digest_size=SUBJECT_BYTES).hexdigest()
        for sid, part in own.items()
    }


class KeyMap(Mapping[str, str]):
    """subject -> key of a map stage, ``<stage part>.<subject part>``, built on access.

    A plan of 100,000 subjects x 3 stages would otherwise build 300,000 strings that the
    engine mostly never reads (everything is done)."""

    __slots__ = ("_head", "_parts")

    def __init__(self, prefix: str, parts: Mapping[str, str]) -> None:
        self._head = prefix + "."
        self._parts = parts

    @property
    def parts(self) -> Mapping[str, str]:
        """subject -> its subject part (what the keys share with other stages of one variant)."""
        return self._parts

    def __getitem__(self, sid: str) -> str:
        return self._head + self._parts[sid]

    def get(self, sid: str, default: Any = None) -> Any:
        part = self._parts.get(sid)
        return default if part is None else self._head + part

    def __contains__(self, sid: object) -> bool:
        return sid in self._parts

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def __repr__(self) -> str:
        return f"KeyMap({self._head!r}, {len(self._parts)} subjects)"

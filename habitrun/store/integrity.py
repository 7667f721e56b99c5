"""Checksums of stored results: written with every result, verified whenever one is read.

A result is stored the way diskcache's ``Disk`` serialises it: a *mode*
(raw, binary, text, pickle) and either a value in the record's row or a file
beside the database. Its digest is a 128-bit blake2b of the mode and the
stored bytes (for a raw number, its exact text), so a flipped byte in a row
or a file overwritten with anything else no longer matches. The same digest
says whether a recomputed result differs from the one it replaces (see
``habitrun_changed`` in :mod:`habitrun.store.checkpoint`).
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import sqlite3
from typing import Any

MODE_RAW, MODE_BINARY, MODE_TEXT, MODE_PICKLE = 1, 2, 3, 4  # diskcache's modes
DIGEST_BYTES = 16
SPILL_MTIME_SLACK_SEC = 2.0  # a spilled file modified this long after it was stored is re-hashed by plan

_blake = hashlib.blake2b


class ResultUnreadable(Exception):
    """A stored result does not match its checksum, or its file is gone."""


def _raw_bytes(value: Any) -> bytes:
    cls = value.__class__
    if cls is int:
        return b"1:i%d" % value
    if cls is str:
        return b"1:s" + value.encode("utf-8", "surrogatepass")
    if cls is float:
        return b"1:f" + value.hex().encode()
    if value is None:
        return b"1:n"
    return b"1:b" + bytes(value)  # bytes, or sqlite3.Binary (a memoryview) as diskcache wrote it


def row_digest(mode: int, value: Any) -> bytes:
    """Digest of a result kept in its record's row (``mode``, ``value`` as stored)."""
    if mode == MODE_RAW:
        return _blake(_raw_bytes(value), digest_size=DIGEST_BYTES).digest()
    digest = _blake(b"%d:" % mode, digest_size=DIGEST_BYTES)
    digest.update(value)  # a pickle's bytes, read in place
    return digest.digest()


def data_digest(mode: int, data: bytes) -> bytes:
    """Digest of a result kept in a file (``data``: the file's bytes)."""
    digest = _blake(b"%d:" % mode, digest_size=DIGEST_BYTES)
    digest.update(data)
    return digest.digest()


def read_file(directory: str, filename: str) -> bytes:
    with open(os.path.join(directory, filename), "rb") as fh:
        return fh.read()


def decode_file(mode: int, data: bytes) -> Any:
    """A spilled result's value from its file's bytes, as diskcache's ``Disk.fetch`` reads it."""
    if mode == MODE_BINARY:
        return data
    if mode == MODE_TEXT:
        return data.decode("utf-8")
    if mode == MODE_PICKLE:
        return pickle.load(io.BytesIO(data))
    raise ResultUnreadable(f"unknown storage mode {mode!r}")


def decode_row(mode: int, value: Any) -> Any:
    if mode == MODE_RAW:
        return bytes(value) if value.__class__ is sqlite3.Binary else value
    if mode == MODE_PICKLE:
        return pickle.load(io.BytesIO(value))
    raise ResultUnreadable(f"unknown storage mode {mode!r}")


def spilled_file_suspect(directory: str, filename: str, size: int, stored_at: float) -> str | None:
    """Why a spilled file needs a full check (gone, resized, rewritten after it was stored), or None.

    Planning looks at every stored result; reading every large file each time would cost
    what the results weigh, so a file is re-hashed only when its stat says it changed.
    """
    try:
        st = os.stat(os.path.join(directory, filename))
    except OSError:
        return "its file is missing"
    if st.st_size != size or st.st_mtime > stored_at + SPILL_MTIME_SLACK_SEC:
        return "changed"
    return None

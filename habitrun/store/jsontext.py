"""Compact JSON for the hot path: one reused encoder instead of one built per call.

``json.dumps`` with any option builds a new encoder (and its C scanner) on
every call, which is most of its cost for the small dicts the store and the
event log write once per subject.
"""

from __future__ import annotations

import json
from json import encoder as _encoder
from typing import Any

_PLAIN = json.JSONEncoder(separators=(",", ":"), default=str, ensure_ascii=False)
_C = getattr(_encoder, "c_make_encoder", None)
_C_ENCODE = (
    _C(None, str, _encoder.encode_basestring, None, ":", ",", False, False, True)
    if _C is not None and _encoder.encode_basestring is not _encoder.py_encode_basestring
    else None
)


def compact(obj: Any) -> str:
    """``json.dumps(obj, separators=(",", ":"), default=str, ensure_ascii=False)``, faster."""
    if _C_ENCODE is not None:
        try:
            return "".join(_C_ENCODE(obj, 0))
        except (TypeError, ValueError, RecursionError):  # the plain encoder says it better (a cycle...)
            pass
    return _PLAIN.encode(obj)

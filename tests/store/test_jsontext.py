"""The reused encoder writes exactly what json.dumps would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from habitrun.store.jsontext import compact


@pytest.mark.parametrize("value", [
    {"ts": 1.5, "event": "subject_done", "subject": "é\n\"x", "attempt": 1, "n": None, "ok": True},
    {"path": Path("/a/b"), "nested": {"l": [1, 2.5, {"k": []}]}, 3: "int key"},
    [], "text", 7, float("inf"),
])
def test_compact_matches_json_dumps(value):
    assert compact(value) == json.dumps(value, separators=(",", ":"), default=str, ensure_ascii=False)


def test_a_cycle_is_the_plain_encoders_error():
    cyclic: dict = {}
    cyclic["self"] = cyclic
    with pytest.raises(ValueError, match="Circular"):
        compact(cyclic)

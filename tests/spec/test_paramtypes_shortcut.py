"""The check's shortcut (values that plainly fit, seen without pydantic) never passes what pydantic refuses.

The shortcut only spares the check pydantic's import; pydantic's strict JSON-mode check stays the rule.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from habitrun.spec.paramtypes import plainly_fits

TYPES: list[Any] = [float, int, str, bool, Path, Any, object, Optional[int], int | None, float | str,  # noqa: UP045
                    list[float], list[int], tuple[float, float], tuple[int, ...], tuple[str, int],
                    dict[str, float], dict[str, list[int]], Literal["a", "b"], Literal[1, 2], Literal[True],
                    list[Optional[float]], Optional[list[tuple[int, int]]]]  # noqa: UP045

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5)
    | st.sampled_from(["a", "b", "1", "1.5", "true"]) | st.sampled_from([1, 2, 0, True, False, 1.0]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


def pydantic_passes(tp: Any, value: Any) -> bool:
    try:
        TypeAdapter(tp).validate_json(json.dumps(value), strict=True)
    except ValidationError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(tp=st.sampled_from(TYPES), value=JSON)
def test_what_plainly_fits_pydantic_accepts(tp: Any, value: Any) -> None:
    if plainly_fits(tp, value):
        assert pydantic_passes(tp, value), (tp, value)


def test_the_usual_values_take_the_shortcut() -> None:
    assert plainly_fits(float, 1) and plainly_fits(list[float], [1, 1.5, 2]) and plainly_fits(Path, "a/b")
    assert plainly_fits(tuple[float, float], [1, 2]) and plainly_fits(Literal["fast", "slow"], "slow")
    assert plainly_fits(Optional[int], None)  # noqa: UP045
    assert not plainly_fits(float, "abc") and not plainly_fits(int, True) and not plainly_fits(Literal[1], True)

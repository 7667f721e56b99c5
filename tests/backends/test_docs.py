"""docs/backends.md shows the behaviour table the suite really runs."""

from __future__ import annotations

from pathlib import Path

from tests.backends.variants import behaviour_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "backends.md"


def test_the_documented_behaviour_table_is_the_suites():
    expected = behaviour_table()
    assert expected in DOC.read_text(), f"update the table in {DOC} to:\n{expected}"

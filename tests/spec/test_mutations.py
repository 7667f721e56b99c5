"""Property: whatever a recipe file or override holds, loading raises only RecipeError."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from habitrun.errors import RecipeError
from habitrun.spec.loader import load_recipe
from habitrun.spec.subjects import load_subjects
from tests.spec.conftest import BASE, make_study

LINES = BASE.splitlines(keepends=True)
PROBLEM = re.compile(r"^(override '.*': |.+?:\d+:\d+: |.+?: )\S")

TOKENS = st.sampled_from([
    "", " ", "\t", ":", ": ", "-", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "!!python/object:os.system ",
    "!tag ", "<<: ", "'", '"', "#", "---", "...", "${", "}", "${vars.bins}", "${env:NOPE}", "${vars.", "null",
    "~", "true", "0", "-1", "1e400", ".nan", "0x1F", "2024-01-01", "workers", "stages", "needs", "kind: train",
    "\x00", "\x85", "\u2028", "é", "\\", "%", "|", ">", "?", "@", "`",
])


@st.composite
def mutated(draw: st.DrawFn) -> str:
    lines = list(LINES)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["delete", "replace", "insert", "splice", "indent", "duplicate"]))
        if how == "delete":
            del lines[i]
        elif how == "replace":
            lines[i] = draw(st.text("abc: -[]{}\n", max_size=20)) + "\n"
        elif how == "insert":
            lines.insert(i, "".join(draw(st.lists(TOKENS, max_size=5))) + "\n")
        elif how == "splice":
            line = lines[i]
            at = draw(st.integers(0, len(line)))
            lines[i] = line[:at] + draw(TOKENS) + line[at:]
        elif how == "indent":
            lines[i] = draw(st.sampled_from(["", " ", "  ", "    ", "\t"])) + lines[i].lstrip(" ")
        else:
            lines.insert(i, lines[i])
        if not lines:
            break
    return "".join(lines)


OVERRIDES = st.lists(
    st.builds(
        lambda k, v: f"{k}={v}",
        st.sampled_from(["policy.workers", "stages.feat.params.bins", "stages.0.kind", "vars.bins", "name",
                         "subjects.exclude", "stages.nope.x", "policy", "stages", "..", "a..b", "habitrun"]),
        st.one_of(TOKENS, st.text(max_size=8)),
    ),
    max_size=3,
)


def _check(text: str, overrides: list[str]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="habitrun-mut-"))
    try:
        path = make_study(folder, "")
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            loaded = load_recipe(path, overrides)
            resolved = folder / "resolved.yaml"
            resolved.write_text(loaded.resolved_yaml(), encoding="utf-8")
            assert load_recipe(resolved, root=loaded.root).recipe == loaded.recipe
            load_subjects(loaded)
        except RecipeError as exc:
            assert exc.problems
            for problem in exc.problems:
                assert PROBLEM.match(problem), problem
                assert "Traceback" not in problem
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(), OVERRIDES)
def test_mutated_recipes_raise_only_recipe_error(text: str, overrides: list[str]):
    _check(text, overrides)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_recipe_error(text: str):
    _check(text, [])

"""Fuzz: `habitrun validate` on mutated recipes and manifests full of rich markup, in-process.

Whatever the recipe, manifest or overrides hold, validate exits 0 or 2 with
a message, never a traceback or a ``MarkupError``, and quickly.
"""

from __future__ import annotations

import contextlib
import io
import random
import re
import time
import traceback
from pathlib import Path

import pytest

from habitrun.cli.app import main
from tests.spec.conftest import BASE, make_study

MARKUP = ["[/x]", "[bold red]x", "[link=file:///etc]x", "[/]", "[", "]", "[[", "\\", "x\\", "[columns]",
          "[Index(['a'])]", "[red]", "[/red]", "[@click=quit]", "[#ff0000]", ":smile:", "\\[b]"]
TOKENS = [*MARKUP, "", " ", ":", ": ", "- ", "{", "}", ",", "'", '"', "#", "${vars.bins}", "${", "null", "~",
          "true", "-1", "é", "\t", "stages", "needs", "kind: collect"]
SCALAR = re.compile(r"(:\s+|-\s+|\[)([A-Za-z0-9_.:${}]+)")
CASES = 300
SEED = 20261203


def _markup(rng: random.Random) -> str:
    return "".join(rng.choice(MARKUP) for _ in range(rng.randint(1, 3)))


def _mutate_line(rng: random.Random, lines: list[str]) -> None:
    i = rng.randrange(len(lines))
    how = rng.choice(["scalar", "scalar", "scalar", "splice", "insert", "delete", "duplicate", "indent"])
    line = lines[i]
    if how == "scalar":  # a value (name, operator, need, param...) becomes or gains markup
        found = list(SCALAR.finditer(line))
        if found:
            m = rng.choice(found)
            new = rng.choice([_markup(rng), m.group(2) + _markup(rng), _markup(rng) + m.group(2)])
            if rng.random() < 0.7:
                new = repr(new) if "'" not in new else '"' + new.replace("\\", "\\\\").replace('"', '\\"') + '"'
            lines[i] = line[: m.start(2)] + new + line[m.end(2):]
    elif how == "splice":
        at = rng.randint(0, len(line))
        lines[i] = line[:at] + rng.choice(TOKENS) + line[at:]
    elif how == "insert":
        lines.insert(i, "".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 4))) + "\n")
    elif how == "delete" and len(lines) > 1:
        del lines[i]
    elif how == "duplicate":
        lines.insert(i, line)
    elif how == "indent":
        lines[i] = rng.choice(["", " ", "   ", "\t"]) + line.lstrip(" ")


def _manifest(rng: random.Random) -> str:
    ids = ["S1", "S2", "S3"]
    for _ in range(rng.randint(0, 3)):
        ids[rng.randrange(len(ids))] = rng.choice([_markup(rng), "S" + _markup(rng), rng.choice(ids)])
    return "subject_id,age\n" + "".join(f'"{sid.replace(chr(34), "")}",40\n' for sid in ids)


def _case(rng: random.Random) -> tuple[str, str | None, list[str]]:
    lines = BASE.splitlines(keepends=True)
    for _ in range(rng.randint(1, 3)):
        _mutate_line(rng, lines)
    manifest = _manifest(rng) if rng.random() < 0.4 else None
    overrides = []
    if rng.random() < 0.3:
        key = rng.choice(["name", "vars.bins", "stages.feat.params.bins", "policy.workers", "stages.prep.operator",
                          "subjects.manifest", "stages." + _markup(rng) + ".x"])
        overrides.append(f"{key}={_markup(rng)}")
    return "".join(lines), manifest, overrides


def validate(recipe: Path, overrides: list[str]) -> tuple[int, str]:
    """Run `habitrun validate` in this process; (exit code, stdout + stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["validate", str(recipe), *overrides])
        except SystemExit as exc:
            code = exc.code
        except BaseException:  # noqa: BLE001 - the failure the test reports, traceback included
            return -1, out.getvalue() + err.getvalue() + traceback.format_exc()
    return (code if isinstance(code, int) else 1), out.getvalue() + err.getvalue()


@pytest.mark.slow  # a stress test (a few hundred random recipes); the literal-markup test below runs the same path
@pytest.mark.timeout(60)
def test_validate_on_markup_mutations_exits_0_or_2_without_traceback(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    recipe = make_study(tmp_path)
    manifest = tmp_path / "subjects.csv"
    original = manifest.read_text()
    codes = {0: 0, 2: 0}
    started = time.monotonic()
    for n in range(CASES):
        text, rows, overrides = _case(rng)
        recipe.write_text(text, encoding="utf-8")
        manifest.write_text(rows or original, encoding="utf-8")
        t0 = time.monotonic()
        code, output = validate(recipe, overrides)
        case = f"case {n}: overrides {overrides}\n{text}\n{rows}\n--- output ---\n{output}"
        assert time.monotonic() - t0 < 5, case
        assert code in codes, case
        assert "Traceback" not in output and "MarkupError" not in output, case
        assert output.strip(), case
        codes[code] += 1
    assert codes[0] and codes[2], codes  # both valid and invalid cases were reached
    assert time.monotonic() - started < 30


@pytest.mark.timeout(30)
def test_validate_prints_markup_literally(tmp_path: Path) -> None:
    recipe = make_study(tmp_path, BASE.replace("\nname: t\n", "\nname: '[bold red]x [/x] [link=file:///etc]y'\n"))
    code, output = validate(recipe, [])
    assert code == 0 and "[bold red]x [/x] [link=file:///etc]y" in output, output
    (tmp_path / "subjects.csv").write_text("subject_id,age\n[/x],1\nS2,2\n[/x],3\n")
    code, output = validate(recipe, [])
    assert code == 2 and "duplicate subject id '[/x]'" in output, output

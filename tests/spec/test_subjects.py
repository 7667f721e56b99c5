"""Manifests of every format, filters, errors, and subject ids that are safe as file names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from habitrun.errors import RecipeError
from habitrun.spec.loader import load_recipe
from habitrun.spec.safenames import safe_name
from habitrun.spec.subjects import SubjectRow, load_subjects
from tests.spec.conftest import BASE, make_study, run_cli

ROWS = [{"subject_id": "S1", "age": 40}, {"subject_id": "S2", "age": 50}, {"subject_id": "S3", "age": 60}]


def _write(folder: Path, name: str) -> None:
    path = folder / name
    if name.endswith(".csv"):
        path.write_text("subject_id,age\n" + "".join(f"{r['subject_id']},{r['age']}\n" for r in ROWS))
    elif name.endswith(".tsv"):
        path.write_text("subject_id\tage\n" + "".join(f"{r['subject_id']}\t{r['age']}\n" for r in ROWS))
    elif name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif name.endswith(".json"):
        path.write_text(json.dumps(ROWS, indent=2))
    else:
        path.write_text("".join(f"- subject_id: {r['subject_id']}\n  age: {r['age']}\n" for r in ROWS))


def _load(folder: Path, recipe: str = BASE, overrides: tuple[str, ...] = ()) -> list[SubjectRow]:
    return load_subjects(load_recipe(make_study(folder, recipe), overrides))


@pytest.mark.parametrize("name", ["m.csv", "m.tsv", "m.json", "m.jsonl", "m.yaml", "m.yml"])
def test_every_format_gives_the_same_subjects(tmp_path: Path, name: str):
    folder = tmp_path / "s"
    make_study(folder)
    _write(folder, name)
    rows = _load(folder, BASE.replace("subjects.csv", name))
    assert [r.id for r in rows] == ["S1", "S2", "S3"]
    assert str(rows[1].fields["age"]) == "50"
    assert all(r.safe == r.id for r in rows)


def test_include_and_exclude(tmp_path: Path):
    assert [r.id for r in _load(tmp_path / "a", overrides=("subjects.exclude=[S2]",))] == ["S1", "S3"]
    assert [r.id for r in _load(tmp_path / "b", overrides=("subjects.include=[S3, S1]",))] == ["S1", "S3"]
    with pytest.raises(RecipeError, match="leave no subjects"):
        _load(tmp_path / "c", overrides=("subjects.include=[S1]", "subjects.exclude=[S1]"))


def test_integer_ids_from_json_become_text(tmp_path: Path):
    folder = tmp_path / "s"
    make_study(folder)
    (folder / "m.json").write_text(json.dumps([{"subject_id": 7}, {"subject_id": 8}]))
    assert [r.id for r in _load(folder, BASE.replace("subjects.csv", "m.json"))] == ["7", "8"]


@pytest.mark.parametrize(
    "name, text, fragment",
    [
        ("m.csv", "subject_id,age\nS1,4\nS2\n", "m.csv:3:1: row has 1 fields, the header has 2"),
        ("m.csv", "subject_id,subject_id\nS1,S1\n", "appears twice"),
        ("m.csv", "subject_id,age\n,4\n", "m.csv:2:1: subject_id: a subject needs a non-empty"),
        ("m.json", "[{\"subject_id\": \"S1\"},\n {\"subject_id\": \"S1\"}]", "m.json:2:1: subject_id: duplicate subject id 'S1' (first on line 1)"),
        ("m.json", "{\"subject_id\": 1}", "expected a list of objects"),
        ("m.json", "[1, 2", "m.json:1:6: not valid JSON"),
        ("m.json", "[{\"subject_id\": true}]", "non-empty text or integer id, got True"),
        ("m.jsonl", "{\"subject_id\": \"S1\"}\n\n{oops}\n", "m.jsonl:3:2: not valid JSON"),
        ("m.jsonl", "{\"age\": 1}\n", "m.jsonl:1:1: subject_id: a subject needs a non-empty text or integer id, got missing"),
        ("m.yaml", "- subject_id: S1\n- subject_id: S1\n", "m.yaml:2:1: subject_id: duplicate subject id 'S1'"),
        ("m.yaml", "- [S1]\n", "expected an object"),
        ("m.yaml", "", "no subjects"),
        ("m.xlsx", "x", "unknown manifest format '.xlsx'"),
        ("m.csv", b"subject_id\n\xff\xfe\n", "not UTF-8"),
    ],
)
def test_manifest_errors(tmp_path: Path, name: str, text: str | bytes, fragment: str):
    folder = tmp_path / "s"
    make_study(folder)
    (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(RecipeError) as info:
        _load(folder, BASE.replace("subjects.csv", name))
    assert any(fragment in p for p in info.value.problems), info.value.problems


def test_manifest_path_is_relative_to_the_recipe_not_the_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    folder = tmp_path / "s"
    make_study(folder)
    monkeypatch.chdir(tmp_path)
    assert len(_load(folder)) == 3


# -- ids as file names ----------------------------------------------------------

HOSTILE = ["../../etc/passwd", "..", ".", "a/b", "a\\b", "a\x00b", "\n", ".hidden", "-rf", "x" * 300,
           "é" * 200, "%41", "A%", "~", "con", " space ", "a:b", "\x7f"]


@pytest.mark.parametrize("subject_id", HOSTILE)
def test_hostile_ids_stay_inside_their_folder(tmp_path: Path, subject_id: str):
    name = safe_name(subject_id)
    assert name not in ("", ".", "..")
    assert "/" not in name and "\x00" not in name and not any(ord(c) < 32 or ord(c) == 127 for c in name)
    assert not name.startswith((".", "-"))
    assert len(name.encode()) <= 255
    target = tmp_path / name
    target.mkdir()
    assert target.resolve().parent == tmp_path.resolve()


@pytest.mark.parametrize("subject_id", ["P001", "LUNG-01", "sub_1.nii", "0042"])
def test_plain_ids_are_unchanged(subject_id: str):
    assert safe_name(subject_id) == subject_id


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=1, max_size=150), st.text(min_size=1, max_size=150))
def test_safe_names_are_deterministic_and_unique(a: str, b: str):
    assert safe_name(a) == safe_name(a)
    if a != b:
        assert safe_name(a) != safe_name(b)
    name = safe_name(a)
    assert set(name) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-%~")
    assert name not in (".", "..") and len(name) <= 100


def test_hostile_ids_load_from_a_manifest(tmp_path: Path):
    folder = tmp_path / "s"
    make_study(folder)
    (folder / "m.jsonl").write_text("".join(json.dumps({"subject_id": i}) + "\n" for i in ["../x", "a/b", "ok"]))
    rows = _load(folder, BASE.replace("subjects.csv", "m.jsonl"))
    assert [r.safe for r in rows] == ["%2E.%2Fx", "a%2Fb", "ok"]


def test_ids_equal_but_for_case_get_names_apart_on_a_case_insensitive_file_system(tmp_path: Path):
    folder = tmp_path / "s"
    make_study(folder)
    (folder / "m.csv").write_text("subject_id\nS1\ns1\nS2\nAb\naB\n")
    recipe = BASE.replace("subjects.csv", "m.csv")
    rows = _load(folder, recipe)
    safe = {r.id: r.safe for r in rows}
    assert safe["S2"] == "S2"  # only the ids that would share a folder change
    assert len({name.casefold() for name in safe.values()}) == 5
    assert safe["S1"].startswith("S1~") and safe["s1"].startswith("s1~")
    # the same names whatever a run selects, and on every load
    picked = _load(folder, recipe, overrides=("subjects.include=[S1]",))
    assert [(r.id, r.safe) for r in picked] == [("S1", safe["S1"])]
    assert {r.id: r.safe for r in _load(folder, recipe)} == safe


def test_one_unusual_id_among_plain_ones_still_gets_its_encoded_name(tmp_path: Path):
    folder = tmp_path / "s"
    make_study(folder)
    ids = ["P1", "a\nb", "P2", "x" * 101, "../up"]
    (folder / "m.json").write_text(json.dumps([{"subject_id": i} for i in ids]))
    rows = _load(folder, BASE.replace("subjects.csv", "m.json"))
    assert [(r.id, r.safe) for r in rows] == [(i, safe_name(i)) for i in ids]
    assert rows[0].safe == "P1" and rows[1].safe == "a%0Ab"


def test_the_cycle_collector_is_back_on_after_loading_even_after_an_error(tmp_path: Path):
    import gc

    assert gc.isenabled()
    assert len(_load(tmp_path / "a")) == 3
    assert gc.isenabled()
    with pytest.raises(RecipeError):
        _load(tmp_path / "b", overrides=("subjects.include=[S1]", "subjects.exclude=[S1]"))
    assert gc.isenabled()
    gc.disable()
    try:
        _load(tmp_path / "c")
        assert not gc.isenabled()  # a caller that had paused it keeps it paused
    finally:
        gc.enable()


@pytest.mark.parametrize(("filters", "expected"), [
    ("  include: [1, 002]\n", ["1", "002"]),
    ("  exclude: [002]\n", ["1", "003"]),
    ("  include: ['1', 003]\n", ["1", "003"]),
])
def test_numbers_in_include_and_exclude_match_as_written(tmp_path: Path, filters: str, expected: list[str]):
    recipe = BASE.replace("manifest: subjects.csv\n  id: subject_id\n", "manifest: padded.csv\n  id: subject_id\n" + filters)
    path = make_study(tmp_path / "s", recipe)
    assert [row.id for row in load_subjects(load_recipe(path))] == expected
    result = run_cli("validate", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    resolved = load_recipe(path).resolved_yaml()  # written as text, so it reads back the same
    (tmp_path / "s" / "resolved.yaml").write_text(resolved)
    assert [row.id for row in load_subjects(load_recipe(tmp_path / "s" / "resolved.yaml"))] == expected


def test_a_number_not_as_written_in_the_manifest_gets_a_hint_to_quote_it(tmp_path: Path):
    recipe = BASE.replace("manifest: subjects.csv\n", "manifest: padded.csv\n  include: [1, 2]\n")
    path = make_study(tmp_path / "s", recipe)
    result = run_cli("validate", str(path), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "recipe.yaml:6:16: subjects.include[1]:" in result.stderr
    assert "subject '2' is not in the manifest (did you mean '002'? write include: ['002'] — ids are text)" in result.stderr

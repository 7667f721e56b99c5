"""Subjects found from files on disk: templates, pivot, required, regexes, merging, joins, errors."""

from __future__ import annotations

import csv
import json
import os
import textwrap
from pathlib import Path

import pytest

from habitrun.errors import RecipeError
from habitrun.spec.loader import load_recipe
from habitrun.spec.pathtemplate import parse_template
from habitrun.spec.subjects import SubjectTable, load_subjects
from habitrun.spec.walk import walk
from tests.spec.conftest import run_cli

OPS = "def a(subject):\n    return {'ct': subject.fields.get('ct')}\n"


def tree(root: Path, *files: str) -> None:
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)


def study(root: Path, subjects: str, *files: str, extra: dict[str, str] | None = None) -> Path:
    """A recipe whose ``subjects:`` block is ``subjects`` (YAML, indented by the caller's dedent)."""
    tree(root, *files)
    for name, text in (extra or {}).items():
        (root / name).write_text(text)
    (root / "ops.py").write_text(OPS)
    recipe = root / "recipe.yaml"
    body = textwrap.indent(textwrap.dedent(subjects).strip(), "  ")
    recipe.write_text(
        "habitrun: 1\nname: t\nsubjects:\n" + body + "\n"
        "policy: {backend: serial, subject_timeout_sec: null}\n"
        "stages:\n  - name: a\n    operator: ops:a\n"
    )
    return recipe


def load(recipe: Path, overrides: tuple[str, ...] = ()) -> SubjectTable:
    return load_subjects(load_recipe(recipe, overrides))


LUNG = ("data/LUNG001/ct.nii.gz", "data/LUNG001/mask.nii.gz", "data/LUNG002/ct.nii.gz",
        "data/LUNG002/mask.nii.gz", "data/LUNG003/ct.nii.gz")
PIVOT = """
from: "data/{subject}/{modality}.nii.gz"
pivot: modality
"""


def test_pivot_gives_one_row_per_subject_and_a_file_column_per_value(tmp_path: Path):
    rows = load(study(tmp_path, PIVOT, *LUNG))
    assert [r.id for r in rows] == ["LUNG001", "LUNG002", "LUNG003"]
    assert rows[0].fields == {"subject": "LUNG001", "ct": "data/LUNG001/ct.nii.gz",
                              "mask": "data/LUNG001/mask.nii.gz"}
    assert rows.file_columns == ("ct", "mask")
    assert rows.discovery.files == 5 and rows.discovery.found == 3


def test_optional_columns_are_empty_and_the_subject_still_runs(tmp_path: Path):
    rows = load(study(tmp_path, PIVOT, *LUNG))
    assert rows[2].fields["mask"] == "" and rows.discovery.incomplete == []
    assert rows.file_needs() == {"ct": False, "mask": False}


def test_a_subject_missing_a_required_column_is_reported_not_run(tmp_path: Path):
    recipe = study(tmp_path, PIVOT + "required: [ct, mask]\n", *LUNG)
    rows = load(recipe)
    assert [r.id for r in rows] == ["LUNG001", "LUNG002"]
    assert rows.discovery.incomplete == [("LUNG003", ("mask",))]
    assert rows.file_needs() == {"ct": True, "mask": True}
    out = run_cli("validate", str(recipe))
    assert out.returncode == 0, out.stderr
    assert "2 of 3 found by data/{subject}/{modality}.nii.gz" in out.stdout
    assert "1 incomplete, not run: LUNG003 (missing mask)" in out.stdout
    plan = run_cli("plan", str(recipe))
    assert plan.returncode == 0 and "1 incomplete, not run: LUNG003 (missing mask)" in plan.stdout
    as_json = json.loads(run_cli("plan", str(recipe), "--json").stdout)
    assert as_json["found"]["incomplete"] == {"LUNG003": ["mask"]} and as_json["found"]["subjects"] == 3


def test_an_unknown_required_pivot_value_is_an_error_at_its_line(tmp_path: Path):
    recipe = study(tmp_path, PIVOT + "required: [ct, maks]\n", *LUNG)
    with pytest.raises(RecipeError) as err:
        load(recipe)
    assert "recipe.yaml:6:18: subjects.required[1]: 'maks' is not a column found on disk (did you mean 'mask'?" in str(err.value)


def test_field_regexes_constrain_what_matches(tmp_path: Path):
    recipe = study(tmp_path, PIVOT + 'fields: {subject: "LUNG[0-9]+", modality: "ct|mask"}\n',
                   *LUNG, "data/notes/ct.nii.gz", "data/LUNGX/ct.nii.gz", "data/LUNG001/pet.nii.gz")
    rows = load(recipe)
    assert [r.id for r in rows] == ["LUNG001", "LUNG002", "LUNG003"]
    assert rows.file_columns == ("ct", "mask")


def test_a_field_never_crosses_a_folder(tmp_path: Path):
    recipe = study(tmp_path, 'from: "data/{subject}/ct.nii.gz"\nfields: {subject: ".+"}\n',
                   "data/a/b/ct.nii.gz", "data/c/ct.nii.gz")
    rows = load(recipe)
    assert [r.id for r in rows] == ["c"]
    assert rows[0].fields == {"subject": "c", "path": "data/c/ct.nii.gz"}


def test_named_templates_are_merged_per_subject(tmp_path: Path):
    recipe = study(tmp_path, """
        from: {ct: "images/{subject}.nii.gz", mask: "labels/{subject}_seg.nii.gz"}
        required: [ct]
        """, "images/P1.nii.gz", "images/P2.nii.gz", "labels/P1_seg.nii.gz", "labels/P3_seg.nii.gz")
    rows = load(recipe)
    assert [(r.id, bool(r.fields["ct"]), bool(r.fields["mask"])) for r in rows] == [("P1", True, True), ("P2", True, False)]
    assert rows.discovery.incomplete == [("P3", ("ct",))]
    assert rows.file_columns == ("ct", "mask")


def test_a_list_of_templates_is_merged_per_subject(tmp_path: Path):
    recipe = study(tmp_path, """
        from: ["ct/{subject}/{modality}.nii.gz", "seg/{subject}/{modality}.nii.gz"]
        pivot: modality
        required: [ct, lesion]
        """, "ct/S1/ct.nii.gz", "seg/S1/lesion.nii.gz", "ct/S2/ct.nii.gz")
    rows = load(recipe)
    assert [r.id for r in rows] == ["S1"]
    assert rows[0].fields["lesion"] == "seg/S1/lesion.nii.gz"
    assert rows.discovery.incomplete == [("S2", ("lesion",))]


def test_a_clinical_manifest_is_joined_on_the_id(tmp_path: Path):
    recipe = study(tmp_path, PIVOT + "manifest: clinical.csv\n", *LUNG,
                   extra={"clinical.csv": "subject,age,label\nLUNG001,61,1\nLUNG002,70,0\nLUNG999,50,1\n"})
    rows = load(recipe)
    assert rows[0].fields == {"subject": "LUNG001", "ct": "data/LUNG001/ct.nii.gz",
                              "mask": "data/LUNG001/mask.nii.gz", "age": "61", "label": "1"}
    assert rows[2].fields["age"] == ""  # on disk, not in the manifest
    assert rows.discovery.without_manifest_row == ["LUNG003"]
    assert rows.discovery.manifest_rows_without_files == 1
    assert rows.file_columns == ("ct", "mask")  # manifest columns are not file columns


def test_a_manifest_without_the_id_column_is_an_error(tmp_path: Path):
    recipe = study(tmp_path, PIVOT + "manifest: clinical.csv\n", *LUNG,
                   extra={"clinical.csv": "patient,age\nLUNG001,61\n"})
    with pytest.raises(RecipeError, match=r"recipe.yaml:6:13: subjects.manifest: manifest clinical.csv has no column 'subject'"):
        load(recipe)


def test_include_and_exclude_apply_to_found_subjects(tmp_path: Path):
    recipe = study(tmp_path, PIVOT, *LUNG)
    assert [r.id for r in load(recipe, ("subjects.exclude=[LUNG002]",))] == ["LUNG001", "LUNG003"]
    assert [r.id for r in load(recipe, ("subjects.include=[LUNG003]",))] == ["LUNG003"]
    with pytest.raises(RecipeError, match="subject 'LUNG004' is not found on disk"):
        load(recipe, ("subjects.include=[LUNG004]",))


def test_without_pivot_every_match_is_a_subject_and_duplicates_are_listed(tmp_path: Path):
    recipe = study(tmp_path, 'from: "data/{subject}/{kind}.nii.gz"\n', *LUNG)
    with pytest.raises(RecipeError) as err:
        load(recipe)
    text = str(err.value)
    assert "recipe.yaml:4:9: subjects.from: duplicate subject id 'LUNG001': data/LUNG001/ct.nii.gz, data/LUNG001/mask.nii.gz" in text
    assert "'LUNG002'" in text and "'LUNG003'" not in text
    out = run_cli("validate", str(recipe))
    assert out.returncode == 2 and "Traceback" not in out.stderr and "duplicate subject id" in out.stderr


def test_no_match_says_where_it_looked_and_the_nearest_path(tmp_path: Path):
    recipe = study(tmp_path, 'from: "data/{subject}/{modality}.nii.gz"\npivot: modality\n',
                   "data/LUNG001/ct.nii", "data/LUNG002/ct.nii")
    out = run_cli("validate", str(recipe))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "recipe.yaml:4:9: subjects.from: no file matches 'data/{subject}/{modality}.nii.gz'" in out.stderr
    assert "2 folder(s) match 'data/{subject}/', but no name there matches '{modality}.nii.gz'" in out.stderr
    assert f"nearest existing path: {tmp_path / 'data/LUNG001/ct.nii'}" in out.stderr


def test_no_match_at_a_folder_without_a_field_names_its_parent(tmp_path: Path):
    recipe = study(tmp_path, 'from: "data/{subject}/anat/{m}.nii.gz"\npivot: m\n', "data/S1/ct.nii.gz")
    with pytest.raises(RecipeError) as err:
        load(recipe)
    assert ("1 folder(s) match 'data/{subject}/', but no name there matches 'anat'; "
            f"nearest existing path: {tmp_path / 'data/S1/ct.nii.gz'}") in str(err.value)


def test_no_match_when_the_literal_prefix_is_missing(tmp_path: Path):
    recipe = study(tmp_path, 'from: "dta/{subject}/ct.nii.gz"\n', "data/S1/ct.nii.gz")
    with pytest.raises(RecipeError) as err:
        load(recipe)
    assert f"folder {tmp_path / 'dta'} does not exist; nearest existing path: {tmp_path / 'data'}" in str(err.value)


def test_hidden_files_and_folders_are_ignored(tmp_path: Path):
    recipe = study(tmp_path, PIVOT, "data/S1/ct.nii.gz", "data/S1/.ct.nii.gz", "data/S1/._mask.nii.gz",
                   "data/.git/ct.nii.gz", "data/.S2/ct.nii.gz")
    rows = load(recipe)
    assert [r.id for r in rows] == ["S1"] and rows.file_columns == ("ct",)


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symlinks on this platform")
def test_symlinked_folders_are_followed_once(tmp_path: Path):
    tree(tmp_path, "data/S1/v1/ct.nii.gz", "data/S1/ct.nii.gz", "elsewhere/S9/v1/ct.nii.gz")
    (tmp_path / "data/S9").symlink_to(tmp_path / "elsewhere/S9")  # a subject stored elsewhere: followed
    (tmp_path / "data/S1copy").symlink_to(tmp_path / "data/S1")  # the same folder again: not
    (tmp_path / "data/S1/back").symlink_to(tmp_path / "data/S1")  # a loop to its own parent: not
    (tmp_path / "data/S1/v1/loop").symlink_to(tmp_path / "data")  # a loop further up: not
    result = walk(parse_template("data/{subject}/{visit}/ct.nii.gz"), tmp_path)
    found = [(v["subject"], v["visit"]) for _, v in result.matches]
    assert found == [("S1", "v1"), ("S9", "v1")]
    deep = walk(parse_template("data/{a}/{b}/{c}/{d}/ct.nii.gz"), tmp_path)
    assert deep.matches == []  # the loops are never entered, so nothing is found through them


def test_discovery_is_sorted_and_deterministic(tmp_path: Path):
    files = [f"data/S{i:03d}/{m}.nii.gz" for i in (5, 3, 11, 1) for m in ("mask", "ct")]
    recipe = study(tmp_path, PIVOT, *files)
    first = [(r.id, r.fields) for r in load(recipe)]
    assert [sid for sid, _ in first] == ["S001", "S003", "S005", "S011"]
    assert first == [(r.id, r.fields) for r in load(recipe)]


def test_a_field_repeated_in_the_template_must_agree(tmp_path: Path):
    recipe = study(tmp_path, 'from: "data/{subject}/{subject}_{modality}.nii.gz"\npivot: modality\n',
                   "data/S1/S1_ct.nii.gz", "data/S1/S2_ct.nii.gz", "data/S1/S1_x_mask.nii.gz")
    rows = load(recipe)
    assert [r.id for r in rows] == ["S1"]
    assert rows.file_columns == ("ct", "x_mask")


@pytest.mark.parametrize(
    ("subjects", "position", "message"),
    [
        ('from: "data/ct.nii.gz"', "4:9: subjects.from", "has no field"),
        ('from: ["data/{subject}.nii", "data/{subject/x.nii"]', "4:32: subjects.from[1]", "unbalanced '{'"),
        ('from: "data/{subject}/{m}.nii"\nid: subj', "5:7: subjects.id", "unknown field 'subj'"),
        ('from: "data/{subject}/{m}.nii"\npivot: modality', "5:10: subjects.pivot", "unknown field 'modality'"),
        ('from: "data/{subject}/{m}.nii"\nrequired: [ct]', "5:14: subjects.required[0]", "unknown column 'ct'"),
        ('from: "data/{subject}/{m}.nii"\nfields: {subject: "S[0-9"}', "5:21: subjects.fields.subject",
         "is not a valid regular expression"),
        ('from: "data/{subject}/{m}.nii"\nfields: {sbject: "S"}', "5:20: subjects.fields.sbject", "unknown field 'sbject'"),
        ('from: {ct: "ct/{subject}.nii", mask: "masks/{patient}.nii"}', "4:40: subjects.from.mask", "has no field {subject}"),
        ('from: "data/{subject}/{m}.nii"\nbids: data/', "5:9: subjects.bids", "not both"),
        ('manifest: m.csv\npivot: modality', "5:10: subjects.pivot", "belongs to 'from'"),
        ('bids: data/\nsuffix: T1w', "4:3: subjects", "missing required key 'datatype'"),
    ],
)
def test_bad_templates_are_errors_at_their_key(tmp_path: Path, subjects: str, position: str, message: str):
    recipe = study(tmp_path, subjects, "data/S1/ct.nii")
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    text = str(err.value)
    assert f"recipe.yaml:{position}:" in text and message in text, text


def test_a_bad_template_exits_2_through_the_cli(tmp_path: Path):
    out = run_cli("validate", str(study(tmp_path, 'from: "data/{subject}/{m}.nii"\nid: subj', "data/S1/ct.nii")))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "recipe.yaml:5:7: subjects.id: unknown field 'subj'" in out.stderr


def test_a_run_writes_the_subject_table_it_used(tmp_path: Path):
    recipe = study(tmp_path, PIVOT + "required: [ct, mask]\n", *LUNG)
    out = run_cli("run", str(recipe), "subjects.exclude=[LUNG002]")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 incomplete, not run: LUNG003 (missing mask)" in out.stdout + out.stderr
    (run,) = (tmp_path / ".habitrun/runs").iterdir()
    with open(run / "subjects.csv", newline="") as handle:
        table = list(csv.reader(handle))
    assert table == [["id", "subject", "ct", "mask"],
                     ["LUNG001", "LUNG001", "data/LUNG001/ct.nii.gz", "data/LUNG001/mask.nii.gz"]]


def test_a_subject_added_on_disk_is_the_only_one_a_rerun_runs(tmp_path: Path):
    recipe = study(tmp_path, PIVOT, *LUNG)
    first = run_cli("run", str(recipe))
    assert first.returncode == 0, first.stdout + first.stderr
    tree(tmp_path, "data/LUNG004/ct.nii.gz")
    again = run_cli("run", str(recipe))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "4 subject(s), 3 cached, 1 to run" in again.stdout

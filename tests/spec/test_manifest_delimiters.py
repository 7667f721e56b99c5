"""Manifests as Excel writes them: ';' or tabs in a .csv, trailing empty rows (issue 32).

Through the CLI: the delimiter is found in the header line (or set as ``subjects.delimiter``) and said;
rows with no value are ignored and said, never ``duplicate id ''``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.spec.conftest import run_cli

OPS = "def prep(subject):\n    return {'age': subject.fields['age']}\n"

RECIPE = textwrap.dedent("""\
    habitrun: 1
    name: t
    subjects:
      manifest: {manifest}
      id: subject_id
    policy: {{backend: serial, subject_timeout_sec: null}}
    stages:
      - name: prep
        operator: ops:prep
    """)


def study(root: Path, manifest: str, name: str = "subjects.csv") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "ops.py").write_text(OPS)
    (root / name).write_text(manifest)
    recipe = root / "recipe.yaml"
    recipe.write_text(RECIPE.format(manifest=name))
    return recipe


def clean(done) -> str:  # noqa: ANN001 - a CompletedProcess
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out
    return " ".join(out.split())  # rich wraps long lines


EXCEL = "subject_id;group;age\r\nS1;a;40\r\nS2;b;50\r\nS3;a;60\r\n;;\r\n;;\r\n"


@pytest.mark.timeout(120)
def test_an_excel_csv_with_semicolons_and_trailing_empty_rows_validates_plans_and_runs(tmp_path: Path) -> None:
    recipe = study(tmp_path, EXCEL)
    checked = run_cli("validate", str(recipe), cwd=tmp_path)
    out = clean(checked)
    assert checked.returncode == 0, out
    assert "subjects 3 from subjects.csv (id column 'subject_id')" in out
    assert ("subjects.csv: read with ';' as the delimiter (found in its header; set subjects.delimiter to choose)"
            in out)
    assert "subjects.csv: 2 empty rows ignored (lines 5-6)" in out
    assert "duplicate" not in out

    planned = run_cli("plan", str(recipe), cwd=tmp_path)
    out = clean(planned)
    assert planned.returncode == 0, out
    assert "subjects: subjects.csv: 2 empty rows ignored (lines 5-6)" in out

    ran = run_cli("run", str(recipe), cwd=tmp_path)
    out = clean(ran)
    assert ran.returncode == 0, out
    assert "warning: subjects.csv: 2 empty rows ignored (lines 5-6)" in out
    stored = sorted((tmp_path / ".habitrun" / "runs").iterdir())
    assert len(stored) == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("manifest", "says"), [
    ("subject_id\tage\nS1\t40\nS2\t50\n", "read with tab as the delimiter"),
    ("subject_id|age\nS1|40\nS2|50\n", "read with '|' as the delimiter"),
])
def test_other_delimiters_in_a_csv_are_found_in_the_header(tmp_path: Path, manifest: str, says: str) -> None:
    recipe = study(tmp_path, manifest)
    checked = run_cli("validate", str(recipe), cwd=tmp_path)
    out = clean(checked)
    assert checked.returncode == 0, out
    assert "subjects 2 from subjects.csv" in out and says in out


@pytest.mark.timeout(60)
def test_a_plain_csv_says_nothing_and_one_column_stays_one_column(tmp_path: Path) -> None:
    recipe = study(tmp_path, "subject_id,age\nS1,40\nS2,50\n")
    out = clean(run_cli("validate", str(recipe), cwd=tmp_path))
    assert "subjects 2 from subjects.csv" in out and "delimiter" not in out and "ignored" not in out
    recipe = study(tmp_path / "one", "subject_id\nS1\nS2\n")
    (tmp_path / "one" / "ops.py").write_text("def prep(subject):\n    return 1\n")
    out = clean(run_cli("validate", str(recipe), cwd=tmp_path / "one"))
    assert "subjects 2 from subjects.csv" in out and "delimiter" not in out


@pytest.mark.timeout(60)
def test_subjects_delimiter_is_taken_as_given_and_checked(tmp_path: Path) -> None:
    recipe = study(tmp_path, EXCEL)
    given = run_cli("validate", str(recipe), "subjects.delimiter=;", cwd=tmp_path)
    out = clean(given)
    assert given.returncode == 0, out
    assert "subjects 3 from subjects.csv" in out and "as the delimiter" not in out  # chosen, not found

    wrong = run_cli("validate", str(recipe), "subjects.delimiter=','", cwd=tmp_path)
    out = clean(wrong)
    assert wrong.returncode == 2, out
    assert "no id column 'subject_id'; columns are subject_id;group;age" in out  # as the user asked

    bad = run_cli("validate", str(recipe), "subjects.delimiter=x", cwd=tmp_path)
    out = clean(bad)
    assert bad.returncode == 2, out
    assert "override 'subjects.delimiter=x': subjects.delimiter:" in out

    json_recipe = study(tmp_path / "j", '[{"subject_id": "S1", "age": 1}]', name="subjects.json")
    text = json_recipe.read_text().replace("  id: subject_id\n", "  id: subject_id\n  delimiter: \";\"\n")
    json_recipe.write_text(text)
    refused = run_cli("validate", str(json_recipe), cwd=tmp_path / "j")
    out = clean(refused)
    assert refused.returncode == 2, out
    assert ("recipe.yaml:6:14: subjects.delimiter: a delimiter applies to a .csv or .tsv manifest, not .json"
            in out)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("manifest", "lines"), [
    ("subject_id,age\nS1,40\nS2,50\n,\n\n,\n", "3 empty rows ignored (lines 4-6)"),  # at the end
    ("subject_id,age\nS1,40\n,\n\nS2,50\n", "2 empty rows ignored (lines 3-4)"),  # among the rows
    ('subject_id,age\n"S1",40\nS2,50\n , \n', "1 empty row ignored (line 4)"),  # quoted: the csv module's reading
])
def test_empty_rows_are_ignored_with_their_lines(tmp_path: Path, manifest: str, lines: str) -> None:
    recipe = study(tmp_path, manifest)
    checked = run_cli("validate", str(recipe), cwd=tmp_path)
    out = clean(checked)
    assert checked.returncode == 0, out
    assert f"subjects 2 from subjects.csv (id column 'subject_id') subjects.csv: {lines}" in out


@pytest.mark.timeout(60)
def test_a_joined_excel_manifest_is_read_the_same_way(tmp_path: Path) -> None:
    for sid in ("S1", "S2"):
        (tmp_path / "data" / sid).mkdir(parents=True)
        (tmp_path / "data" / sid / "ct.nii.gz").write_text(sid)
    (tmp_path / "ops.py").write_text(OPS)
    (tmp_path / "clinical.csv").write_text("subject;age\nS1;40\nS2;50\n;\n;\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.replace("manifest: {manifest}\n  id: subject_id",
                                     'from: "data/{{subject}}/ct.nii.gz"\n  manifest: clinical.csv')
                      .format())
    checked = run_cli("validate", str(recipe), cwd=tmp_path)
    out = clean(checked)
    assert checked.returncode == 0, out
    assert "joined clinical.csv" in out
    assert "clinical.csv: read with ';' as the delimiter" in out
    assert "clinical.csv: 2 empty rows ignored (lines 4-5)" in out
    ran = run_cli("run", str(recipe), cwd=tmp_path)
    assert ran.returncode == 0, clean(ran)

"""A plain CSV/TSV kept as its lines reads exactly as the csv module reads it, and the
SubjectTable made from it behaves as the list of rows it replaces."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from habitrun.errors import RecipeError
from habitrun.spec.loader import load_recipe
from habitrun.spec.manifest import read_manifest
from habitrun.spec.subjects import SubjectRow, SubjectTable, load_subjects, rows_by_id

TEXTS = {
    "plain": "subject_id,site,age\nS1,a,1\nS2,b,\nS3,c,3\n",
    "no final newline": "subject_id,site\nS1,a\nS2,b",
    "blank lines first": "\n , \nsubject_id,site\nS1,a\nS2,b\n",
    "padded header": " subject_id , site \nS1, a \nS2,b\n",
    "odd values": "subject_id,p,q\nS1,it's,a\\b\nS2,é日本,{x}\nS3,,\n",
    "single column": "subject_id\nS1\nS2\n",
    "quoted": 'subject_id,p\nS1,"a,b"\nS2,y\n',
    "crlf": "subject_id,p\r\nS1,x\r\nS2,y\r\n",
    "crlf, a lone cr": "subject_id,p\r\nS1,x\rS2,y\r\n",
    "blank line inside": "subject_id,p\nS1,x\n\nS2,y\n",
    "a control character": "subject_id,p\nS1,a\x07b\nS2,y\n",
    "a tab and a DEL": "subject_id,p\nS1,a\tb\nS2,y\x7f\n",
}


PLAIN = {"plain", "no final newline", "blank lines first", "padded header", "odd values", "single column", "crlf",
         "a control character", "a tab and a DEL"}
PLAIN_VALUES = {"plain", "no final newline", "blank lines first", "padded header", "single column", "crlf"}


def _csv_rows(text: str) -> list[tuple[int, dict[str, str]]]:
    """What the csv module makes of ``text``: (line, fields) of every row of the header's width."""
    reader = csv.reader(io.StringIO(text, newline=""))
    header = [c.strip() for c in next(row for row in reader if any(c.strip() for c in row))]
    return [(reader.line_num, dict(zip(header, row, strict=True))) for row in reader if len(row) == len(header)]


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_lines_read_as_the_csv_module_reads(tmp_path: Path, name: str) -> None:
    path = tmp_path / "m.csv"
    path.write_text(TEXTS[name], newline="")
    table = read_manifest(path, "m.csv")
    assert list(table.pairs()) == _csv_rows(TEXTS[name])
    assert (table.lines is not None) == (name in PLAIN)
    assert table.plain_values == (name in PLAIN_VALUES)  # each value's repr is itself in quotes
    assert [table.ref(i) for i in range(len(table))] == [ref for ref, _ in _csv_rows(TEXTS[name])]
    assert table.column("subject_id") == [fields["subject_id"] for _, fields in _csv_rows(TEXTS[name])]


def test_a_row_of_another_width_is_reported_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("subject_id,p\nS1,x\nS2,y,z\n")
    with pytest.raises(RecipeError) as err:
        read_manifest(path, "m.csv")
    assert err.value.problems == ["m.csv:3:1: row has 3 fields, the header has 2"]


@pytest.mark.parametrize(("text", "problems"), [
    ("subject_id,p,q\nS1,x\nS2,y,z,w\nS3,a,b\n",  # as many delimiters in all as if every row were right
     ["m.csv:2:1: row has 2 fields, the header has 3", "m.csv:3:1: row has 4 fields, the header has 3"]),
    ("subject_id,p\nS1,é,日\nS2,ü\n", ["m.csv:2:1: row has 3 fields, the header has 2"]),
], ids=["one short, one long", "not ASCII"])
def test_rows_of_other_widths_are_each_reported(tmp_path: Path, text: str, problems: list[str]) -> None:
    path = tmp_path / "m.csv"
    path.write_text(text)
    with pytest.raises(RecipeError) as err:
        read_manifest(path, "m.csv")
    assert err.value.problems == problems


def _study(folder: Path, manifest: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "subjects.csv").write_text(manifest)
    (folder / "ops.py").write_text("def a(subject):\n    return 1\n")
    (folder / "recipe.yaml").write_text(
        "habitrun: 1\nname: t\nsubjects: {manifest: subjects.csv" + extra + "}\n"
        "stages:\n  - {name: a, operator: 'ops:a'}\n"
    )
    return folder / "recipe.yaml"


def test_the_table_behaves_as_its_list_of_rows(tmp_path: Path) -> None:
    recipe = _study(tmp_path, "subject_id,site\nS1,a\nS2,b\nS3,c\nS4,d\n", ", exclude: [S2]")
    table = load_subjects(load_recipe(recipe))
    rows = [SubjectRow("S1", {"subject_id": "S1", "site": "a"}, "S1"),
            SubjectRow("S3", {"subject_id": "S3", "site": "c"}, "S3"),
            SubjectRow("S4", {"subject_id": "S4", "site": "d"}, "S4")]
    assert isinstance(table, SubjectTable)
    assert table == rows and list(table) == rows and len(table) == 3
    assert table[0] == rows[0] and table[-1] == rows[-1] and table[1:] == rows[1:]
    assert table.ids == ["S1", "S3", "S4"] and table.column("site") == ["a", "c", "d"]
    assert table.by_id("S3") == rows[1] and table.by_id("S2") is None
    by_id = rows_by_id(table)
    assert by_id["S4"] == rows[2] and "S2" not in by_id and list(by_id) == ["S1", "S3", "S4"]
    with pytest.raises(IndexError):
        table[3]
    # a row is one dict, built at its first lookup and kept, as a list of rows has it
    assert table[1].fields is table.by_id("S3").fields is by_id["S3"].fields
    assert by_id["S3"] is by_id["S3"]


@pytest.mark.parametrize(("manifest", "problem"), [
    ("subject_id,p\nS1,x\nS1,y\n", "subjects.csv:3:1: subject_id: duplicate subject id 'S1' (first on line 2)"),
    ("subject_id,p\nS1,x\n ,y\n", "subjects.csv:3:1: subject_id: a subject needs a non-empty text or integer id, got ' '"),
])
def test_id_problems_of_a_plain_manifest_name_their_line(tmp_path: Path, manifest: str, problem: str) -> None:
    with pytest.raises(RecipeError) as err:
        load_subjects(load_recipe(_study(tmp_path, manifest)))
    assert err.value.problems == [problem]


def test_ids_that_are_not_plain_get_safe_names(tmp_path: Path) -> None:
    table = load_subjects(load_recipe(_study(tmp_path, "subject_id,p\n S 1 ,x\ns1,y\nS1,z\n.a,q\n")))
    assert [(row.id, row.safe) for row in table] == [
        ("S 1", "S%201"), ("s1", "s1~e8bc163c"), ("S1", "S1~3696ad59"), (".a", "%2Ea")]

"""JSON Schema: checked-in files match the models, accept every real recipe, reject bad ones."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from habitrun.cli.init import study_files
from habitrun.spec.loader import load_recipe
from habitrun.spec.schemas import FILES, schema_text
from habitrun.spec.yamlpos import load_with_positions
from tests.spec.conftest import BASE, run_cli

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted(REPO.glob("recipes/**/recipe.yaml"))


def _validator(name: str = "recipe.schema.json") -> jsonschema.Draft202012Validator:
    schema = json.loads((REPO / "schemas" / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _as_json(value):
    """What an editor sees: YAML data with mapping keys as strings."""
    if isinstance(value, dict):
        return {str(k): _as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    return value


def _errors(text: str) -> list[str]:
    data, _ = load_with_positions(text, "recipe.yaml")
    return [e.message for e in _validator().iter_errors(_as_json(data))]


@pytest.mark.parametrize("name", sorted(FILES))
def test_checked_in_schemas_match_the_models(name: str):
    on_disk = (REPO / "schemas" / name).read_text()
    assert on_disk == schema_text(FILES[name], name), f"schemas/{name} drifted: run `habitrun schema`"


def test_there_are_recipes_to_check():
    assert RECIPES, "no recipes/**/recipe.yaml found"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(REPO)))
def test_schema_accepts_every_recipe_in_the_repo(path: Path):
    assert _errors(path.read_text()) == []
    load_recipe(path)  # and the loader agrees


def test_schema_accepts_the_init_template_and_the_test_base():
    files = study_files("my-study")
    assert files["recipe.yaml"].startswith("# yaml-language-server: $schema=schemas/recipe.schema.json\n")
    assert _errors(files["recipe.yaml"]) == []
    assert _errors(BASE) == []


@pytest.mark.parametrize(
    "old, new",
    [
        ("habitrun: 1", "habitrun: 2"),
        ("habitrun: 1\n", ""),
        ("name: t", "nme: t"),
        ("  workers: 2", "  workers: four"),
        ("  workers: 2", "  workers: 0"),
        ("  workers: 2", "  on_subject_failure: stop"),
        ("kind: collect", "kind: reduce"),
        ("needs: [prep]", "needz: [prep]"),
        ("  - name: prep\n", "  - nam: prep\n"),
        ("operator: ops:prep", "operator: 'ops prep'"),
    ],
)
def test_schema_rejects_bad_recipes(old: str, new: str):
    assert old in BASE
    assert _errors(BASE.replace(old, new, 1)), f"schema accepted {new!r}"


def test_schema_accepts_an_interpolated_number():
    assert _errors(BASE.replace("  workers: 2", "  workers: ${vars.bins}")) == []


def test_run_policy_schema_accepts_a_dumped_policy():
    from habitrun.spec.policy import RunPolicy

    policy = RunPolicy(workers=3, parallel_mode="isolated", force_rerun_subjects=("a",))
    assert list(_validator("run-policy.schema.json").iter_errors(policy.to_dict())) == []
    assert list(_validator("run-policy.schema.json").iter_errors({"workers": 0}))


def test_schema_command_writes_the_files(tmp_path: Path):
    result = run_cli("schema", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    for name, model in FILES.items():
        assert (tmp_path / "out" / name).read_text() == schema_text(model, name)


def test_init_writes_a_study_that_validates(tmp_path: Path):
    target = tmp_path / "new-study"
    result = run_cli("init", str(target))
    assert result.returncode == 0, result.stderr
    assert (target / "study_ops" / "measure.py").is_file()
    checked = run_cli("validate", str(target / "recipe.yaml"))
    assert checked.returncode == 0, checked.stderr
    assert "ok: the recipe is valid" in checked.stdout
    assert "subjects  6 of 6 found by data/{subject}/{image}.csv" in checked.stdout
    ran = run_cli("run", str(target / "recipe.yaml"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    # after the run, plan says nothing is left to run, and no line above says otherwise
    planned = run_cli("plan", str(target / "recipe.yaml"))
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "subjects: 6 of 6 found by data/{subject}/{image}.csv" in planned.stdout
    assert "nothing to run" in planned.stdout
    assert [line for line in planned.stdout.splitlines() if "to run" in line and not line.lstrip().startswith("stage ")] == [
        "nothing to run: every stage is done"], planned.stdout  # (the table's header has a 'to run' column)
    again = run_cli("init", str(target))
    assert again.returncode == 2
    assert "already exists" in again.stderr and "Traceback" not in again.stderr

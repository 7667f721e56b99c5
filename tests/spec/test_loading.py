"""Loading: overrides, interpolation, positions, paths and the resolved-recipe round trip."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from habitrun.errors import RecipeError
from habitrun.spec.loader import load_recipe
from tests.spec.conftest import BASE, make_study

TRAIN = BASE + """\
  - name: fit
    kind: train
    needs: [table]
    command: [python, train.py, --out, "${workdir}/m.pt", --in, "${inputs}", --bins, "${vars.bins}", "$${HOME}"]
    launch: {nproc_per_node: 2}
"""


def _problems(path: Path, overrides=()) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides)
    return info.value.problems


def test_loaded_recipe_attributes(tmp_path: Path):
    path = make_study(tmp_path / "s")
    loaded = load_recipe(path)
    assert loaded.path == path.absolute()
    assert loaded.root == path.parent.absolute()
    assert loaded.text == BASE
    assert loaded.sha256 == hashlib.sha256(BASE.encode()).hexdigest()
    assert loaded.search_path == (str(path.parent.absolute()),)
    assert loaded.run_root() == path.parent / ".habitrun"
    assert loaded.store_dir() == path.parent / ".habitrun" / "store"
    assert loaded.recipe.stage("feat").params == {"bins": 8}  # whole-string var keeps its type
    assert loaded.overrides == ()


def test_run_dir_checkpoint_dir_and_root(tmp_path: Path):
    path = make_study(tmp_path / "s")
    loaded = load_recipe(path, ["run_dir=out", "policy.checkpoint_dir=/abs/store"])
    assert loaded.run_root() == path.parent / "out"
    assert loaded.store_dir() == Path("/abs/store")
    other = load_recipe(path, ["policy.checkpoint_dir=cache"], root=tmp_path)
    assert other.store_dir() == tmp_path / "cache"
    assert other.search_path == (str(tmp_path),)


def test_overrides_are_typed_and_reach_stages_by_name_or_index(tmp_path: Path):
    path = make_study(tmp_path / "s")
    loaded = load_recipe(path, [
        "policy.workers=8",
        "stages.feat.params.bins=64",
        "stages.0.params.mode=fast",
        "policy.subject_timeout_sec=null",
        "subjects.exclude=[S1, S2]",
        "stages.table.policy.workers=1",
    ])
    r = loaded.recipe
    assert r.policy.workers == 8 and r.policy.subject_timeout_sec is None
    assert r.stage("feat").params == {"bins": 64}
    assert r.stage("prep").params == {"mode": "fast"}
    assert r.subjects.exclude == ("S1", "S2")
    assert loaded.stage_policy("table").workers == 1
    assert loaded.stage_policy("feat").workers == 8


def test_an_override_of_a_var_reaches_every_use(tmp_path: Path):
    path = make_study(tmp_path / "s")
    assert load_recipe(path, ["vars.bins=3"]).recipe.stage("feat").params == {"bins": 3}


def test_several_broken_overrides_are_reported_together(tmp_path: Path):
    path = make_study(tmp_path / "s")
    problems = _problems(path, ["name.x=1", "stages.9.kind=map", "=3"])
    assert len(problems) == 3
    assert "'name' is a str, not a mapping" in problems[0]
    assert "has no item '9'" in problems[1]


def test_interpolation_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HABITRUN_T_DATA", "/mnt/study")
    monkeypatch.delenv("HABITRUN_T_UNSET", raising=False)
    recipe = BASE.replace("vars: {bins: 8}", (
        "vars:\n"
        "  bins: 8\n"
        "  data: ${env:HABITRUN_T_DATA}\n"
        "  scans: ${vars.data}/scans\n"
        "  nested: {levels: [1, 2], name: x}\n"
    )).replace('params: {bins: "${vars.bins}"}', (
        'params: {bins: "${vars.bins}", path: "${vars.scans}/a", lv: "${vars.nested.levels}",'
        ' first: "${vars.nested.levels.0}", n: "${vars.nested.name}-${vars.bins}",'
        ' d: "${env:HABITRUN_T_UNSET:-fallback}", lit: "$${vars.bins}"}'
    ))
    loaded = load_recipe(make_study(tmp_path / "s", recipe))
    assert loaded.recipe.stage("feat").params == {
        "bins": 8, "path": "/mnt/study/scans/a", "lv": [1, 2], "first": 1, "n": "x-8",
        "d": "fallback", "lit": "${vars.bins}",
    }
    assert loaded.recipe.vars["scans"] == "/mnt/study/scans"


def test_interpolation_problems_are_collected(tmp_path: Path):
    recipe = BASE.replace("vars: {bins: 8}", "vars: {a: '${vars.b}', b: '${vars.a}', l: [1]}").replace(
        'params: {bins: "${vars.bins}"}', 'params: {x: "${nope}", y: "${vars.l}-1", z: "${vars.q"}'
    )
    problems = _problems(make_study(tmp_path / "s", recipe))
    text = "\n".join(problems)
    assert "loop: vars.a -> vars.b -> vars.a" in text
    assert "unknown placeholder '${nope}'" in text
    assert "cannot be part of a longer string" in text
    assert "without a closing" in text
    assert all(":16:" in p for p in problems if "stages[1]" in p)


def test_runtime_placeholders_stay_in_train_commands(tmp_path: Path):
    loaded = load_recipe(make_study(tmp_path / "s", TRAIN))
    assert loaded.recipe.stage("fit").command == (
        "python", "train.py", "--out", "${workdir}/m.pt", "--in", "${inputs}", "--bins", "8", "$${HOME}",
    )


def test_resolved_yaml_loads_back_equal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HABITRUN_T_WORKERS", "3")
    recipe = TRAIN.replace("  workers: 2", "  workers: ${env:HABITRUN_T_WORKERS}")
    loaded = load_recipe(make_study(tmp_path / "s", recipe), ["stages.feat.params.bins=5"])
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    (run_folder / "recipe.resolved.yaml").write_text(loaded.resolved_yaml())
    monkeypatch.delenv("HABITRUN_T_WORKERS")
    again = load_recipe(run_folder / "recipe.resolved.yaml", root=loaded.root)
    assert again.recipe == loaded.recipe
    assert again.recipe.policy.workers == 3
    assert again.store_dir() == loaded.store_dir()


def test_key_problems_point_at_the_key_and_value_problems_at_the_value(tmp_path: Path):
    recipe = BASE.replace("  workers: 2", "  workers:   nine\n  wrkers: 1")
    problems = _problems(make_study(tmp_path / "s", recipe))
    assert any(":8:14: policy.workers: expected an integer >= 1, got 'nine'" in p for p in problems), problems
    assert any(":9:3: policy.wrkers: unknown key 'wrkers'" in p for p in problems), problems


def test_missing_file_and_folder(tmp_path: Path):
    with pytest.raises(RecipeError, match="no such recipe file"):
        load_recipe(tmp_path / "nope.yaml")
    with pytest.raises(RecipeError, match="is a folder"):
        load_recipe(tmp_path)


def test_anchors_and_merge_keys_work(tmp_path: Path):
    recipe = BASE.replace("  - name: prep\n    operator: ops:prep\n",
                          "  - &p\n    name: prep\n    operator: ops:prep\n    params: {a: 1}\n"
                          "  - <<: *p\n    name: prep2\n")
    loaded = load_recipe(make_study(tmp_path / "s", recipe))
    assert loaded.recipe.stage("prep2").params == {"a": 1}
    assert loaded.recipe.stage("prep2").operator == "ops:prep"


def test_alias_bomb_is_refused(tmp_path: Path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for n in "bcdefgh":
        prev = chr(ord(n) - 1)
        bomb += f"{n}: &{n} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
    path = tmp_path / "recipe.yaml"
    path.write_text("vars:\n  " + bomb.replace("\n", "\n  ") + "\nhabitrun: 1\n")
    with pytest.raises(RecipeError, match="expands to more than"):
        load_recipe(path)


def test_a_train_command_keeps_literal_dollar_braces_through_resolve_and_substitution(tmp_path: Path):
    from habitrun.engine.train import substitute

    recipe = TRAIN.replace('"$${HOME}"]', '"$${workdir}", "${vars.tpl}", "x=${vars.tpl}"]').replace(
        "vars: {bins: 8}", 'vars: {bins: 8, tpl: "$${run_id}"}', 1)
    loaded = load_recipe(make_study(tmp_path / "s", recipe))
    command = loaded.recipe.stage("fit").command
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    (run_folder / "recipe.resolved.yaml").write_text(loaded.resolved_yaml())
    again = load_recipe(run_folder / "recipe.resolved.yaml", root=loaded.root)
    assert again.recipe.stage("fit").command == command
    argv = substitute(command, {"workdir": "/w", "inputs": "/i.json", "stage_dir": "/s", "run_id": "r1"})
    # ${workdir} filled; $${workdir} and a variable's literal ${run_id} stay literal
    assert argv[-4:] == ["8", "${workdir}", "${run_id}", "x=${run_id}"] and argv[3] == "/w/m.pt"

"""Cache keys: deterministic, sensitive to every input, consistent between bulk and single use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from habitrun.planner.fingerprint import command_fingerprint
from habitrun.planner.keys import (
    group_key,
    stage_identity,
    subject_key,
    subject_part,
    subject_parts,
)
from habitrun.planner.plan import plan_study
from habitrun.spec.recipe import StageSpec
from tests.planner.study import load, write_study


@dataclass(frozen=True)
class Row:
    id: str
    fields: dict


def stage(**kw) -> StageSpec:
    return StageSpec.model_validate({"name": "s", "operator": "m:f", **kw})


def test_stage_identity_covers_definition_and_code() -> None:
    base = stage_identity(stage(params={"a": 1}), "fp")
    assert base == stage_identity(stage(params={"a": 1}), "fp")
    assert base != stage_identity(stage(params={"a": 2}), "fp")
    assert base != stage_identity(stage(params={"a": 1}), "fp2")
    assert base != stage_identity(stage(params={"a": 1}, operator="m:g"), "fp")
    assert base != stage_identity(StageSpec.model_validate({"name": "t", "operator": "m:f", "params": {"a": 1}}), "fp")
    assert stage_identity(stage(params={"a": 1, "b": 2}), "fp") == stage_identity(stage(params={"b": 2, "a": 1}), "fp")
    assert stage_identity(stage(policy={"workers": 3}), "fp") == stage_identity(stage(), "fp")  # policy is not an input


def test_subject_part_bulk_equals_single_for_odd_rows() -> None:
    rows = [Row("a", {"x": "1", "y": 2}), Row("b", {"y": 2, "x": "1"}), Row("c", {"x": "1"}), Row("d", {}),
            Row("e", {"x": "1", "z": 2}), Row("f", {1: 2}), Row("g/..\x00", {"x": "1", "y": [1, {"k": None}]})]
    bulk = subject_parts(rows)
    assert all(bulk[r.id] == subject_part(r.id, r.fields) for r in rows)
    assert len(set(bulk.values())) == len(rows)
    assert subject_part("a", {"x": "1"}) != subject_part("a", {"x": 1})  # types matter
    assert subject_part("a", {"x": "1"}) != subject_part("b", {"x": "1"})


def test_subject_key_matches_the_planner(tmp_path: Path) -> None:
    loaded, subjects = load(write_study(tmp_path))
    plan = plan_study(loaded, subjects, None)
    a, b = plan.stages["a"], plan.stages["b"]
    row = subjects[2]
    assert a.keys[row.id] == subject_key(a.identity, row.id, row.fields, [])
    assert b.keys[row.id] == subject_key(b.identity, row.id, row.fields, [a.keys[row.id]])
    assert len(set(a.keys.values()) | set(b.keys.values())) == 2 * len(subjects)


def test_group_key_covers_members_and_their_keys() -> None:
    base = group_key("id", {"b": ["k1", "k2"], "a": ["x"]})
    assert base == group_key("id", {"a": ["x"], "b": ["k1", "k2"]})
    assert base != group_key("id", {"b": ["k1"], "a": ["x"]})
    assert base != group_key("id", {"b": ["k1", "k3"], "a": ["x"]})
    assert base != group_key("id2", {"b": ["k1", "k2"], "a": ["x"]})


def test_command_fingerprint_reads_the_script(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    cmd = ["python", "train.py", "--out", "${workdir}"]
    first = command_fingerprint(cmd, tmp_path)
    assert first == command_fingerprint(cmd, tmp_path)
    (tmp_path / "train.py").write_text("print(2)\n")
    assert command_fingerprint(cmd, tmp_path) != first
    assert command_fingerprint([*cmd, "--epochs", "5"], tmp_path) != command_fingerprint(cmd, tmp_path)

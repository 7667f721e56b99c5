"""Change detection and statuses: exactly the affected subjects and stages go stale, with reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from habitrun.planner.plan import GROUP_SUBJECT, SubjectStatus, plan_study
from habitrun.store.checkpoint import CheckpointStore
from tests.planner.study import load, run_like_the_engine, write_study

DONE, FAILED, STALE, PENDING, FORCED, BLOCKED = (
    SubjectStatus.DONE, SubjectStatus.FAILED, SubjectStatus.STALE,
    SubjectStatus.PENDING, SubjectStatus.FORCED, SubjectStatus.BLOCKED,
)
IDS = [f"S{i}" for i in range(1, 6)]


@pytest.fixture
def study(tmp_path: Path):
    recipe = write_study(tmp_path)
    loaded, subjects = load(recipe)
    store = CheckpointStore.open(loaded.store_dir())
    run_like_the_engine(loaded, subjects, store)
    yield recipe, store
    store.close()


def replan(recipe: Path, store: CheckpointStore | None, *overrides: str):
    loaded, subjects = load(recipe, *overrides)
    return plan_study(loaded, subjects, store)


def statuses(plan, stage: str) -> dict[str, SubjectStatus]:
    return dict(plan.stages[stage].status)


def test_without_a_store_everything_is_pending(tmp_path: Path) -> None:
    plan = replan(write_study(tmp_path), None)
    assert list(plan.stages) == ["a", "b", "c"]
    for name in ("a", "b"):
        assert statuses(plan, name) == dict.fromkeys(IDS, PENDING)
        assert plan.stages[name].to_run() == IDS
    assert statuses(plan, "c") == {GROUP_SUBJECT: PENDING} and plan.stages["c"].members == IDS


def test_touching_nothing_reruns_nothing(study) -> None:
    recipe, store = study
    plan = replan(recipe, store)
    assert plan.counts() == {"done": 11, "failed": 0, "stale": 0, "pending": 0, "forced": 0, "blocked": 0}
    assert all(not stage.to_run() for stage in plan)


def test_editing_a_param_makes_that_stage_and_downstream_stale(study) -> None:
    recipe, store = study
    recipe.write_text(recipe.read_text().replace("bins: 8", "bins: 16"))
    plan = replan(recipe, store)
    assert statuses(plan, "a") == dict.fromkeys(IDS, DONE)
    assert statuses(plan, "b") == dict.fromkeys(IDS, STALE)
    assert plan.stages["b"].reasons == dict.fromkeys(IDS, ["params.bins: 8 → 16"])
    assert statuses(plan, "c") == {GROUP_SUBJECT: STALE}
    assert plan.stages["c"].reasons[GROUP_SUBJECT] == ["upstream 'b' changed"]


def test_an_override_is_a_param_edit_too(study) -> None:
    recipe, store = study
    plan = replan(recipe, store, "stages.a.params.scale=3")
    assert plan.stages["a"].reasons == dict.fromkeys(IDS, ["params.scale: 2 → 3"])
    assert plan.stages["b"].reasons == dict.fromkeys(IDS, ["upstream 'a' changed"])


def test_editing_operator_code_makes_its_stage_stale(study) -> None:
    recipe, store = study
    ops = recipe.parent / "ops_a.py"
    ops.write_text(ops.read_text().replace("scale *", "scale +"))
    plan = replan(recipe, store)
    assert plan.stages["a"].reasons == dict.fromkeys(IDS, ["code: ops_a.py changed"])
    assert plan.stages["b"].reasons == dict.fromkeys(IDS, ["upstream 'a' changed"])
    assert statuses(plan, "c") == {GROUP_SUBJECT: STALE}


def test_editing_the_module_of_b_and_c_leaves_a_done(study) -> None:
    recipe, store = study
    ops = recipe.parent / "ops_b.py"
    ops.write_text(ops.read_text().replace("% bins", "// bins"))
    plan = replan(recipe, store)
    assert statuses(plan, "a") == dict.fromkeys(IDS, DONE)
    assert plan.stages["b"].reasons == dict.fromkeys(IDS, ["code: ops_b.py changed"])
    assert "code: ops_b.py changed" in plan.stages["c"].reasons[GROUP_SUBJECT]


def test_editing_one_manifest_row_makes_only_that_subject_stale(study) -> None:
    recipe, store = study
    manifest = recipe.parent / "subjects.csv"
    manifest.write_text(manifest.read_text().replace("S3,30,site1", "S3,31,site1"))
    plan = replan(recipe, store)
    assert statuses(plan, "a") == {**dict.fromkeys(IDS, DONE), "S3": STALE}
    assert plan.stages["a"].reasons == {"S3": ["manifest row changed: x 30 → 31"]}
    assert statuses(plan, "b") == {**dict.fromkeys(IDS, DONE), "S3": STALE}
    assert plan.stages["b"].reasons == {"S3": ["manifest row changed: x 30 → 31", "upstream 'a' changed"]}
    assert plan.stages["c"].reasons[GROUP_SUBJECT] == ["upstream 'b' changed"]
    assert plan.stages["a"].to_run() == ["S3"]


def test_reordering_manifest_columns_changes_nothing(study) -> None:
    recipe, store = study
    manifest = recipe.parent / "subjects.csv"
    lines = [line.split(",") for line in manifest.read_text().splitlines()]
    manifest.write_text("\n".join(f"{s},{site},{x}" for s, x, site in lines) + "\n")
    assert replan(recipe, store).counts()["done"] == 11


def test_a_new_subject_is_pending_and_changes_the_collect(study) -> None:
    recipe, store = study
    manifest = recipe.parent / "subjects.csv"
    manifest.write_text(manifest.read_text() + "S6,60,site0\n")
    plan = replan(recipe, store)
    assert statuses(plan, "a") == {**dict.fromkeys(IDS, DONE), "S6": PENDING}
    assert plan.stages["c"].reasons[GROUP_SUBJECT][0] == "subjects changed"


def test_a_recorded_failure_blocks_downstream_unless_retried(tmp_path: Path) -> None:
    recipe = write_study(tmp_path)
    loaded, subjects = load(recipe)
    with CheckpointStore.open(loaded.store_dir()) as store:
        ran = run_like_the_engine(loaded, subjects, store, fail={"a": {"S2"}})
        assert ran.stages["b"].status["S2"] is BLOCKED and "S2" not in ran.stages["c"].members
        plan = replan(recipe, store)
        assert statuses(plan, "a") == {**dict.fromkeys(IDS, DONE), "S2": FAILED}
        assert statuses(plan, "b") == {**dict.fromkeys(IDS, DONE), "S2": BLOCKED}
        assert plan.stages["b"].reasons["S2"] == ["upstream 'a' failed"]
        assert plan.stages["c"].members == ["S1", "S3", "S4", "S5"]
        assert statuses(plan, "c") == {GROUP_SUBJECT: DONE}
        assert all(not stage.to_run() for stage in plan)

        retry = replan(recipe, store, "policy.retry_failed_subjects=true")
        assert retry.stages["a"].status["S2"] is FORCED and retry.stages["a"].to_run() == ["S2"]
        assert retry.stages["b"].status["S2"] is PENDING  # it may run once 'a' succeeds
        assert retry.stages["c"].members == IDS and retry.stages["c"].status[GROUP_SUBJECT] is STALE


def test_engine_marks_failures_then_plans_the_next_stage(tmp_path: Path) -> None:
    recipe = write_study(tmp_path)
    loaded, subjects = load(recipe)
    with CheckpointStore.open(loaded.store_dir()) as store:
        plan = run_like_the_engine(loaded, subjects, store, fail={"b": set(IDS)})
    assert statuses(plan, "b") == dict.fromkeys(IDS, FAILED)
    assert plan.stages["c"].status[GROUP_SUBJECT] is BLOCKED and plan.stages["c"].members == []


def test_force_rerun_subjects_and_resume_off(study) -> None:
    recipe, store = study
    plan = replan(recipe, store, "policy.force_rerun_subjects=[S1, S4]")
    for name in ("a", "b"):
        assert statuses(plan, name) == {**dict.fromkeys(IDS, DONE), "S1": FORCED, "S4": FORCED}
        assert plan.stages[name].to_run() == ["S1", "S4"]
        assert plan.stages[name].reasons["S1"] == ["listed in force_rerun_subjects"]
    assert statuses(plan, "c") == {GROUP_SUBJECT: DONE}  # not a subject of a map stage

    plan = replan(recipe, store, "policy.resume=false")
    for stage in plan:
        assert set(stage.status.values()) == {FORCED}
        assert all(r == ["resume is off"] for r in stage.reasons.values())
    assert plan.stages["a"].to_run() == IDS


def test_a_stage_policy_override_applies_to_that_stage_only(study) -> None:
    recipe, store = study
    recipe.write_text(recipe.read_text().replace(
        'needs: [a], params: {bins: 8}}', 'needs: [a], params: {bins: 8}, policy: {resume: false}}'))
    plan = replan(recipe, store)
    assert set(statuses(plan, "a").values()) == {DONE} and set(statuses(plan, "b").values()) == {FORCED}


def test_plan_json_is_complete(study) -> None:
    recipe, store = study
    data = replan(recipe, store, "stages.b.params.bins=9").to_json()
    b = data["stages"][1]
    assert b["name"] == "b" and b["counts"]["stale"] == 5 and b["to_run"] == 5
    assert b["subjects"]["S1"]["status"] == "stale" and b["subjects"]["S1"]["reasons"] == ["params.bins: 8 → 9"]
    assert data["counts"]["done"] == 5


def test_components_json_is_the_components_as_the_store_keeps_them(tmp_path: Path) -> None:
    import json

    from habitrun.store.jsontext import compact

    plan = replan(write_study(tmp_path), None)
    for stage in plan:
        for sid in stage.status:
            text = stage.components_json(sid)
            assert json.loads(text) == stage.components[sid] and text == compact(stage.components[sid])
    assert json.loads(plan.stages["b"].components_json("S1"))["upstream"] == {"a": plan.stages["a"].keys["S1"]}


def test_a_stage_downstream_of_one_keyed_on_fewer_fields_still_sees_every_change(tmp_path: Path) -> None:
    recipe = write_study(tmp_path)
    recipe.write_text(recipe.read_text().replace(
        '{name: a, operator: "ops_a:load", params: {scale: 2}}',
        '{name: a, operator: "ops_a:load", params: {scale: 2}, fields: [x]}'))
    loaded, subjects = load(recipe)
    with CheckpointStore.open(loaded.store_dir()) as store:
        ran = run_like_the_engine(loaded, subjects, store)
        assert ran.stages["a"].variant != ran.stages["b"].variant
        assert replan(recipe, store).counts()["done"] == 11
        manifest = recipe.parent / "subjects.csv"
        manifest.write_text(manifest.read_text().replace("S2,20,site0", "S2,20,site9"))
        plan = replan(recipe, store)
        assert statuses(plan, "a") == dict.fromkeys(IDS, DONE)  # a keys on x only
        assert statuses(plan, "b") == {**dict.fromkeys(IDS, DONE), "S2": STALE}
        assert plan.stages["b"].reasons["S2"] == ["manifest row changed: site site0 → site9"]
        manifest.write_text(manifest.read_text().replace("S2,20,site9", "S2,21,site0"))
        plan = replan(recipe, store)
        assert plan.stages["a"].reasons == {"S2": ["manifest row changed: x 20 → 21"]}
        assert plan.stages["b"].reasons == {"S2": ["manifest row changed: x 20 → 21", "upstream 'a' changed"]}

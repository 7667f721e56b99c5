"""Work folders per cache key, `habitrun gc`, downstream following content, a study that moves."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from habitrun.planner.plan import GROUP_SUBJECT, plan_study
from habitrun.spec.loader import load_recipe
from habitrun.spec.subjects import load_subjects
from habitrun.store.checkpoint import CheckpointStore, Record
from tests.store.integrity_study import habitrun, write_study


def stage_results(recipe: Path, stage: str, *overrides: str) -> dict:
    """subject -> stored result of ``stage`` under its current key (read as `status` reads)."""
    loaded = load_recipe(recipe, overrides)
    store = CheckpointStore.open(loaded.store_dir(), create=False, read_only=True)
    store.set_roots(loaded.run_root(), loaded.root)
    try:
        plan = plan_study(loaded, load_subjects(loaded), store).stages[stage]
        keys = dict(plan.keys)
        got = store.results(list(keys.values()))
        return {sid: got[key] for sid, key in keys.items() if key in got}
    finally:
        store.close()


def plan_json(recipe: Path, *overrides: str) -> dict:
    done = habitrun("plan", str(recipe), *overrides, "--json", cwd=recipe.parent)
    return {s["name"]: s for s in json.loads(done.stdout)["stages"]}


def statuses(plan: dict, stage: str) -> dict[str, str]:
    return {sid: v["status"] for sid, v in plan[stage]["subjects"].items()}


@pytest.mark.timeout(120)
def test_bins_32_16_32_is_cached_with_its_own_files_and_gc_frees_the_16_folders(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study")
    cwd = recipe.parent
    habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    habitrun("run", "recipe.yaml", "stages.feat.params.bins=16", "-q", cwd=cwd)
    done = habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    assert "nothing to run" in done.stdout, done.stdout
    plan = plan_json(recipe)
    assert all(s["to_run"] == 0 for s in plan.values())
    feat = stage_results(recipe, "feat")
    for sid, result in feat.items():  # every file the current results name holds bins=32 content
        assert Path(result["file"]).read_text().startswith("bins=32 "), sid
    table = stage_results(recipe, "table")[GROUP_SUBJECT]
    assert all(text.startswith("bins=32 ") for text in table.values())
    sixteen = stage_results(recipe, "feat", "stages.feat.params.bins=16")
    old_folders = {Path(r["file"]).parent for r in sixteen.values()}
    assert all(Path(r["file"]).read_text().startswith("bins=16 ") for r in sixteen.values())

    dry = habitrun("gc", "recipe.yaml", cwd=cwd)
    assert "would delete" in dry.stdout and all(f.is_dir() for f in old_folders)
    before = {p for p in (cwd / ".habitrun" / "work").rglob("*")}
    gone = habitrun("gc", "recipe.yaml", "--yes", cwd=cwd)
    assert "freed" in gone.stdout, gone.stdout
    assert not any(f.exists() for f in old_folders)
    after = {p for p in (cwd / ".habitrun" / "work").rglob("*")}
    # bins=16 folders of feat, the collect and post folders of that version: gone; nothing current
    assert all(Path(r["file"]).is_file() for r in feat.values()) and after < before
    assert all(s["to_run"] == 0 for s in plan_json(recipe).values())
    assert "0 work folder(s)" in habitrun("gc", "recipe.yaml", cwd=cwd).stdout
    with CheckpointStore.open(cwd / ".habitrun" / "store", create=False, read_only=True) as store:
        assert (store.count("feat"), store.count("table"), store.count("post")) == (3, 1, 3)  # bins=16 records gone
    assert all(s["to_run"] == 3 or s["kind"] == "collect" for s in
               plan_json(recipe, "stages.feat.params.bins=16").values() if s["name"] != "table")


@pytest.mark.timeout(120)
def test_an_upstream_result_recomputed_to_another_value_makes_downstream_stale(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study")
    cwd = recipe.parent
    habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    # the same value again: nothing downstream moves
    habitrun("run", "recipe.yaml", "policy.force_rerun_subjects=[s2]", "-q", cwd=cwd)
    assert all(s["to_run"] == 0 for s in plan_json(recipe).values())
    (cwd / "salt.txt").write_text("two\n")  # outside every key: only a forced rerun sees it
    habitrun("run", "recipe.yaml", "stages.feat.policy.force_rerun_subjects=[s2]", "stages.table.policy.resume=true",
             "-q", cwd=cwd, code=None)
    plan = plan_json(recipe)
    assert plan["feat"]["to_run"] == 0
    # post and table ran after feat in that same run: they took the new value
    assert statuses(plan, "post") == {"s1": "done", "s2": "done", "s3": "done"}
    assert stage_results(recipe, "post")["s2"].endswith("salt=two:two")
    assert stage_results(recipe, "table")[GROUP_SUBJECT]["s2"].endswith("salt=two")


@pytest.mark.timeout(120)
def test_plan_marks_downstream_stale_after_an_upstream_only_rerun(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study")
    cwd = recipe.parent
    habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    # What a run that reran s2 of feat to another value and was stopped before the
    # downstream stages leaves: feat's s2 replaced under its key.
    loaded = load_recipe(recipe)
    store = CheckpointStore.open(loaded.store_dir())
    store.set_roots(loaded.run_root(), loaded.root)
    try:
        feat = plan_study(loaded, load_subjects(loaded), store).stages["feat"]
        old = store.results([feat.keys["s2"]])[feat.keys["s2"]]
        store.put([Record(stage="feat", key=feat.keys["s2"], subject_id="s2", ok=True, result={**old, "salt": "two"})])
        store.put([Record(stage="feat", key=feat.keys["s3"], subject_id="s3", ok=True, result=dict(store.results([feat.keys["s3"]])[feat.keys["s3"]]))])
    finally:
        store.close()
    done = habitrun("plan", "recipe.yaml", "--reason", cwd=cwd)
    assert "stale (upstream 'feat' reran with a different result)" in done.stdout, done.stdout
    plan = plan_json(recipe)
    assert statuses(plan, "post") == {"s1": "done", "s2": "stale", "s3": "done"}  # s3: the same value
    assert statuses(plan, "table") == {GROUP_SUBJECT: "stale"}
    habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    assert stage_results(recipe, "post")["s2"].endswith(":two")
    assert stage_results(recipe, "post")["s1"].endswith(":one")
    assert stage_results(recipe, "table")[GROUP_SUBJECT]["s2"].startswith("bins=32 x=2")
    assert all(s["to_run"] == 0 for s in plan_json(recipe).values())


@pytest.mark.timeout(120)
def test_a_moved_study_is_all_done_and_a_downstream_rerun_reads_the_moved_files(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study-a", big="s1")
    habitrun("run", "recipe.yaml", "-q", cwd=recipe.parent)
    shutil.move(str(tmp_path / "study-a"), str(tmp_path / "study-b"))
    moved = tmp_path / "study-b" / "recipe.yaml"
    plan = plan_json(moved)
    assert all(s["to_run"] == 0 for s in plan.values()), plan
    feat = stage_results(moved, "feat")
    assert all(r["file"].startswith(str(tmp_path / "study-b")) for r in feat.values())
    done = habitrun("run", "recipe.yaml", "stages.post.params.factor=2", "-q", cwd=moved.parent)
    post = stage_results(moved, "post", "stages.post.params.factor=2")
    assert not (tmp_path / "study-a").exists()
    assert post == {sid: "2:" + Path(feat[sid]["file"]).read_text() + ":one" for sid in feat}, done.stdout


def test_paths_outside_the_study_are_kept_and_counted(tmp_path: Path) -> None:
    study, elsewhere = tmp_path / "study", tmp_path / "shared"
    with CheckpointStore.open(study / ".habitrun" / "store") as store:
        store.set_roots(study / ".habitrun", study)
        inside = study / "data" / "s1.nii"
        store.put([Record(stage="feat", key="k1", subject_id="S1", ok=True, result={"in": inside, "out": str(elsewhere / "atlas.nii"), "n": [1, "/mm"]}),
                   Record(stage="feat", key="k2", subject_id="S2", ok=True, result=[str(study / ".habitrun" / "work" / "x.csv")])])
        assert store.outside_paths("feat") == (1, str(elsewhere / "atlas.nii"))
        moved = tmp_path / "moved"
        store.set_roots(moved / ".habitrun", moved)  # what a reader after `mv study moved` sees
        got = store.results(["k1", "k2"])
        assert got["k1"] == {"in": moved / "data" / "s1.nii", "out": str(elsewhere / "atlas.nii"), "n": [1, "/mm"]}
        assert got["k2"] == [str(moved / ".habitrun" / "work" / "x.csv")]


def test_gc_deletes_the_slurm_batch_folders_merged_for_good_and_keeps_the_open_ones(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study")
    cwd = recipe.parent
    habitrun("run", "recipe.yaml", "-q", cwd=cwd)
    batches = cwd / ".habitrun" / "slurm"
    closed, still_open = batches / "20261206-090000-feat-1-0", batches / "20261206-090100-feat-1-0"
    for folder in (closed, still_open):  # as the slurm backend leaves them: shards, outputs, its arrays file
        (folder / "shards").mkdir(parents=True)
        (folder / "shards" / "chunk-00000.7-0-9.shard").write_bytes(b"x" * 5000)
        (folder / "arrays.json").write_text(json.dumps({"stage": "feat", "chunks": 1, "parts": []}))
    (closed / "closed").write_text("1796548000.0\n")
    dry = habitrun("gc", "recipe.yaml", cwd=cwd)
    assert "would delete 1 merged SLURM batch folder(s)" in dry.stdout, dry.stdout
    assert closed.is_dir() and "habitrun gc recipe.yaml --yes" in dry.stdout
    gone = habitrun("gc", "recipe.yaml", "--yes", cwd=cwd)
    assert "deleted 1 merged SLURM batch folder(s)" in gone.stdout, gone.stdout
    assert not closed.exists() and (still_open / "shards").is_dir()  # a run may still merge the open one

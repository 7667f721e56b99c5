"""Keys made in bulk from a manifest's lines are the keys made row by row, and an all-done
stage read ahead by the store plans as one read when asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from habitrun.planner.keys import CHUNK, subject_part, subject_parts
from habitrun.planner.plan import plan_study
from habitrun.spec.loader import load_recipe
from habitrun.spec.subjects import SubjectTable, load_subjects
from habitrun.store.checkpoint import CheckpointStore
from habitrun.study.opening import subjects_and_store
from tests.planner.study import load, run_like_the_engine, write_study

MANIFESTS = {
    "plain": "subject_id,site,age\nS2,a,1\nS1,b,\n",
    "odd values": "subject_id,p,q\nS1,it's,a\\b\nS2,é日本,\tx\n",
    "braces in the header": "subject_id,{x},y}\nS1,1,2\nS2,3,4\n",
    "percent signs": "subject_id,%x,y%%\nS1,1%,%d\nS2,3,4\n",
    "percent signs, one odd value": "subject_id,%s\nS1,it's %r\n",
    "single column": "subject_id\nS1\nS2\n",
    "ids that are not plain": "subject_id,p\nS 1,x\ns1,y\n",
    "plain values not in ASCII": "subject_id,p,q\nS1,é日本,x\nS2,ü,\n",
    "the id not first, ids of two lengths": "p,subject_id,q\na,S10,b\nc,S2,d\n",
    "single column, two lengths": "subject_id\nS1\nS22\n",
    "include/exclude": "subject_id,site\nS1,a\nS2,b\nS3,c\n",
}


def _table(folder: Path, manifest: str, subjects: str = "{manifest: subjects.csv}") -> SubjectTable:
    (folder / "subjects.csv").write_text(manifest)
    (folder / "ops.py").write_text("def a(subject):\n    return 1\n")
    (folder / "recipe.yaml").write_text(
        f"habitrun: 1\nname: t\nsubjects: {subjects}\nstages:\n  - {{name: a, operator: 'ops:a'}}\n")
    return load_subjects(load_recipe(folder / "recipe.yaml"))


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_bulk_parts_are_the_parts_of_each_row(tmp_path: Path, name: str) -> None:
    table = _table(tmp_path, MANIFESTS[name], "{manifest: subjects.csv, exclude: [S2]}"
                   if name == "include/exclude" else "{manifest: subjects.csv}")
    parts = subject_parts(table)
    assert dict(parts.items()) == {row.id: subject_part(row.id, row.fields) for row in table}
    assert dict(parts.items()) == subject_parts(list(table))
    assert all(parts[row.id] == parts.get(row.id) for row in table) and parts.get("nobody") is None


def test_parts_made_by_chunk_are_the_parts_of_each_row(tmp_path: Path) -> None:
    """More rows than a chunk (keys.CHUNK); ids of two lengths; a value not in ASCII; the id in
    the second column."""
    rows = [f"v{i % 7}é,S{i:06d},{i * 31 % 1000}" for i in range(CHUNK + 10)]
    rows[CHUNK + 3] = "x,S1,y"  # the last chunk: ids of two lengths
    table = _table(tmp_path, "p,subject_id,q\n" + "\n".join(rows) + "\n")
    parts = subject_parts(table)
    for i in (0, 1, CHUNK - 1, CHUNK, CHUNK + 3, CHUNK + 9):
        row = table[i]
        assert parts[row.id] == subject_part(row.id, row.fields)
    assert dict(parts.items()) == subject_parts(list(table))


def test_a_read_only_store_reads_ahead_what_the_plan_asks(tmp_path: Path) -> None:
    recipe = write_study(tmp_path, n=6)
    loaded, subjects = load(recipe)
    with CheckpointStore.open(loaded.store_dir()) as store:
        run_like_the_engine(loaded, subjects, store)
        expected = plan_study(loaded, subjects, store).to_json()
    store = CheckpointStore.open(loaded.store_dir(), create=False, read_only=True)
    try:
        asked: list[tuple[str, str]] = []
        prefetch = store.prefetch_outcomes
        store.prefetch_outcomes = lambda ranges: (asked.extend(ranges), prefetch(ranges))  # type: ignore[method-assign]
        assert plan_study(loaded, subjects, store).to_json() == expected
        assert [stage for stage, _ in asked] == ["a", "b"]  # the map stages
        assert store._prefetching is not None and not store._prefetching[1]  # every text taken
    finally:
        store.close()
    assert store._prefetching is None


@pytest.mark.parametrize("fail", [{}, {"a": {"S2"}}], ids=["all done", "a failure"])
def test_the_stored_keys_are_read_ahead_while_the_manifest_loads(tmp_path: Path, fail: dict) -> None:
    recipe = write_study(tmp_path, n=6)
    loaded, subjects = load(recipe)
    with CheckpointStore.open(loaded.store_dir()) as store:
        run_like_the_engine(loaded, subjects, store, fail=fail)
        expected = plan_study(loaded, subjects, store).to_json()  # a writer reads nothing ahead
    loaded = load_recipe(recipe)
    subjects, store = subjects_and_store(
        loaded, lambda: CheckpointStore.open(loaded.store_dir(), create=False, read_only=True))
    try:
        assert store._prefetching is not None  # started beside the manifest, before the plan
        assert plan_study(loaded, subjects, store).to_json() == expected
        assert not store._prefetching[1]  # every text read ahead was one the plan asked for
    finally:
        store.close()
    statuses = {s["name"]: {sid: v["status"] for sid, v in s["subjects"].items()} for s in expected["stages"]}
    if fail:
        assert statuses["a"]["S2"] == "failed" and statuses["b"]["S2"] == "blocked"
    assert sum(st == "done" for stage in statuses.values() for st in stage.values()) == (11 if fail else 13)

"""A tiny study on disk for planner tests: two operator modules, a manifest, a recipe."""

from __future__ import annotations

from pathlib import Path

from habitrun.planner.context import build_context
from habitrun.planner.plan import GROUP_SUBJECT, Plan, SubjectStatus, plan_stage
from habitrun.spec.loader import LoadedRecipe, load_recipe
from habitrun.spec.subjects import load_subjects
from habitrun.store.checkpoint import CheckpointStore, Record

RECIPE = """\
habitrun: 1
name: planner-study
subjects: {manifest: subjects.csv}
policy: {backend: serial, subject_timeout_sec: null}
stages:
  - {name: a, operator: "ops_a:load", params: {scale: 2}}
  - {name: b, operator: "ops_b:feature", needs: [a], params: {bins: 8}}
  - {name: c, kind: collect, operator: "ops_b:table", needs: [b]}
"""

OPS_A = "def load(subject, scale):\n    return scale * int(subject.fields['x'])\n"
OPS_B = (
    "def feature(subject, bins):\n    return subject.inputs['a'] % bins\n\n"
    "def table(collection):\n    return dict(collection)\n"
)


def write_study(folder: Path, n: int = 5) -> Path:
    (folder / "ops_a.py").write_text(OPS_A)
    (folder / "ops_b.py").write_text(OPS_B)
    rows = "\n".join(f"S{i},{i * 10},site{i % 2}" for i in range(1, n + 1))
    (folder / "subjects.csv").write_text("subject_id,x,site\n" + rows + "\n")
    (folder / "recipe.yaml").write_text(RECIPE)
    return folder / "recipe.yaml"


def load(recipe: Path, *overrides: str) -> tuple[LoadedRecipe, list]:
    loaded = load_recipe(recipe, overrides)
    return loaded, load_subjects(loaded)


def run_like_the_engine(loaded: LoadedRecipe, subjects: list, store: CheckpointStore,
                        fail: dict[str, set[str]] | None = None) -> Plan:
    """Plan stage by stage, 'run' what is to run (success unless listed in ``fail``), store it."""
    fail = fail or {}
    context = build_context(loaded, subjects, store)
    plans: dict = {}
    for stage in loaded.recipe.ordered_stages():
        plan = plan_stage(loaded.recipe, stage.name, subjects, plans, store, context.fingerprint(stage.name),
                          context=context)
        records = []
        for sid in plan.to_run():
            failed = sid in fail.get(stage.name, set())
            records.append(Record(stage=stage.name, key=plan.keys[sid], subject_id=sid, ok=not failed,
                                  result=None if failed else f"{stage.name}:{sid}",
                                  error="ValueError: nope" if failed else None,
                                  kind="exception" if failed else None,
                                  components=plan.components[sid], log_path=f"/logs/{stage.name}/{sid}.log"))
            plan.status[sid] = SubjectStatus.FAILED if failed else SubjectStatus.DONE
        store.put(records)
        plans[stage.name] = plan
    return Plan(plans)


__all__ = ["GROUP_SUBJECT", "load", "run_like_the_engine", "write_study"]

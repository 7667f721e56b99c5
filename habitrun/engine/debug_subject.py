"""One subject's map stages, planned and given their inputs exactly as a run would, for `habitrun debug`.

A run's keys, work folders and upstream results come from the planner and
:mod:`~habitrun.engine.stage_inputs`; so do this module's, so a subject
debugged here sees what a run would hand it, and a result stored from here
(``--store``) lands under the key the next run or plan looks for. What a run
adds around a subject (worker processes, timeouts, retries, the log capture,
a run folder) is left out: the operator runs in the caller's own process,
printing to its terminal.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from habitrun.engine.command.params import operator_params
from habitrun.engine.contract import OperatorRef, SubjectTask
from habitrun.engine.invoke import BoundOperator, bind_operator
from habitrun.engine.map_stage import MapStage
from habitrun.engine.stage_inputs import StageInputs
from habitrun.engine.stage_kinds import kind_of
from habitrun.errors import UsageError
from habitrun.planner.context import build_context
from habitrun.planner.plan import GROUP_SUBJECT, StagePlan, SubjectStatus, plan_stage
from habitrun.spec.loader import LoadedRecipe
from habitrun.spec.recipe import StageSpec
from habitrun.spec.subjects import SubjectRow
from habitrun.store.checkpoint import CheckpointStore, Record


class NoLogFolder:
    """Where a run would put the subject's log: named (a task carries the path), never created or written."""

    def __init__(self, run_root: Path) -> None:
        self.path = run_root / "debug"

    def stage_log_dir(self, stage: str) -> Path:
        return self.path / "logs" / stage

    def subject_log(self, stage: str, safe: str) -> Path:
        return self.stage_log_dir(stage) / f"{safe}.log"

    def stage_dir(self, stage: str) -> Path:
        return self.path / "stages" / stage


@dataclass
class Attempt:
    """One stage of the subject, ready to call: its plan's key and status, the task a run would build."""

    stage: StageSpec
    key: str
    status: SubjectStatus  # what `plan` says of this subject in this stage
    task: SubjectTask


class SubjectDebugger:
    """Plans the stages a subject's chosen map stages need, and runs those stages for it in this process."""

    def __init__(self, loaded: LoadedRecipe, subjects: Sequence[SubjectRow], row: SubjectRow,
                 store: CheckpointStore | None, stages: list[StageSpec]) -> None:
        self.loaded = loaded
        self.recipe = loaded.recipe
        self.row = row
        self.store = store
        self.stages = stages
        self.computed: dict[str, Any] = {}  # key -> result computed here (not necessarily stored)
        wanted = _with_needs(self.recipe.ordered_stages(), {s.name for s in stages})
        # A group stage's key covers its members: planned over every subject. Otherwise the
        # subject's keys depend on its own row only, and the subject alone is planned.
        planned_over = subjects if any(kind_of(s).one_result for s in wanted) else [row]
        context = build_context(loaded, planned_over, store, save=False)
        self.plans: dict[str, StagePlan] = {}
        for stage in wanted:
            self.plans[stage.name] = plan_stage(self.recipe, stage.name, planned_over, self.plans, store,
                                                context.stages[stage.name].fingerprint, context=context)
        self.inputs = StageInputs(rows={row.id: row}, plans=self.plans, run_root=loaded.run_root(),
                                  run=NoLogFolder(loaded.run_root()), read=self.read,
                                  one_result=lambda need: kind_of(self.recipe.stage(need)).one_result)

    def read(self, need: str, keys: list[str]) -> dict[str, Any]:
        """Upstream results: computed in this session first, else the store's."""
        out = {key: self.computed[key] for key in keys if key in self.computed}
        missing = [key for key in keys if key not in out]
        if missing and self.store is not None:
            out.update(self.store.results(missing))
        return out

    def attempt(self, stage: StageSpec) -> Attempt:
        """The stage's task for the subject; UsageError when a result it needs is neither stored nor computed here."""
        sid = self.row.id
        plan = self.plans[stage.name]
        for need in stage.needs:
            up = self.plans[need]
            one = GROUP_SUBJECT if kind_of(up).one_result else sid
            key, state = up.keys[one], up.status.get(one)
            if key not in self.computed and state is not SubjectStatus.DONE:
                raise UsageError(_missing_text(self.loaded, sid, stage.name, need, up, state))
        [task] = kind_of(stage).tasks(self.inputs, stage, plan, [sid])
        return Attempt(stage, plan.keys[sid], plan.status[sid], task)

    def bind(self, stage: StageSpec) -> BoundOperator:
        """The stage's operator, imported (and a class instantiated with its params) as a worker binds it."""
        return bind_operator(OperatorRef(stage=stage.name, path=stage.operator or "",
                                         params=operator_params(stage, self.loaded.recipe, self.loaded.root,
                                                                self.loaded.run_root()),
                                         kind=MapStage.operator_call, search_path=self.loaded.search_path))

    def call(self, bound: BoundOperator, attempt: Attempt) -> tuple[Any, float]:
        """Call the operator on the task (its exceptions propagate, untouched); the result and seconds taken."""
        started = time.perf_counter()
        result = bound(attempt.task)
        took = time.perf_counter() - started
        self.computed[attempt.key] = result
        return result, took

    def record(self, attempt: Attempt, result: Any, took: float) -> Record:
        """The store record a run's ledger would write for this success (no run folder, no log)."""
        sid = self.row.id
        return Record(stage=attempt.stage.name, key=attempt.key, subject_id=sid, ok=True, result=result,
                      error=None, kind=None, attempts=1,
                      components=self.plans[attempt.stage.name].components_json(sid),
                      run_id=None, log_path=None, duration_sec=took)


def _with_needs(ordered: list[StageSpec], names: set[str]) -> list[StageSpec]:
    """``names`` and every stage they need (transitively), in run order."""
    by_name = {s.name: s for s in ordered}
    todo, wanted = list(names), set()
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(by_name[name].needs)
    return [s for s in ordered if s.name in wanted]


def _missing_text(loaded: LoadedRecipe, sid: str, stage: str, need: str, up: StagePlan,
                  state: SubjectStatus | None) -> str:
    what = state.value if state is not None else "unknown"
    if not kind_of(up).one_result:
        first = f"habitrun debug {loaded.path} {sid} --stage {need} --store"
        return (f"stage {stage!r} needs the result of stage {need!r} for subject {sid}, which is not stored "
                f"({need}: {what}); run that stage first: `{first}` (or `habitrun run {loaded.path}`)")
    return (f"stage {stage!r} needs the result of {up.kind} stage {need!r}, which is not stored ({what}); "
            f"run it first: `habitrun run {loaded.path}`")


def stages_to_debug(loaded: LoadedRecipe, only: str | None,
                    close: Callable[[str, list[str]], list[str]]) -> list[StageSpec]:
    """The map stages to run: ``only``, or every map stage in run order; UsageError for an unknown or
    non-map stage (``close`` suggests names)."""
    recipe = loaded.recipe
    ordered = recipe.ordered_stages()
    if only is None:
        return [s for s in ordered if kind_of(s).debuggable]
    names = [s.name for s in ordered]
    if only not in names:
        near = close(only, names)
        hint = f"; did you mean {', '.join(near)}?" if near else f" (its stages: {', '.join(names)})"
        raise UsageError(f"no stage {only!r} in {loaded.path}{hint}")
    stage = recipe.stage(only)
    if not kind_of(stage).debuggable:
        raise UsageError(f"stage {only!r} is a {stage.kind} stage: `habitrun debug` runs one subject's map "
                         f"stages; run it with `habitrun run {loaded.path}`")
    return [stage]

"""What a stage's tasks are given: each subject's fields, folders and its needed stages' stored results.

A map stage gets one task per subject, with the results of the stages it
needs for that subject; a collect stage one task with every member's; a
train stage one task whose inputs go to its ranks as a file. Results are
read through ``read`` (the runner's, which recomputes an unreadable one); whether
a needed stage gives one result or one per subject is its kind's (``one_result``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from habitrun.engine.contract import SubjectTask
from habitrun.planner.plan import GROUP_SUBJECT, StagePlan
from habitrun.spec.recipe import StageSpec
from habitrun.spec.subjects import SubjectRow
from habitrun.store.runs import key_folder, work_dir

GROUP_FILE_NAME = "_stage"  # log/work folder name of a collect or train stage's single task
RESULT_BATCH = 256  # subjects whose upstream results are fetched from the store at once

ReadResults = Callable[[str, list[str]], dict[str, Any]]  # (stage, keys) -> {key: result}
OneResult = Callable[[str], bool]  # stage -> it gives one result, not one per subject (engine/stage_kinds.py)


class LogFolders(Protocol):
    """Where tasks' logs go: a run's :class:`~habitrun.store.runs.RunFolder` (or `habitrun debug`'s, never written)."""

    def stage_log_dir(self, stage: str) -> Path: ...

    def subject_log(self, stage: str, safe: str) -> Path: ...

    def stage_dir(self, stage: str) -> Path: ...


def group_workdir(run_root: Path, stage: str, key: str) -> Path:
    """The work folder of a collect or train stage's one task."""
    return work_dir(run_root, stage, GROUP_FILE_NAME, key)


class StageInputs:
    """Builds a stage's tasks from the subjects, the plans made so far and the stored results."""

    def __init__(self, *, rows: Mapping[str, SubjectRow], plans: Mapping[str, StagePlan], run_root: Path,
                 run: LogFolders, read: ReadResults, one_result: OneResult) -> None:
        self.rows = rows
        self.plans = plans
        self.run_root = run_root
        self.run = run
        self.read = read
        self.one_result = one_result

    def map_tasks(self, stage: StageSpec, plan: StagePlan, to_run: list[str]) -> list[SubjectTask]:
        """A task per subject to run, with its needed stages' results for it."""
        tasks: list[SubjectTask] = []
        # A collect or train stage needed: its one result, the same for every subject.
        shared = {need: self.need_results(need, ()) for need in stage.needs if self.one_result(need)}
        needs = [need for need in stage.needs if need not in shared]
        # Joined as strings: pathlib per subject costs more than dispatching it.
        work_root = os.path.join(work_dir(self.run_root, stage.name, ""), "")
        log_root = os.path.join(self.run.stage_log_dir(stage.name), "")
        rows, stage_keys, append = self.rows, plan.keys, tasks.append
        for start in range(0, len(to_run), RESULT_BATCH):
            chunk = to_run[start:start + RESULT_BATCH]
            upstream = {need: self._by_subject(need, chunk) for need in needs}
            for sid in chunk:
                row = rows[sid]
                safe = row.safe
                key = stage_keys[sid]
                inputs = {need: upstream[need][sid] for need in needs} if needs else {}
                if shared:
                    inputs = {need: inputs[need] if need in inputs else shared[need] for need in stage.needs}
                append(SubjectTask(key=key, subject_id=sid, fields=row.fields, inputs=inputs,
                                   workdir=f"{work_root}{safe}/{key_folder(key)}", log_path=f"{log_root}{safe}.log"))
        return tasks

    def need_results(self, need: str, members: Sequence[str]) -> Any:
        """A needed stage's stored results: {subject: result} for a map stage, the one result otherwise."""
        if not self.one_result(need):
            return self._by_subject(need, members)
        key = self.plans[need].keys[GROUP_SUBJECT]
        return self.read(need, [key]).get(key)

    def _by_subject(self, need: str, members: Sequence[str]) -> dict[str, Any]:
        """A map stage's stored results of ``members``: {subject: result}."""
        keys = {sid: self.plans[need].keys[sid] for sid in members}
        results = self.read(need, list(keys.values()))
        return {sid: results.get(key) for sid, key in keys.items()}

    def group_inputs(self, stage: StageSpec, plan: StagePlan) -> dict[str, Any]:
        """For a collect stage: subject -> result (one need) or subject -> {need: result}."""
        members = list(plan.members)
        per_need: dict[str, dict[str, Any]] = {}
        for need in stage.needs:
            results = self.need_results(need, members)
            per_need[need] = {GROUP_SUBJECT: results} if self.one_result(need) else results
        if len(stage.needs) == 1:
            return per_need[stage.needs[0]]
        return {sid: {need: per_need[need].get(sid) for need in stage.needs} for sid in members}

    def group_task(self, stage: StageSpec, plan: StagePlan) -> SubjectTask:
        """A collect stage's one task: every member's fields and needed results."""
        key = plan.keys[GROUP_SUBJECT]
        return SubjectTask(
            key=key,
            subject_id=GROUP_SUBJECT,
            fields={"subjects": {sid: self.rows[sid].fields for sid in plan.members if sid in self.rows}},
            inputs=self.group_inputs(stage, plan),
            workdir=str(group_workdir(self.run_root, stage.name, key)),
            log_path=str(self.run.subject_log(stage.name, GROUP_FILE_NAME)),
        )

    def train_task(self, stage: StageSpec, plan: StagePlan) -> SubjectTask:
        """A train stage's one task: its needed results by stage; its logs are the stage's folder."""
        key = plan.keys[GROUP_SUBJECT]
        return SubjectTask(
            key=key, subject_id=GROUP_SUBJECT, fields={},
            inputs={need: self.need_results(need, plan.members) for need in stage.needs},
            workdir=str(group_workdir(self.run_root, stage.name, key)),
            log_path=str(self.run.stage_dir(stage.name)),
        )

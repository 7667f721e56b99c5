"""Everything the report shows about one run, read without writing anything."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from habitrun.cli.htmlreport.science import Science, from_results
from habitrun.engine.stage_kinds import kind_of
from habitrun.errors import HabitrunError
from habitrun.planner.plan import GROUP_SUBJECT, SubjectStatus, plan_study
from habitrun.spec.loader import LoadedRecipe
from habitrun.spec.subjects import load_subjects
from habitrun.spec.yamlpos import load_with_positions
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.cohort import Cohort
from habitrun.store.environment import read_environment
from habitrun.store.runs import WORK, RunFolder, list_runs
from habitrun.store.trace import COL, stage_stats

MAX_FAILURES = 500  # failures listed in full; the rest are counted
LOG_TAIL_LINES = 8
LOG_TAIL_BYTES = 8192


@dataclass
class StageInfo:
    name: str
    kind: str
    counts: dict[str, int]
    timeout_sec: float | None
    memory_limit_mb: float | None


@dataclass
class ReportData:
    recipe_name: str
    run_id: str
    outcome: str
    provenance: dict[str, Any]
    stages: list[StageInfo]
    rows: list[tuple]
    stats: dict[str, dict[str, Any]]
    failures: list[dict[str, Any]] = field(default_factory=list)
    more_failures: int = 0
    cohort: Cohort | None = None  # who the run left out before it started, and why
    members: dict[str, int] = field(default_factory=dict)  # collect/train stage -> subjects it took
    refused: list[str] = field(default_factory=list)  # stages refused on a partial cohort
    science: Science | None = None  # the results themselves, params, environment, changes


def log_tail(path: str | None, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last lines of a log file (none when it is missing or unreadable)."""
    if not path:
        return []
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - LOG_TAIL_BYTES))
            data = fh.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace").splitlines()
    if size > LOG_TAIL_BYTES and text:
        text = text[1:]  # the first line read may be cut
    return text[-lines:]


def _counts_from_rows(rows: list[tuple], stage: str) -> dict[str, int]:
    last: dict[str, str] = {}
    for row in rows:
        if row[COL["stage"]] == stage:
            last[row[COL["subject"]]] = row[COL["outcome"]]
    values = list(last.values())
    return {"done": values.count("done"), "failed": values.count("failed")}


def gather(loaded: LoadedRecipe, run: RunFolder, store: CheckpointStore | None) -> ReportData:
    """Read the run's provenance and trace rows, and the failed subjects' log tails."""
    info = run.read_provenance()
    rows = store.trace(run_id=run.run_id) if store is not None else []
    summary = info.get("summary") or {}
    stage_counts = summary.get("stages") or {}
    stages = []
    for spec in loaded.recipe.ordered_stages():
        policy = loaded.recipe.stage_policy(spec.name)
        counts = stage_counts.get(spec.name) or _counts_from_rows(rows, spec.name)
        stages.append(StageInfo(spec.name, spec.kind, dict(counts), policy.subject_timeout_sec,
                                policy.worker_memory_limit_mb))
    outcome = str(info.get("outcome") or "did not finish")
    data = ReportData(loaded.recipe.name, run.run_id, outcome, info, stages, rows, stage_stats(rows))
    data.cohort = Cohort.read(run.path)
    data.members = {str(k): int(v) for k, v in (summary.get("members") or {}).items()}
    data.refused = [str(m) for m in summary.get("cohort_refused") or ()]
    data.science = gather_science(loaded, run, store)
    failed = [row for row in rows if row[COL["outcome"]] == "failed"]
    data.more_failures = max(0, len(failed) - MAX_FAILURES)
    for row in failed[:MAX_FAILURES]:
        data.failures.append({
            "stage": row[COL["stage"]], "subject": row[COL["subject"]], "attempt": row[COL["attempt"]],
            "kind": row[COL["kind"]], "error": row[COL["error"]], "log": row[COL["log"]],
            "wall_sec": row[COL["wall_sec"]], "tail": log_tail(row[COL["log"]]),
        })
    return data


def current_results(loaded: LoadedRecipe, store: CheckpointStore) -> dict[str, Any]:
    """Each stage's current results, planned as ``plan`` would: a map stage's {subject: result} of
    its done subjects, a collect or train stage's one result (when done)."""
    plan = plan_study(loaded, load_subjects(loaded), store)
    out: dict[str, Any] = {}
    for name, stage_plan in plan.stages.items():
        done = {sid: key for sid, key in stage_plan.keys.items() if stage_plan.status.get(sid) is SubjectStatus.DONE}
        stored = store.results(list(done.values())) if done else {}
        if kind_of(stage_plan).one_result:
            key = done.get(GROUP_SUBJECT)
            if key is not None and key in stored:
                out[name] = stored[key]
        else:
            out[name] = {sid: stored[key] for sid, key in done.items() if key in stored}
    return out


def gather_science(loaded: LoadedRecipe, run: RunFolder, store: CheckpointStore | None) -> Science:
    """The results (as the recipe selects them now), the run's params and overrides, its environment
    lock and what changed since the run before it. A part that cannot be read says why, never fails
    the report."""
    stages = [(s.name, not kind_of(s).one_result) for s in loaded.recipe.ordered_stages()]
    science = Science()
    if store is not None:
        try:
            science = from_results(stages, current_results(loaded, store), loaded.run_root() / WORK)
        except HabitrunError as exc:
            science.note = f"the results could not be read: {exc.message.splitlines()[0]}"
    else:
        science.note = "no checkpoint store: no result to show"
    science.params = run_params(run, loaded)
    info = run.read_provenance()
    science.overrides = [str(o) for o in info.get("overrides") or ()]
    science.environment = read_environment(run.path)
    runs = list_runs(loaded.run_root())  # oldest first (two runs may share a second: ids do not order them)
    ids = [r.run_id for r in runs]
    earlier = runs[:ids.index(run.run_id)] if run.run_id in ids else []
    if earlier:
        from habitrun.cli.diff import (
            words,  # a command module: imported only when a report needs it
        )
        from habitrun.store.rundiff import diff_runs

        science.previous_run = earlier[-1].run_id
        science.changes = words(diff_runs(earlier[-1], run))
    return science


def run_params(run: RunFolder, loaded: LoadedRecipe) -> dict[str, dict[str, Any]]:
    """Each stage's params as the run resolved them (its stored recipe, overrides applied); the
    recipe's when the run folder's copy cannot be read."""
    try:
        data, _ = load_with_positions(run.recipe_file.read_text(encoding="utf-8"), str(run.recipe_file))
        return {str(s["name"]): dict(s.get("params") or {}) for s in data["stages"]}
    except (OSError, HabitrunError, KeyError, TypeError, AttributeError):
        return {s.name: dict(s.params) for s in loaded.recipe.ordered_stages()}

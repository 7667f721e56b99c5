"""Running a study: stage by stage, every outcome stored the moment it arrives.

The runner owns what is the same whatever backend runs the subjects: the
lock, the run folder and its provenance, planning each stage just before it
runs, retry rounds, fail-fast, skipping subjects whose upstream failed,
events, and the final outcome and exit code.
"""

from __future__ import annotations

import errno
import getpass
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from habitrun.engine.backend import FailureKind, OperatorRef, SubjectOutcome, SubjectTask
from habitrun.engine.backends import BackendPool
from habitrun.engine.control import StopFlag
from habitrun.engine.recorder import Recorder
from habitrun.engine.selection import stages_for, unknown_ids
from habitrun.engine.signals import exit_code_for, signal_name, stop_on_signals
from habitrun.engine.stopnotice import StopNotices
from habitrun.engine.tracing import done_event, failed_event, trace_row
from habitrun.errors import (
    EXIT_FAILED_SUBJECTS,
    EXIT_OK,
    StoreError,
    StoreWriteError,
    WorkerStartError,
)
from habitrun.planner.context import build_context
from habitrun.planner.plan import GROUP_SUBJECT, StagePlan, SubjectStatus, plan_stage
from habitrun.spec.discover import write_table
from habitrun.spec.gcpause import gc_paused
from habitrun.spec.loader import LoadedRecipe
from habitrun.spec.recipe import StageSpec
from habitrun.spec.subjects import SubjectRow, load_subjects
from habitrun.store.checkpoint import CheckpointStore, Record, UnreadableResults
from habitrun.store.folders import ensure_folder
from habitrun.store.guard import empty_store_file
from habitrun.store.lock import StoreLock
from habitrun.store.provenance import collect_provenance
from habitrun.store.runs import RunFolder, key_folder, work_dir

Observer = Callable[[dict[str, Any]], None]
GROUP_FILE_NAME = "_stage"  # log/work folder name of a collect or train stage's single task
RESULT_BATCH = 256  # subjects whose upstream results are fetched from the store at once
SUBJECTS_TABLE = "subjects.csv"  # the run folder's copy of the subjects found on disk


@dataclass
class FailureLine:
    """One failed subject, as `run` and `status` print it."""

    stage: str
    subject_id: str
    error: str
    kind: str | None
    log_path: str | None
    recorded: bool = False  # stored by an earlier run and not retried in this one


@dataclass
class StageCounts:
    """What happened to a stage's subjects in this run."""

    total: int = 0
    done: int = 0
    cached: int = 0
    failed: int = 0
    skipped: int = 0
    not_run: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class RunSummary:
    """The result of `run`/`resume`: outcome, exit code, counts and failures."""

    run: RunFolder | None  # None: nothing to run, and no run folder was asked for
    outcome: str  # success | failed | interrupted
    exit_code: int
    stages: dict[str, StageCounts] = field(default_factory=dict)
    failures: list[FailureLine] = field(default_factory=list)
    stop_reason: str | None = None
    warnings: list[str] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)  # group stages' results (e.g. train metrics)
    outputs: dict[str, str] = field(default_factory=dict)  # group stage -> its work folder
    noop: bool = False  # every selected stage was already stored: nothing ran

    @property
    def recorded_failures(self) -> list[FailureLine]:
        """Failures stored by an earlier run that this run did not retry."""
        return [f for f in self.failures if f.recorded]


def lock_path_for(store_dir: Path) -> Path:
    """The lock sits beside the store, so it works even when the store path is unusable."""
    return store_dir.parent / f"{store_dir.name}.lock"


def run_study(
    loaded: LoadedRecipe,
    *,
    argv: Sequence[str] = (),
    observer: Observer | None = None,
    stop: StopFlag | None = None,
    resumed_from: RunFolder | None = None,
    source_path: Path | None = None,
    install_signal_handlers: bool = True,
    preflight: Callable[[], None] | None = None,
    only_stage: str | None = None,
    record_noop: bool = False,
    rerun: Sequence[str] = (),
) -> RunSummary:
    """Run (or resume) a study to the end, or until stopped; never raises for a subject's failure.

    ``preflight`` (the operator check the CLI started in a child process) is
    waited for as late as possible: after planning, before the run folder is
    written, so a bad operator stops the run before any subject and with no
    run folder. A run with nothing to do does not wait for it: no operator
    will be imported, and each one's code and params are part of the keys
    that were found stored.
    ``only_stage`` runs that stage and the stages it needs (transitively).
    A run that finds nothing to do writes no run folder unless ``record_noop``.
    """
    subjects = load_subjects(loaded)
    selected = stages_for(loaded, only_stage)
    unknown_ids(subjects, rerun)
    stop = stop or StopFlag()
    store_dir = loaded.store_dir()
    ensure_folder(loaded.run_root())
    ensure_folder(store_dir.parent)
    with StoreLock(lock_path_for(store_dir)):
        empty = empty_store_file(store_dir)
        store = CheckpointStore.open(store_dir)
        store.set_roots(loaded.run_root(), loaded.root)
        store.verify_rows = True  # a run plans each stage with every stored result checked
        try:
            runner = _StudyRunner(loaded, subjects, store, stop, list(argv), observer, resumed_from,
                                  source_path or loaded.path)
            if empty:
                runner.warnings.append(empty)
            if store.damage is not None:
                runner.warnings.append(store.damage.summary(store_dir))
            runner.selected = selected
            runner.rerun_ids = frozenset(rerun)
            if not runner.prepare() and not record_noop:
                return runner.noop_summary()  # nothing will import an operator: no need to wait for the check
            runner.warm_backend()  # the workers' fork server boots while the check and the run folder finish
            if preflight is not None:
                try:
                    preflight()  # before the run folder, and before the signal handlers: Ctrl-C here interrupts
                except BaseException:
                    runner.backends.close()
                    raise
            if install_signal_handlers:
                with stop_on_signals(stop):
                    return runner.run()
            return runner.run()
        finally:
            store.close()


class _StudyRunner:
    def __init__(
        self,
        loaded: LoadedRecipe,
        subjects: list[SubjectRow],
        store: CheckpointStore,
        stop: StopFlag,
        argv: list[str],
        observer: Observer | None,
        resumed_from: RunFolder | None,
        source_path: Path,
    ) -> None:
        self.source_path = source_path
        self.loaded = loaded
        self.recipe = loaded.recipe
        self.subjects = subjects
        self.rows = {row.id: row for row in subjects}
        self.store = store
        self.stop = stop
        self.argv = argv
        self.observer = observer
        self.resumed_from = resumed_from
        self.run_root = loaded.run_root()
        self.backends = BackendPool(self.run_root)
        self.plans: dict[str, StagePlan] = {}
        self.counts: dict[str, StageCounts] = {}
        self.failures: list[FailureLine] = []
        self.group_results: dict[str, Any] = {}
        self.warnings: list[str] = []
        self.chain: set[str] = set()
        self.finished: dict[str, set[str]] = {}  # stage -> subjects with an outcome in this run
        self.retried: dict[str, set[str]] = {}  # stage -> subjects that succeeded after a failed attempt
        self.emit_lock = threading.Lock()  # events come from the runner and the recorder thread
        self.selected: list[StageSpec] = loaded.recipe.ordered_stages()
        self.rerun_ids: frozenset[str] = frozenset()  # --rerun of this command: rerun even within a resume chain
        self.current_stage: StageSpec | None = None
        self.current_backend: Any = None
        self.recomputing: set[str] = set()  # stages recomputing unreadable stored results
        self.write_failure: tuple[Path, BaseException] | None = None  # the first folder that refused a write

    # ------------------------------------------------------------------ events
    def emit(self, event: dict[str, Any]) -> None:
        self.emit_many([event])

    def emit_many(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        with self.emit_lock:
            if self.write_failure is None:
                try:
                    self.run.events.write_many(events)
                except OSError as exc:  # a full disk under the run folder: stop, as for the store
                    self.cannot_write(self.run.path, exc)
            if self.observer is not None:
                for event in events:
                    self.observer(event)

    # ------------------------------------------------------------------ run
    def write_found_subjects(self) -> None:
        """Subjects found on disk: the table this run used goes into its folder."""
        report = getattr(self.subjects, "discovery", None)
        if report is None:
            return
        try:
            write_table(self.run.path / SUBJECTS_TABLE, report.columns,
                        [(row.id, row.fields) for row in self.subjects])
        except OSError as exc:
            raise StoreError(f"cannot write {self.run.path / SUBJECTS_TABLE}: {exc}") from None

    def prepare(self) -> bool:
        """Check the store's recipe and plan ahead; False when there is nothing to run."""
        # Input files and code first: a missing input file stops the run before it starts (exit 2).
        self.key_context = build_context(self.loaded, self.subjects, self.store)
        warning = self.store.check_recipe(
            self.recipe.name, self.loaded.sha256, strict=self.recipe.policy.strict_checkpoint_hash
        )
        if warning:
            self.warnings.append(warning)
        report = getattr(self.subjects, "discovery", None)
        if report is not None and report.incomplete:  # said on a no-op run too
            self.warnings.append(f"subjects found by {report.source}: {report.incomplete_text()}")
        self.fingerprints = {name: info.fingerprint for name, info in self.key_context.stages.items()}
        if self.resumed_from is not None:
            previous = self.resumed_from.read_provenance()
            self.chain = set(previous.get("run_chain", [])) | {self.resumed_from.run_id}
        return self.plan_ahead()

    def warm_backend(self) -> None:
        """Start the first map or collect stage's backend booting its workers (see Backend.warm)."""
        first = next((s for s in self.selected if s.kind != "train"), None)
        if first is not None:
            self.backends.warm(self.recipe.stage_policy(first.name))

    def run(self) -> RunSummary:
        provenance = collect_provenance(
            recipe_path=self.source_path,
            recipe_sha256=self.loaded.sha256,
            argv=self.argv,
            operator_modules=_operator_modules(self.recipe.stages),
            backend={"backend": self.recipe.policy.backend, "workers": self.recipe.policy.workers},
        )
        provenance.update({
            "recipe_name": self.recipe.name,
            "subjects": len(self.subjects),
            "resumed_from": self.resumed_from.run_id if self.resumed_from else None,
            "run_chain": sorted(self.chain),
            "overrides": list(self.loaded.overrides),
            "outcome": "running",
        })
        # Provenance goes in with the folder: a run folder without it never becomes visible.
        self.run = RunFolder.create(
            self.run_root,
            resolved_yaml=self.loaded.resolved_yaml(),
            recipe_path=self.source_path,
            argv=self.argv,
            provenance=provenance,
        )
        provenance["run_id"] = self.run.run_id
        self.write_found_subjects()
        for warning in self.warnings:
            self.emit({"event": "warning", "message": warning})
        self.emit({"event": "run_started", "run_id": self.run.run_id, "recipe": str(self.loaded.path),
                   "subjects": len(self.subjects), "stages": [s.name for s in self.selected],
                   "user": _user(), "resumed_from": provenance["resumed_from"]})
        started = time.monotonic()
        self.recorder = Recorder(self.store, self.emit_many,
                                 on_failure=lambda exc: self.cannot_write(self.store.directory, exc))
        notices = StopNotices(self.stop, self.emit, self.stopping_facts)
        error: WorkerStartError | None = None
        try:
            for stage in self.selected:
                if self.stop.is_set():
                    break
                self.run_stage(stage)
        except WorkerStartError as exc:  # run-level: recorded as the run's end, then reported (exit 2)
            error = exc
        finally:
            hard = self.stop.hard
            try:
                self.recorder.close()
            finally:
                self.backends.close(graceful=not hard)
        notices.close()
        if self.write_failure is not None:
            self.end_unwritable(started)
        outcome, exit_code = ("error", error.exit_code) if error else self.outcome()
        if outcome == "success":
            self.clear_on_success()
        summary = {
            "stages": {name: c.as_dict() for name, c in self.counts.items()},
            "failed_subjects": len(self.failures),
            "stop_reason": error.message if error else self.stop.reason,
            "duration_sec": round(time.monotonic() - started, 3),
            "backends": self.backends.described,
        }
        self.emit({"event": "run_finished", "outcome": outcome, "exit_code": exit_code, **summary})
        try:
            self.run.finish(outcome, summary)
            self.run.events.close()
        except OSError as exc:  # the disk filled at the very end
            self.cannot_write(self.run.path, exc)
        if self.write_failure is not None:
            self.end_unwritable(started)
        if error is not None:
            raise error
        return RunSummary(self.run, outcome, exit_code, self.counts, self.failures, self.stop.reason,
                          self.warnings, self.group_results, self.outputs())

    def stopping_facts(self) -> dict[str, Any]:
        stage = self.current_stage
        backend = self.current_backend
        facts: dict[str, Any] = {"signal": signal_name(self.stop.signum), "stage": stage.name if stage else None,
                                 "kind": stage.kind if stage else None, "running": None, "grace_sec": 0.0,
                                 "backend": backend.name if backend is not None else None}
        if stage is not None:
            policy = self.recipe.stage_policy(stage.name)
            facts["grace_sec"] = policy.graceful_shutdown_sec
            if stage.kind == "train":
                facts["running"] = stage.launch.nproc_per_node if stage.launch else 1
            elif backend is not None:
                facts["running"] = backend.running()
        return facts

    def plan_stage(self, stage: StageSpec) -> StagePlan:
        """Plan one stage (and keep the plan); results stored under the key an older habitrun
        gave the same inputs move to today's key here, so what runs after reads them."""
        plan = plan_stage(self.recipe, stage.name, self.subjects, self.plans, self.store,
                          self.fingerprints[stage.name], context=self.key_context)
        if plan.adopted:
            self.store.adopt([(old, plan.keys[sid], plan.components_json(sid)) for sid, old in plan.adopted.items()])
            plan.adopted.clear()
        self.plans[stage.name] = plan
        return plan

    def plan_ahead(self) -> bool:
        """Plan stages in order until one has work; False when none has (a no-op run).

        A stage is planned from the plans of the stages before it. As long as
        those have nothing to run their statuses cannot change, so the plans
        made here are the ones run_stage would make, and it reuses them.
        """
        for stage in self.selected:
            plan = self.plan_stage(stage)
            if self.really_to_run(plan):
                return True
        return False

    def noop_summary(self) -> RunSummary:
        """Nothing to run: the counts and the recorded failures, without a run folder."""
        for stage in self.selected:
            plan = self.plans[stage.name]
            counts = StageCounts(total=len(plan.keys))
            self.counts[stage.name] = counts
            counts.cached = sum(1 for st in plan.status.values() if st == SubjectStatus.DONE)
            counts.skipped = sum(1 for st in plan.status.values() if st == SubjectStatus.BLOCKED)
            counts.failed = len(self.recorded_failures(stage.name, plan, set()))
        outcome, exit_code = self.outcome()
        return RunSummary(None, outcome, exit_code, self.counts, self.failures, None, self.warnings,
                          self.stored_group_results(), self.outputs(), noop=True)

    def stored_group_results(self) -> dict[str, Any]:
        out = {}
        for stage in self.selected:
            plan = self.plans.get(stage.name)
            if stage.kind != "map" and plan is not None and plan.status.get(GROUP_SUBJECT) == SubjectStatus.DONE:
                key = plan.keys[GROUP_SUBJECT]
                out[stage.name] = self.store.results([key]).get(key)
        return out

    def outputs(self) -> dict[str, str]:
        """Each collect/train stage that is done -> the work folder its files are in."""
        return {stage.name: str(work_dir(self.run_root, stage.name, GROUP_FILE_NAME,
                                         self.plans[stage.name].keys[GROUP_SUBJECT]))
                for stage in self.selected
                if stage.kind != "map" and stage.name in self.plans
                and self.plans[stage.name].status.get(GROUP_SUBJECT) == SubjectStatus.DONE}

    def recorded_failures(self, stage: str, plan: StagePlan, to_run: set[str]) -> list[FailureLine]:
        """Failures an earlier run stored that this run does not retry; added to ``self.failures``."""
        old = [sid for sid, st in plan.status.items() if st == SubjectStatus.FAILED and sid not in to_run]
        if not old:
            return []
        states = self.store.states(plan.keys[sid] for sid in old)
        lines = []
        for sid in old:
            state = states.get(plan.keys[sid])
            lines.append(FailureLine(stage, sid, state.error or "failed" if state else "?",
                                     state.kind if state else None, state.log_path if state else None,
                                     recorded=True))
        self.failures.extend(lines)
        return lines

    # ------------------------------------------------------------------ a folder that cannot be written
    def cannot_write(self, folder: Path, exc: BaseException) -> None:
        """A commit or an event could not be written (a full disk): stop now, keep what is stored.

        Called from the recorder thread or the runner; only the first failure counts. Nothing
        more can be stored, so running subjects are stopped rather than waited for.
        """
        if self.write_failure is None:
            self.write_failure = (Path(folder), exc)
            self.stop.set(f"cannot write {folder}: {_reason(exc)}", hard=True)

    def end_unwritable(self, started: float) -> None:
        """Record what can still be recorded, then raise the run-level error (exit 2)."""
        folder, exc = self.write_failure  # type: ignore[misc]
        stored = self.recorder.stored
        summary = {"stages": {name: c.as_dict() for name, c in self.counts.items()},
                   "stop_reason": self.stop.reason, "stored_this_run": stored,
                   "duration_sec": round(time.monotonic() - started, 3)}
        for attempt in (lambda: self.run.finish("interrupted", summary), self.run.events.close):
            try:
                attempt()
            except OSError:
                pass  # the same full disk: the store is the record that matters
        what = "the checkpoint store" if folder == self.store.directory else "the run folder"
        raise StoreWriteError(
            f"cannot write {what} at {folder}: {_reason(exc)}. The run stopped at the first write that "
            f"failed; {stored} result(s) of this run were stored before it and stay readable. "
            "Free space there (or set run_dir / policy.checkpoint_dir to another disk), then continue with:",
            folder=folder,
        )

    def outcome(self) -> tuple[str, int]:
        if self.stop.is_set() and not (self.stop.reason or "").startswith("fail_fast"):
            return "interrupted", exit_code_for(self.stop.signum)
        if self.failures or any(c.skipped or c.failed or c.not_run for c in self.counts.values()):
            return "failed", EXIT_FAILED_SUBJECTS
        return "success", EXIT_OK

    def clear_on_success(self) -> None:
        """``clear_checkpoint_on_success``: called only when the run's outcome is success.

        The rule: a stage's records are cleared when every subject of the run ends up
        succeeding, retry rounds included. A failure that a retry round fixed leaves
        nothing to resume, so it does not keep the store; its attempt stays in the run's
        events and logs (HABIT instead keeps the store whenever any attempt failed).
        """
        for stage in self.recipe.stages:
            if self.recipe.stage_policy(stage.name).clear_checkpoint_on_success:
                plan = self.plans.get(stage.name)
                if plan is not None:
                    removed = self.store.discard(plan.keys.values())
                    self.emit({"event": "checkpoint_cleared", "stage": stage.name, "records": removed,
                               "retried": len(self.retried.get(stage.name, ()))})

    # ------------------------------------------------------------------ stages
    def run_stage(self, stage: StageSpec) -> None:
        self.current_stage, self.current_backend = stage, None
        policy = self.recipe.stage_policy(stage.name)
        plan = self.plans.get(stage.name)  # planned ahead while looking for work
        if plan is None:
            plan = self.plan_stage(stage)
        to_run = self.really_to_run(plan)
        counts = StageCounts(total=len(plan.keys))
        self.counts[stage.name] = counts
        blocked = [sid for sid, st in plan.status.items() if st == SubjectStatus.BLOCKED]
        to_run_set = set(to_run)
        counts.cached = sum(1 for sid, st in plan.status.items()
                            if st == SubjectStatus.DONE and sid not in to_run_set)
        # Failures recorded by an earlier run and not retried count as failed in this run too.
        old_failures = [sid for sid, st in plan.status.items()
                        if st == SubjectStatus.FAILED and sid not in to_run_set]
        self.emit({"event": "stage_started", "stage": stage.name, "kind": stage.kind,
                   "total": counts.total, "cached": counts.cached, "to_run": len(to_run),
                   "blocked": len(blocked), "recorded_failures": len(old_failures)})
        counts.failed += len(self.recorded_failures(stage.name, plan, to_run_set))
        if blocked:
            counts.skipped = len(blocked)
            self.emit_many([{"event": "subject_skipped", "stage": stage.name, "subject": sid,
                             "reason": "skipped: upstream failed"} for sid in blocked])
        if to_run and not self.stop.is_set():
            if stage.kind == "train":
                self.run_train(stage, plan, policy, counts)
            else:
                self.run_with_backend(stage, plan, policy, to_run, counts)
        counts.not_run = len(to_run) - len(self.finished.get(stage.name, ()))
        if self.recorder.error is not None:
            # Recording stopped (a full disk): count what is stored, not what was handed to it.
            ok, bad = self.recorder.stored_by_stage.get(stage.name, (0, 0))
            counts.done, counts.failed, counts.not_run = ok, len(old_failures) + bad, len(to_run) - ok - bad
        self.emit({"event": "stage_finished", "stage": stage.name, **counts.as_dict()})
        if stage.kind != "map" and plan.status.get(GROUP_SUBJECT) == SubjectStatus.DONE:
            key = plan.keys[GROUP_SUBJECT]
            self.group_results[stage.name] = self.read_results(stage.name, [key]).get(key)

    def really_to_run(self, plan: StagePlan) -> list[str]:
        """The plan's work, minus what an interrupted run in this resume chain already finished."""
        to_run = plan.to_run()
        if not self.chain or not to_run:
            return to_run
        states = self.store.states(plan.keys[sid] for sid in to_run)
        keep = []
        for sid in to_run:
            state = states.get(plan.keys[sid])
            if state is not None and state.ok and state.run_id in self.chain and not (
                    sid in self.rerun_ids and plan.status[sid] is SubjectStatus.FORCED):  # --rerun asks again
                plan.status[sid] = SubjectStatus.DONE
                continue
            keep.append(sid)
        return keep

    # ------------------------------------------------------------------ map and collect
    def run_with_backend(self, stage: StageSpec, plan: StagePlan, policy: Any, to_run: list[str],
                         counts: StageCounts) -> None:
        op = OperatorRef(stage=stage.name, path=stage.operator or "", params=dict(stage.params),
                         kind="collect" if stage.kind == "collect" else "map",
                         search_path=self.loaded.search_path)
        backend = self.current_backend = self.backends.for_policy(policy)
        backend.scratch_dir = str(self.run.path / "scratch")  # subject output never leaves the run folder
        with gc_paused():  # tens of thousands of tasks, no cycles: the collector would only walk them
            tasks = self.build_tasks(stage, plan, to_run)
        rounds = policy.auto_retry_rounds
        fail_fast = policy.on_subject_failure == "fail_fast"

        finished = self.finished.setdefault(stage.name, set())
        run_id = self.run.run_id
        queued_at = time.time()  # when the current round's tasks were handed to the backend

        def report(outcomes: list[SubjectOutcome]) -> None:
            records: list[Record] = []
            events: list[dict[str, Any]] = []
            trace: list[tuple] = []
            now = time.time()
            for outcome in outcomes:
                task = outcome.task
                sid = task.subject_id
                if outcome.ok:
                    plan.status[sid] = SubjectStatus.DONE
                    counts.done += 1
                    finished.add(sid)
                    if task.attempt > 1:
                        self.retried.setdefault(stage.name, set()).add(sid)
                    records.append(self.record(stage.name, plan, task, outcome))
                    row = trace_row(run_id, stage.name, outcome, "done", queued_at, now)
                    trace.append(row)
                    events.append(done_event(stage.name, row))
                    continue
                if outcome.kind == FailureKind.DISK_FULL:  # the machine's fault: stop, record nothing
                    events.append({"event": "subject_failed", "stage": stage.name, "subject": sid,
                                   "attempt": task.attempt, "kind": outcome.kind, "error": outcome.error,
                                   "final": False, "log": task.log_path, "pid": outcome.worker_pid})
                    self.cannot_write(self.run.path, OSError(errno.ENOSPC, (
                        f"No space left on device (subject {sid} of stage {stage.name}: {outcome.error})")))
                    continue
                # Once a stop is asked for, a failure with attempts left is not run (a resume
                # runs it), never a recorded failure: its last chance was taken by the stop.
                final = task.attempt > rounds or fail_fast or not policy.retries(outcome.kind)
                row = trace_row(run_id, stage.name, outcome, "failed" if final else "retried", queued_at, now)
                trace.append(row)
                events.append(failed_event(stage.name, row, final))
                if final:
                    plan.status[sid] = SubjectStatus.FAILED
                    counts.failed += 1
                    finished.add(sid)
                    records.append(self.record(stage.name, plan, task, outcome))
                    self.failures.append(FailureLine(stage.name, sid, outcome.error or "failed",
                                                     outcome.kind, task.log_path))
                    if fail_fast and not self.stop.is_set():
                        self.stop.set(f"fail_fast: subject {sid} failed in stage {stage.name!r}: {outcome.error}")
                else:
                    retry.append(replace(task, attempt=task.attempt + 1))
            self.recorder.submit(records, events, trace)  # stored first, then reported

        pending = tasks
        while pending and not self.stop.is_set():
            retry: list[SubjectTask] = []
            queued_at = time.time()
            backend.run_tasks(op, pending, report, self.stop)
            self.recorder.flush()
            self.apply_unstorable(plan, counts)
            if retry and not self.stop.is_set():
                self.emit({"event": "retry_round", "stage": stage.name, "subjects": len(retry),
                           "attempt": retry[0].attempt})
            pending = retry

    def apply_unstorable(self, plan: StagePlan, counts: StageCounts) -> None:
        """Successes whose result the store refused were recorded as failures: count them so."""
        while self.recorder.converted:
            record = self.recorder.converted.pop()
            plan.status[record.subject_id] = SubjectStatus.FAILED
            counts.done -= 1
            counts.failed += 1
            self.failures.append(FailureLine(record.stage, record.subject_id, record.error or "", record.kind,
                                             record.log_path))

    def build_tasks(self, stage: StageSpec, plan: StagePlan, to_run: list[str]) -> list[SubjectTask]:
        if stage.kind == "collect":
            return [self.group_task(stage, plan)]
        tasks: list[SubjectTask] = []
        needs = list(stage.needs)
        # Joined as strings: pathlib per subject costs more than dispatching it.
        work_root = os.path.join(work_dir(self.run_root, stage.name, ""), "")
        log_root = os.path.join(self.run.stage_log_dir(stage.name), "")
        rows, stage_keys, append = self.rows, plan.keys, tasks.append
        for start in range(0, len(to_run), RESULT_BATCH):
            chunk = to_run[start:start + RESULT_BATCH]
            upstream: dict[str, dict[str, Any]] = {}
            for need in needs:
                keys = {sid: self.plans[need].keys[sid] for sid in chunk}
                results = self.read_results(need, list(keys.values()))
                upstream[need] = {sid: results.get(key) for sid, key in keys.items()}
            for sid in chunk:
                row = rows[sid]
                safe = row.safe
                # positional, in SubjectTask's field order: key, subject, fields, inputs, workdir, log
                key = stage_keys[sid]
                append(SubjectTask(key, sid, row.fields,
                                   {need: upstream[need][sid] for need in needs} if needs else {},
                                   f"{work_root}{safe}/{key_folder(key)}", f"{log_root}{safe}.log"))
        return tasks

    def need_results(self, need: str, members: Sequence[str]) -> Any:
        """A needed stage's stored results: {subject: result} for a map stage, the one result otherwise."""
        need_plan = self.plans[need]
        if need_plan.kind == "map":
            keys = {sid: need_plan.keys[sid] for sid in members}
            results = self.read_results(need, list(keys.values()))
            return {sid: results.get(key) for sid, key in keys.items()}
        key = need_plan.keys[GROUP_SUBJECT]
        return self.read_results(need, [key]).get(key)

    def read_results(self, need: str, keys: list[str]) -> dict[str, Any]:
        """Stored results of a stage that ran (or was cached) in this run, checksums verified.

        A result that fails its check is never passed on: its subjects are recomputed in
        their own stage first (once), then read again.
        """
        try:
            return self.store.results(keys)
        except UnreadableResults as exc:
            self.recompute(need, exc)
            return self.store.results(keys)

    def recompute(self, name: str, exc: UnreadableResults) -> None:
        plan = self.plans.get(name)
        sids = [sid for stage, sid, _key, _why in exc.bad if stage == name and plan is not None and sid in plan.status]
        if plan is None or not sids or name in self.recomputing:
            raise exc
        self.recomputing.add(name)
        try:
            why = exc.bad[0][3]
            message = (f"stage {name!r}: the stored result of {len(sids)} subject(s) is unreadable ({why}): "
                       f"{', '.join(sids[:5])}{' ...' if len(sids) > 5 else ''}; recomputing")
            self.warnings.append(message)
            self.emit({"event": "warning", "message": message})
            for sid in sids:
                plan.status[sid] = SubjectStatus.STALE
                plan.reasons[sid] = [f"stored result unreadable: {why}"]
            stage = self.recipe.stage(name)
            counts = self.counts.setdefault(name, StageCounts(total=len(plan.keys)))
            counts.cached = max(0, counts.cached - len(sids))
            policy = self.recipe.stage_policy(name)
            if stage.kind == "train":
                self.run_train(stage, plan, policy, counts)
            else:
                self.run_with_backend(stage, plan, policy, sids, counts)
            still = [sid for sid in sids if plan.status.get(sid) is not SubjectStatus.DONE]
            if still:
                raise StoreError(f"stage {name!r}: the unreadable stored result of {', '.join(still[:5])} "
                                 "could not be recomputed (see the failures above); the run stops here")
        finally:
            self.recomputing.discard(name)

    def group_inputs(self, stage: StageSpec, plan: StagePlan) -> dict[str, Any]:
        """For a collect stage: subject -> result (one need) or subject -> {need: result}."""
        members = list(plan.members)
        per_need: dict[str, dict[str, Any]] = {}
        for need in stage.needs:
            results = self.need_results(need, members)
            per_need[need] = results if self.plans[need].kind == "map" else {GROUP_SUBJECT: results}
        if len(stage.needs) == 1:
            return per_need[stage.needs[0]]
        return {sid: {need: per_need[need].get(sid) for need in stage.needs} for sid in members}

    def group_task(self, stage: StageSpec, plan: StagePlan) -> SubjectTask:
        return SubjectTask(
            key=plan.keys[GROUP_SUBJECT],
            subject_id=GROUP_SUBJECT,
            fields={"subjects": {sid: self.rows[sid].fields for sid in plan.members if sid in self.rows}},
            inputs=self.group_inputs(stage, plan),
            workdir=str(work_dir(self.run_root, stage.name, GROUP_FILE_NAME, plan.keys[GROUP_SUBJECT])),
            log_path=str(self.run.subject_log(stage.name, GROUP_FILE_NAME)),
        )

    def record(self, stage: str, plan: StagePlan, task: SubjectTask, outcome: SubjectOutcome) -> Record:
        ok = outcome.ok
        return Record(
            stage=stage, key=task.key, subject_id=task.subject_id, ok=ok,
            result=outcome.result if ok else None, error=None if ok else outcome.error,
            kind=None if ok else outcome.kind, attempts=task.attempt,
            components=plan.components_json(task.subject_id), run_id=self.run.run_id, log_path=task.log_path,
            duration_sec=outcome.duration_sec,
        )

    # ------------------------------------------------------------------ train
    def run_train(self, stage: StageSpec, plan: StagePlan, policy: Any, counts: StageCounts) -> None:
        from habitrun.engine.train import run_train_stage

        inputs = {need: self.need_results(need, plan.members) for need in stage.needs}
        task = SubjectTask(
            key=plan.keys[GROUP_SUBJECT], subject_id=GROUP_SUBJECT, fields={}, inputs=inputs,
            workdir=str(work_dir(self.run_root, stage.name, GROUP_FILE_NAME, plan.keys[GROUP_SUBJECT])),
            log_path=str(self.run.stage_dir(stage.name)),
        )
        Path(task.workdir).mkdir(parents=True, exist_ok=True)
        self.emit({"event": "train_started", "stage": stage.name,
                   "nproc_per_node": stage.launch.nproc_per_node if stage.launch else 1,
                   "nnodes": stage.launch.nnodes if stage.launch else 1})
        result = run_train_stage(
            stage, policy, stage_dir=self.run.stage_dir(stage.name), workdir=Path(task.workdir),
            inputs=inputs, search_path=self.loaded.search_path, run_id=self.run.run_id,
            stop=self.stop, console=self.console_line,
        )
        outcome = SubjectOutcome(task, result.ok, result=result.result, error=result.error,
                                 kind=None if result.ok else (FailureKind.INTERRUPTED if self.stop.is_set() else FailureKind.EXCEPTION),
                                 traceback=result.traceback, duration_sec=result.duration_sec)
        task.attempt = max(1, result.attempts)
        task.log_path = result.log_dir
        # The launcher's ranks are measured by neither side: the row keeps wall times only.
        row = trace_row(self.run.run_id, stage.name, outcome, "done" if result.ok else "failed", None, time.time())
        if result.ok:
            plan.status[GROUP_SUBJECT] = SubjectStatus.DONE
            counts.done += 1
            self.finished.setdefault(stage.name, set()).add(GROUP_SUBJECT)
            self.recorder.submit([self.record(stage.name, plan, task, outcome)],
                                 [{"event": "subject_done", "stage": stage.name, "subject": GROUP_SUBJECT,
                                   "attempt": task.attempt, "duration_sec": round(result.duration_sec, 3)}],
                                 [row])
            self.recorder.flush()
            self.apply_unstorable(plan, counts)
        elif not self.stop.is_set():
            plan.status[GROUP_SUBJECT] = SubjectStatus.FAILED
            counts.failed += 1
            self.finished.setdefault(stage.name, set()).add(GROUP_SUBJECT)
            self.failures.append(FailureLine(stage.name, GROUP_SUBJECT, result.error or "failed",
                                             outcome.kind, result.log_dir))
            self.recorder.submit([self.record(stage.name, plan, task, outcome)],
                                 [{"event": "subject_failed", "stage": stage.name, "subject": GROUP_SUBJECT,
                                   "attempt": task.attempt, "kind": outcome.kind, "error": result.error,
                                   "final": True, "log": result.log_dir}], [row])
            self.recorder.flush()
            if policy.on_subject_failure == "fail_fast":
                self.stop.set(f"fail_fast: train stage {stage.name!r} failed: {result.error}")

    def console_line(self, line: str) -> None:
        if self.observer is not None:
            self.observer({"event": "console", "line": line})


def _operator_modules(stages: Sequence[StageSpec]) -> list[str]:
    modules = []
    for stage in stages:
        path = stage.operator or stage.entrypoint
        if path:
            modules.append(path.partition(":")[0] if ":" in path else path.rpartition(".")[0])
    return modules


def _reason(exc: BaseException) -> str:
    """An OSError as "No space left on device (errno 28)"; anything else as its type and text."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} (errno {exc.errno})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return str(os.getuid())

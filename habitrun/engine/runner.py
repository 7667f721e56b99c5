"""Running a study: stage by stage, every outcome stored the moment it arrives.

The runner owns what is the same whatever backend runs the subjects: the
lock, the run folder and its provenance, the run's end (outcome, exit code,
clearing the checkpoint on success). Planning is in planning.py, a stage's
run in stages.py through its kind (stage_kinds.py), which gets a narrow
RunContext (run_context.py), never the runner; the booking of outcomes in
ledger.py, the events in events.py and event_stream.py.
"""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from habitrun.engine.backend_choice import BackendPool
from habitrun.engine.control import DETACHED, StopFlag
from habitrun.engine.debuglog import attach_run_folder, debug_run
from habitrun.engine.environment_lock import stage_packages, write_lock
from habitrun.engine.event_stream import EventStream, Observer
from habitrun.engine.events import CheckpointCleared, RunFinished, RunStarted, RunWarning, Stopping
from habitrun.engine.memory_forecast import Forecaster
from habitrun.engine.planning import StagePlanner
from habitrun.engine.recorder import Recorder
from habitrun.engine.recovering import recover
from habitrun.engine.run_context import NowRunning, RunContext, RunTally
from habitrun.engine.run_summary import FailureLine, RunSummary, StageCounts
from habitrun.engine.running_file import RunningFile
from habitrun.engine.selection import stages_for, unknown_ids
from habitrun.engine.signals import exit_code_for, signal_name, stop_on_signals
from habitrun.engine.stage_inputs import GROUP_FILE_NAME, StageInputs, group_workdir
from habitrun.engine.stage_kinds import kind_of
from habitrun.engine.stages import Stages, refusal
from habitrun.engine.stopnotice import StopNotices
from habitrun.engine.write_failure import WriteFailure
from habitrun.errors import (
    EXIT_FAILED_SUBJECTS,
    EXIT_OK,
    OperatorBindError,
    StoreError,
    WorkerStartError,
)
from habitrun.planner.context import build_context
from habitrun.planner.plan import GROUP_SUBJECT, StagePlan, SubjectStatus
from habitrun.spec.discover import write_table
from habitrun.spec.loader import LoadedRecipe
from habitrun.spec.recipe import StageSpec
from habitrun.spec.roots import declared_roots
from habitrun.spec.subjects import SubjectTable, load_subjects, rows_by_id
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.cohort import Cohort
from habitrun.store.folders import ensure_folder, folder_error
from habitrun.store.guard import empty_store_file
from habitrun.store.journal import JOURNAL_FILE, RunJournal, read_journal
from habitrun.store.lock import StoreLock
from habitrun.store.provenance import collect_provenance
from habitrun.store.recovery import journal_store_dir, settle
from habitrun.store.runs import RESERVE_BYTES, RUNNING_FILE, RunFolder

__all__ = ["GROUP_FILE_NAME", "FailureLine", "RunSummary", "StageCounts", "lock_path_for", "run_study"]

SUBJECTS_TABLE = "subjects.csv"  # the run folder's copy of the subjects found on disk


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
    accept_loss: bool = False,
    detach: bool = False,
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
    ``observer`` gets every event (engine/events.py) as it is written.
    ``accept_loss``: go on when records earlier runs committed are lost from the store and
    their journals cannot restore them (engine/recovering.py); else LostRecordsError (exit 2).
    ``detach``: a stage on the slurm backend submits its arrays and the run ends there ('detached', exit 0);
    ``habitrun resume`` merges what they wrote and goes on.
    """
    subjects = load_subjects(loaded)
    selected = stages_for(loaded, only_stage)
    unknown_ids(subjects, rerun)
    stop = stop or StopFlag()
    store_dir = loaded.store_dir()
    ensure_folder(loaded.run_root())
    ensure_folder(store_dir.parent)
    with debug_run(), StoreLock(lock_path_for(store_dir)):
        empty = empty_store_file(store_dir)
        store = CheckpointStore.open(store_dir)
        store.set_roots(loaded.run_root(), loaded.root, declared_roots(loaded).data)
        store.verify_rows = True  # a run plans each stage with every stored result checked
        settled: list[Path] = []  # journals to delete once the store is closed cleanly
        runner: StudyRunner | None = None
        try:
            recovery, restored = recover(store, loaded.run_root(), accept_loss=accept_loss)
            settled = recovery.journals
            runner = StudyRunner(loaded, subjects, store, stop, observer=observer, argv=list(argv),
                                 resumed_from=resumed_from, source_path=source_path or loaded.path,
                                 detach=detach)
            if empty:
                runner.warnings.append(empty)
            if store.damage is not None:
                runner.warnings.append(store.damage.summary(store_dir))
            runner.warnings.extend(restored)
            runner.selected = selected
            if not runner.prepare(frozenset(rerun)) and not record_noop:
                return runner.noop_summary()  # nothing will import an operator: no need to wait for the check
            runner.warm_backend()  # the workers' fork server boots while the check and the run folder finish
            _wait_for(preflight, runner.backends)
            if install_signal_handlers:
                with stop_on_signals(stop):
                    return runner.run()
            return runner.run()
        finally:
            if runner is not None and runner.journal is not None and runner.journal_complete():
                settled.append(runner.journal.path)
            if store.close():  # everything committed is in the database file: the journals are settled
                settle(settled)


def _wait_for(preflight: Callable[[], None] | None, backends: BackendPool) -> None:
    """The operator check, before the run folder and the signal handlers: Ctrl-C here interrupts."""
    if preflight is None:
        return
    try:
        preflight()
    except BaseException:
        backends.close()
        raise


class StudyRunner:
    """One run of a study: what its stages share (plans, counts, failures, the store, the events)."""

    def __init__(self, loaded: LoadedRecipe, subjects: SubjectTable, store: CheckpointStore, stop: StopFlag,
                 *, observer: Observer | None, argv: list[str], resumed_from: RunFolder | None,
                 source_path: Path, detach: bool = False) -> None:
        self.source_path = source_path
        self.loaded = loaded
        self.recipe = loaded.recipe
        self.subjects = subjects
        self.store = store
        self.stop = stop
        self.argv = argv
        self.resumed_from = resumed_from
        self.run_root = loaded.run_root()
        self.backends = BackendPool(self.run_root, detach=detach)
        self.write_failure = WriteFailure(stop)  # the first folder that refused a write
        self.events = EventStream(observer, self.write_failure)
        self.planner: StagePlanner
        self.stages: Stages  # runs each stage through its kind, with the run's context
        self.recorder: Recorder
        self.folder: RunFolder  # the run folder (not `run`: that is the method)
        self.journal: RunJournal | None = None
        self.tally = RunTally()  # counts, failures, warnings, ... filled stage by stage
        self.counts = self.tally.counts
        self.failures = self.tally.failures
        self.warnings = self.tally.warnings
        self.selected: list[StageSpec] = loaded.recipe.ordered_stages()
        self.now = NowRunning()  # the stage running now and its backend
        self.cohort = Cohort.of(subjects)  # who was found, left out before the run and why

    @property
    def plans(self) -> dict[str, StagePlan]:
        return self.planner.plans

    # ------------------------------------------------------------------ before the run folder
    def prepare(self, rerun_ids: frozenset[str] = frozenset()) -> bool:
        """Check the store's recipe and plan ahead; False when there is nothing to run.

        ``rerun_ids``: --rerun of this command, rerun even within a resume chain.
        """
        # Input files and code first: a missing input file stops the run before it starts (exit 2).
        context = build_context(self.loaded, self.subjects, self.store)
        warning = self.store.check_recipe(
            self.recipe.name, self.loaded.sha256, strict=self.recipe.policy.strict_checkpoint_hash
        )
        if warning:
            self.warnings.append(warning)
        self.warnings.extend(getattr(self.subjects, "notes", ()))  # a sniffed delimiter, empty rows ignored
        report = getattr(self.subjects, "discovery", None)
        if report is not None and report.incomplete:  # said on a no-op run too
            self.warnings.append(f"subjects found by {report.source}: {report.incomplete_text()}")
        chain: set[str] = set()
        if self.resumed_from is not None:
            previous = self.resumed_from.read_provenance()
            chain = set(previous.get("run_chain", [])) | {self.resumed_from.run_id}
        self.planner = StagePlanner(recipe=self.recipe, subjects=self.subjects, store=self.store, context=context,
                                    chain=chain, rerun_ids=rerun_ids)
        # A stored collect or train result over a partial cohort is refused too: the run happens to say so.
        return self.planner.plan_ahead(self.selected) or self.cohort_refused_ahead()

    def cohort_refused_ahead(self) -> bool:
        """Whether a run with nothing to do would refuse a collect or train stage (require_complete_cohort)."""
        return any(stage.name in self.plans
                   and refusal(self.recipe, self.cohort, self.subjects, stage, self.plans[stage.name]) is not None
                   for stage in self.selected)

    def warm_backend(self) -> None:
        """Start the first map or collect stage's backend booting its workers (see Backend.warm)."""
        first = next((s for s in self.selected if kind_of(s).on_backend), None)
        if first is not None:
            self.backends.warm(self.recipe.stage_policy(first.name))

    def noop_summary(self) -> RunSummary:
        """Nothing to run: the counts and the recorded failures, without a run folder."""
        for stage in self.selected:
            plan = self.plans[stage.name]
            counts = StageCounts(total=len(plan.keys))
            self.counts[stage.name] = counts
            counts.cached = sum(1 for st in plan.status.values() if st == SubjectStatus.DONE)
            counts.skipped = sum(1 for st in plan.status.values() if st == SubjectStatus.BLOCKED)
            recorded = self.planner.recorded_failures(stage.name, plan, set())
            self.failures.extend(recorded)
            counts.failed = len(recorded)
        outcome, exit_code = self.outcome()
        return RunSummary(None, outcome, exit_code, self.counts, self.failures, None, self.warnings,
                          self.stored_group_results(), self.outputs(), noop=True)

    # ------------------------------------------------------------------ the run
    def run(self) -> RunSummary:
        """Write the run folder, run the selected stages, record the run's end."""
        resumed = self.open_run_folder()
        self.events.emit_many([RunWarning(message=warning) for warning in self.warnings])
        self.events.emit(RunStarted(run_id=self.folder.run_id, recipe=str(self.loaded.path),
                                    subjects=len(self.subjects), stages=[s.name for s in self.selected],
                                    user=_user(), resumed_from=resumed))
        started = time.monotonic()
        self.journal = self.open_journal()
        self.recorder = Recorder(self.store, self.events.emit_many,
                                 on_failure=lambda exc: self.write_failure.note(self.store.directory, exc),
                                 journal=self.journal)
        inputs = StageInputs(rows=rows_by_id(self.subjects), plans=self.plans, run_root=self.run_root, run=self.folder,
                             read=lambda need, keys: self.stages.read_results(need, keys),
                             one_result=lambda need: kind_of(self.recipe.stage(need)).one_result)
        context = RunContext(recipe=self.recipe, search_path=self.loaded.search_path, store=self.store,
                             recorder=self.recorder, events=self.events, stop=self.stop, run=self.folder,
                             backends=self.backends, inputs=inputs, write_failure=self.write_failure,
                             tally=self.tally, now=self.now, study_root=self.loaded.root,
                             forecast=Forecaster(self.loaded, self.store, self.subjects, inputs.rows))
        self.stages = Stages(context, self.planner, self.cohort, self.subjects)
        notices = StopNotices(self.stop, self.events.emit, self.stopping_facts)
        error = self.run_stages()
        notices.close()
        return self.finish(started, error)

    def open_run_folder(self) -> str | None:
        """Create the run folder with its provenance (a run folder without it never becomes visible);
        the run this one resumes, if any."""
        resumed = self.resumed_from.run_id if self.resumed_from else None
        provenance = collect_provenance(
            recipe_path=self.source_path,
            recipe_sha256=self.loaded.sha256,
            argv=self.argv,
            operator_modules=_operator_modules(self.recipe.stages),
            backend={"backend": self.recipe.policy.backend, "workers": self.recipe.policy.workers},
            operator_packages=stage_packages(self.planner.context),
        )
        provenance.update({
            "recipe_name": self.recipe.name,
            "subjects": len(self.subjects),
            "resumed_from": resumed,
            "run_chain": sorted(self.planner.chain),
            "overrides": list(self.loaded.overrides),
            "outcome": "running",
        })
        self.folder = RunFolder.create(
            self.run_root,
            resolved_yaml=self.loaded.resolved_yaml(),
            recipe_path=self.source_path,
            argv=self.argv,
            provenance=provenance,
            reserve=RESERVE_BYTES + 1024 * len(self.recipe.stages),  # the end's summary: lines per stage
        )
        try:
            write_lock(self.folder.path, git=provenance.get("git") or {}, context=self.planner.context,
                       subjects=self.subjects)
        except StoreError as exc:  # the run goes on: `diff` and `export` say what is missing
            self.warnings.append(f"{exc.message}; `habitrun diff` and `habitrun export` will lack it")
        self.events.attach(self.folder)
        attach_run_folder(self.folder.path)
        self.write_found_subjects()
        return resumed

    def open_journal(self) -> RunJournal:
        """The run's journal (store/journal.py): what it receives is kept there before it is stored."""
        path = self.folder.path / JOURNAL_FILE
        try:
            return RunJournal(path, self.folder.run_id, journal_store_dir(self.run_root, self.store.directory),
                              on_error=lambda exc: self.write_failure.note(self.folder.path, exc))
        except OSError as exc:
            raise folder_error(self.folder.path, exc, doing="write the run's journal in") from None

    def journal_complete(self) -> bool:
        """Whether every outcome the journal holds was committed (it can be settled with the store)."""
        journal = self.journal
        if journal is None:
            return False
        journal.close()
        return not journal.broken and getattr(self, "recorder", None) is not None and self.recorder.error is None

    def journal_kept(self) -> int:
        """Outcomes the journal holds (with their results) that the store did not commit."""
        if self.journal is None or self.journal.broken:
            return 0
        self.recorder.close()
        content = read_journal(self.journal.path)
        if content is None:
            return 0
        return sum(len(b.rows) for b in content.batches if b.seq > content.committed_seq)

    def write_found_subjects(self) -> None:
        """Subjects found on disk: the table this run used goes into its folder."""
        try:
            self.cohort.write(self.folder.path)
        except OSError as exc:
            raise StoreError(f"cannot write {self.folder.path}: {exc}") from None
        report = getattr(self.subjects, "discovery", None)
        if report is None:
            return
        try:
            write_table(self.folder.path / SUBJECTS_TABLE, report.columns,
                        [(row.id, row.fields) for row in self.subjects])
        except OSError as exc:
            raise StoreError(f"cannot write {self.folder.path / SUBJECTS_TABLE}: {exc}") from None

    def run_stages(self) -> WorkerStartError | OperatorBindError | None:
        """Each selected stage until the end or a stop; the run-level error a backend raised, if any."""
        error: WorkerStartError | OperatorBindError | None = None
        running = RunningFile(self.folder.path / RUNNING_FILE, self.running_now).start()
        try:
            for stage in self.selected:
                if self.stop.is_set():
                    break
                if self.backends.detach and not kind_of(stage).on_backend:  # a train stage: at `resume`
                    self.stop.set(DETACHED)
                    break
                self.stages.run(stage)
        except (WorkerStartError, OperatorBindError) as exc:  # run-level: recorded as the run's end, then reported (exit 2)
            error = exc
        finally:
            hard = self.stop.hard
            running.close()
            try:
                self.recorder.close()
            finally:
                self.backends.close(graceful=not hard)
        return error

    def running_now(self) -> tuple[str | None, Any]:
        """The stage running now and its backend (read by the running file's thread)."""
        stage, backend = self.now.stage, self.now.backend
        return (stage.name if stage is not None else None), backend

    def stopping_facts(self) -> Stopping:
        """The ``stopping`` notice: what a stop signal now waits for."""
        stage, backend = self.now.stage, self.now.backend
        facts = Stopping(signal=signal_name(self.stop.signum), stage=stage.name if stage else None,
                         kind=stage.kind if stage else None, backend=backend.name if backend is not None else None)
        if stage is not None:
            facts.grace_sec = self.recipe.stage_policy(stage.name).graceful_shutdown_sec
            running = kind_of(stage).running(stage, backend)
            if running is not None:
                facts.running = running
        return facts

    # ------------------------------------------------------------------ the run's end
    def finish(self, started: float, error: WorkerStartError | OperatorBindError | None) -> RunSummary:
        """Record the run's outcome in its events and its folder; the summary (or the run-level error)."""
        self.raise_if_unwritable(started)
        outcome, exit_code = ("error", error.exit_code) if error else self.outcome()
        if outcome == "success":
            self.clear_on_success()
        summary: dict[str, Any] = {
            "stages": {name: c.as_dict() for name, c in self.counts.items()},
            "failed_subjects": len(self.failures),
            "stop_reason": error.message if error else self.stop.reason,
            "duration_sec": round(time.monotonic() - started, 3),
            "backends": self.backends.described,
        }
        self.events.emit(RunFinished(outcome=outcome, exit_code=exit_code, **summary))
        try:
            self.folder.finish(outcome, {**summary, "members": self.members(),  # the cohort each group stage took
                                      **({"cohort_refused": self.tally.refused} if self.tally.refused else {})})
            self.folder.events.close()
        except OSError as exc:  # the disk filled at the very end
            self.write_failure.note(self.folder.path, exc)
        self.raise_if_unwritable(started)
        if error is not None:
            raise error
        return RunSummary(self.folder, outcome, exit_code, self.counts, self.failures, self.stop.reason,
                          self.warnings, self.tally.group_results, self.outputs(), cohort=self.cohort,
                          members=self.members())

    def raise_if_unwritable(self, started: float) -> None:
        """A write failed: record what can still be recorded, then the run-level error (exit 2)."""
        if self.write_failure:
            raise self.write_failure.end_run(self.folder, self.counts, self.recorder.stored, started,
                                             self.store.directory, kept=self.journal_kept())

    def outcome(self) -> tuple[str, int]:
        if self.stop.reason == DETACHED:  # submitted to SLURM on purpose: `resume` comes back for it
            return "detached", EXIT_OK
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
                    if self.journal is not None:  # removed on purpose: not a lost commit
                        self.journal.forgotten(list(plan.keys.values()))
                    removed = self.store.discard(plan.keys.values())
                    self.events.emit(CheckpointCleared(stage=stage.name, records=removed,
                                                       retried=len(self.tally.retried.get(stage.name, ()))))

    def stored_group_results(self) -> dict[str, Any]:
        out = {}
        for stage in self.selected:
            plan = self.plans.get(stage.name)
            if kind_of(stage).one_result and plan is not None and plan.status.get(GROUP_SUBJECT) == SubjectStatus.DONE:
                key = plan.keys[GROUP_SUBJECT]
                out[stage.name] = self.store.results([key]).get(key)
        return out

    def members(self) -> dict[str, int]:
        """Each collect/train stage planned in this run that takes subjects -> how many it takes."""
        return {stage.name: len(self.plans[stage.name].members) for stage in self.selected
                if kind_of(stage).one_result and stage.name in self.plans and self.plans[stage.name].members}

    def outputs(self) -> dict[str, str]:
        """Each collect/train stage that is done -> the work folder its files are in."""
        return {stage.name: str(group_workdir(self.run_root, stage.name, self.plans[stage.name].keys[GROUP_SUBJECT]))
                for stage in self.selected
                if kind_of(stage).one_result and stage.name in self.plans
                and self.plans[stage.name].status.get(GROUP_SUBJECT) == SubjectStatus.DONE}


def _operator_modules(stages: Sequence[StageSpec]) -> list[str]:
    modules = []
    for stage in stages:
        path = stage.operator or stage.entrypoint
        if path:
            modules.append(path.partition(":")[0] if ":" in path else path.rpartition(".")[0])
    return modules


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return str(os.getuid())

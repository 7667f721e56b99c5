"""`habitrun status [RECIPE or RUN_FOLDER] [OVERRIDES...] [--run ID]`: the last run, per stage counts, and each failure.

Given a recipe, the study's latest run is shown (wherever ``run_dir`` put it),
and the stage counts come from planning the resolved recipe that run stored
(its overrides) against its store; ``--run ID`` shows another run, and
``key=value`` overrides show what those values select (with the latest run made
with them, if any): see habitrun/study/which.py. Given a run folder, that run's
stored recipe is planned from the folder it was run in. The first line names the
run, and the overrides when there are any.
Each failed subject is listed with its one-line reason and its log file.
Nothing is written.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console

from habitrun.cli.app import app, err_console
from habitrun.cli.busy import in_progress_text, is_run, killed_before_folder, store_user
from habitrun.cli.findrecipe import recipe_and_overrides
from habitrun.cli.live import LiveView, render, view_of
from habitrun.cli.longtable import Cell, print_table
from habitrun.cli.memory_text import memory_lines, run_memory
from habitrun.cli.plan import make_console, print_counts, print_package_changes, store_notes
from habitrun.cli.runhome import check_run_home
from habitrun.cli.text import command, esc
from habitrun.cli.text import human as fmt
from habitrun.errors import EXIT_FAILED_SUBJECTS, EXIT_OK, EXIT_USAGE, StoreError, UsageError
from habitrun.planner.plan import Plan, SubjectStatus
from habitrun.spec.loader import LoadedRecipe
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.cohort import Cohort
from habitrun.store.lock import default_lock_path, holder_alive, read_holder
from habitrun.store.runs import DISK_FULL, UNWRITABLE, RunFolder
from habitrun.store.trace import latest_by_key, stage_stats
from habitrun.study.facade import Study
from habitrun.study.which import About

if TYPE_CHECKING:
    from habitrun.study.slurm_arrays import ArraysView

MAX_FAILURES_SHOWN = 20


def locate(target: Path, overrides: list[str] | None = None, run_id: str | None = None) -> Study:
    """The study as `status` reads it, from a recipe file (its latest run, ``run_id``, or the
    ``overrides``) or a run folder (that run)."""
    if target.is_dir() and RunFolder.looks_like_run(target):
        if overrides or run_id is not None:
            raise UsageError(f"{target} is one run folder: give the recipe with --run or overrides instead")
        study = Study.of_run_folder(target)
        assert study.run is not None
        check_run_home(study.run, study.loaded, named=target)  # a copied run folder would show another study
        return study
    if target.is_dir():
        if (target / "recipe.yaml").is_file():
            target = target / "recipe.yaml"
        else:
            raise StoreError(
                f"{target} is neither a run folder (no source.json and recipe.yaml) "
                "nor a study folder with a recipe.yaml"
            )
    return Study.at_run(target, overrides or (), run_id)


NO_RUN = "no run used these values"
RUNNER_DIED = "interrupted (the runner died)"
STOPPED_BY_WRITES = (DISK_FULL, UNWRITABLE)
UNFINISHED = ("interrupted", "detached", RUNNER_DIED, *STOPPED_BY_WRITES)  # `resume` continues these


def outcome_text(outcome: str, info: dict[str, Any]) -> str:
    """The outcome in words: a stop on a folder that refused a write says which and why."""
    if outcome not in STOPPED_BY_WRITES:
        return outcome
    failure = (info.get("summary") or {}).get("write_failure") or {}
    folder = failure.get("folder", "?")
    if outcome == DISK_FULL:
        return f"stopped: the disk was full at {folder}"
    return f"stopped: cannot write {folder} ({failure.get('reason', '?')})"


def unfinished_hint(outcome: str, target: Path) -> str:
    """What to do about a run that did not finish, ending with the command that continues it."""
    if outcome == "detached":
        first = "its SLURM arrays run on by themselves; merge what they wrote and go on:"
    elif outcome == DISK_FULL:
        first = "free space there (or set run_dir / policy.checkpoint_dir to another disk), then"
    elif outcome == UNWRITABLE:
        first = "make that folder writable, then"
    else:
        first = "it did not finish: what it stored is kept;"
    return f"{first} continue with: {resume_command(target)}"


def run_state(run: RunFolder, loaded: LoadedRecipe) -> tuple[str, dict[str, Any]]:
    """The run's outcome, or whether it is still running or its runner died.

    A run writes ``outcome: running`` when it starts and its real outcome when it ends;
    a runner that is SIGKILLed, OOM-killed or loses power never writes the end. Such a
    run is still running only while its runner holds the store lock: the lock's holder
    is alive (or on another host) and is the process that started this run.
    """
    info = run.read_provenance()
    outcome = info.get("outcome")
    if outcome and outcome != "running":
        return str(outcome), info
    holder = read_holder(default_lock_path(loaded.store_dir()))
    if holder and holder_alive(holder) is not False and _same_runner(holder, info):
        return f"running (pid {holder.get('pid')} on {holder.get('host')})", info
    return RUNNER_DIED, info


def _same_runner(holder: dict[str, Any], info: dict[str, Any]) -> bool:
    """Whether the lock holder is the process that started the run (when the run says who)."""
    if info.get("pid") is None:
        return True
    return holder.get("pid") == info.get("pid") and (info.get("host") in (None, holder.get("host")))


def resume_command(target: Path) -> str:
    """The command that continues the run shown for ``target`` (as the user named it)."""
    return f"habitrun resume {shlex.quote(str(target))}"


def unreadable(plan: Plan) -> list[dict[str, str]]:
    """Subjects whose stored result failed its check (they are stale: the next run or resume recomputes them)."""
    return [{"stage": stage.name, "subject": sid, "reason": why} for stage in plan for sid, why in stage.unreadable().items()]


def failures(plan: Plan, store: CheckpointStore | None) -> list[dict[str, Any]]:
    """Every subject whose current key holds a recorded failure, with reason and log path (one that
    the next run runs again, because failures are retried, resume is off or it is listed, too)."""
    out: list[dict[str, Any]] = []
    if store is None:
        return out
    for stage in plan:
        sids = [
            sid
            for sid, st in stage.status.items()
            if st is SubjectStatus.FAILED or st is SubjectStatus.FORCED  # forced: retried, resume off or listed
        ]
        if not sids:
            continue
        states = store.states([stage.keys[sid] for sid in sids])
        for sid in sids:
            state = states.get(stage.keys[sid])
            if state is None or state.ok:
                continue
            out.append(
                {
                    "stage": stage.name,
                    "subject": sid,
                    "kind": state.kind,
                    "error": (state.error or "").splitlines()[0] if state.error else "",
                    "attempts": state.attempts,
                    "log": state.log_path,
                    "run_id": state.run_id,
                }
            )
    return out


def run_failures(run: RunFolder, plan: Plan) -> list[dict[str, Any]]:
    """The subjects that failed for good in ``run`` by its events, each with what it is now.

    Read when the run failed but the store holds no failure under today's keys (the recipe
    or an input changed since): a failed run still lists its failures.
    """
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for event in run.events.read():
        if event.get("event") == "subject_failed" and event.get("final", True):
            stage, sid = str(event.get("stage")), str(event.get("subject"))
            now = plan.stages[stage].status.get(sid) if stage in plan.stages else None
            out[(stage, sid)] = {"stage": stage, "subject": sid, "kind": event.get("kind"),
                                 "error": (event.get("error") or "").splitlines()[0] if event.get("error") else "",
                                 "attempts": event.get("attempt"), "log": event.get("log"), "run_id": run.run_id,
                                 "now": now.value if now is not None else "not in the recipe"}
    return list(out.values())


def resource_stats(plan: Plan, store: CheckpointStore | None) -> dict[str, dict[str, Any]]:
    """Per stage: duration and peak-memory spreads of the attempts behind the current records."""
    if store is None:
        return {}
    keys = [key for stage in plan for key in stage.keys.values()]
    latest = latest_by_key(store.trace(keys=keys))
    chosen = [latest[key] for key in keys if key in latest]
    return stage_stats(chosen)


def print_resources(console: Console, stats: dict[str, dict[str, Any]]) -> None:
    """Per stage, the duration and peak memory of its current results (many stages: ``longtable``)."""
    headers = ("stage", "n", "time median", "p95", "max", "memory median", "p95", "max")
    rows = []
    for name, st in stats.items():
        d, m = st["duration_sec"], st["peak_rss_mb"]
        rows.append([Cell(name), Cell(str(st["attempts"])), *(Cell(_seconds(d[k])) for k in ("median", "p95", "max")),
                     *(Cell(_mb(m[k])) for k in ("median", "p95", "max"))])
    print_table(console, "duration and peak memory of the current results", headers,
                ("left", *("right" for _ in headers[1:])), rows)


def _seconds(value: float | None) -> str:
    return fmt(value, "s").replace("–", "-")


def _mb(value: float | None) -> str:
    return fmt(value, "MB").replace("–", "-")


@dataclass
class Shown:
    """Everything `status` shows of one run: gathered first, then printed as text or JSON."""

    loaded: LoadedRecipe
    run: RunFolder | None  # None: overrides no run used (their results are shown, no run's outcome)
    outcome: str
    info: dict[str, Any]
    plan: Plan
    failed: list[dict[str, Any]]
    stats: dict[str, dict[str, Any]]
    damaged: list[dict[str, str]]
    notes: list[str]
    busy: dict[str, Any] | None = None  # another live holder of the store lock (a run starting, or gc)
    run_failed: list[dict[str, Any]] | None = None  # the run's own failures, when the store holds none now
    cohort: Cohort | None = None  # who the run left out before it started, and why (its cohort.json)
    about: About | None = None  # which run and overrides this answers about (None: the run, as it was run)
    slurm: ArraysView | None = None  # the study's SLURM batches not yet merged (backend slurm)

    @property
    def exit_code(self) -> int:
        if self.notes:
            return EXIT_USAGE
        if self.run is None:  # values no run used: 1 when they select recorded failures
            return EXIT_FAILED_SUBJECTS if self.failed else EXIT_OK
        if self.busy is not None and is_run(self.busy):
            return EXIT_OK  # the last run is the one still starting
        if self.outcome == "detached" and self.slurm is not None and self.slurm.live:
            return EXIT_OK  # its arrays are running: the study is running
        return exit_code_for(self.outcome)


def gather(study: Study, *, verify: bool) -> Shown:
    """Plan the study's recipe against its store and collect what `status` reports (nothing is written)."""
    loaded, run, about = study.loaded, study.run, study.about
    outcome, info = run_state(run, loaded) if run is not None else (NO_RUN, {})
    busy = None if outcome.startswith("running") else store_user(loaded)
    subjects, store = study.subjects_and_store(verify=verify)
    try:
        plan = study.plan(subjects, store)
        again = shlex.join(["habitrun", "run", str(loaded.path), *about.overrides])
        shown = Shown(loaded, run, outcome, info, plan, failures(plan, store), resource_stats(plan, store),
                      unreadable(plan), store_notes(loaded, store, again), busy, about=about)
    finally:
        if store is not None:
            store.close()
    if run is not None and outcome == "failed" and not shown.failed:
        shown.run_failed = run_failures(run, plan)
    shown.cohort = Cohort.read(run.path) if run is not None else None
    if any(loaded.stage_policy(stage.name).backend == "slurm" for stage in loaded.recipe.stages):
        from habitrun.study.slurm_arrays import arrays_view  # only for a study on SLURM

        shown.slurm = arrays_view(loaded.run_root())
    return shown


@app.command()
def status(
    target_word: Optional[str] = typer.Argument(None, metavar="TARGET", help="A recipe file or a run folder (default: recipe.yaml here or in the nearest parent folder)."),  # noqa: UP045
    overrides: Optional[list[str]] = typer.Argument(None, help="Overrides like run's (key=value): the results those values select."),  # noqa: UP045
    run_id: Optional[str] = typer.Option(None, "--run", help="A run id (default: the latest run)."),  # noqa: UP045
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
    show_all: bool = typer.Option(False, "--all", help=f"List every failure (default: the first {MAX_FAILURES_SHOWN})."),
    verify: bool = typer.Option(False, "--verify", help="Check every stored result against its checksum."),
    watch: bool = typer.Option(False, "--watch", help="Refresh the live view of a running study until it ends (Ctrl-C stops watching)."),
    interval: float = typer.Option(2.0, "--interval", min=0.05, metavar="SECONDS", help="Seconds between refreshes with --watch."),
) -> None:
    """Show the last run: outcome, per stage counts, each failed subject with its log file.

    Exit 0 when the last run succeeded (or is running), 1 when it failed, was
    interrupted, stopped or did not finish, or there is no run to show, 2 when
    the recipe or store cannot be read. A running study also shows its live
    progress (rate, ETA, possibly stuck subjects); --watch refreshes it until
    the run ends, then exits as above (Ctrl-C: 130, the run goes on).
    """
    if watch and as_json:
        err_console.print("--watch redraws the status for people; for a program, call `status --json` "
                          "again instead", highlight=False)
        raise typer.Exit(EXIT_USAGE)
    target, overrides = recipe_and_overrides(target_word, overrides)
    study = locate(target, overrides, run_id)
    loaded, run = study.loaded, study.run
    console = make_console()
    if run is None and not overrides:
        raise typer.Exit(no_run(console, loaded, target, as_json=as_json))
    if watch and run is not None:
        from habitrun.cli.watch import watch as watch_run

        raise typer.Exit(watch_run(console, loaded, run, target, interval=interval, verify=verify, show_all=show_all))
    shown = gather(study, verify=verify)
    live = live_part(shown)
    if as_json:
        document = as_document(shown, target)
        if live is not None:
            document["live"] = live.as_dict()
        typer.echo(json.dumps(document, indent=1, ensure_ascii=False))
    else:
        print_run(console, shown, target)
        if live is not None:
            console.print(render(live))
        print_problems(console, shown, target, show_all=show_all)
    raise typer.Exit(shown.exit_code)


def live_part(shown: Shown) -> LiveView | None:
    """The live view (progress, rate, ETA, possibly stuck subjects) of a run still running, else None."""
    return view_of(shown.loaded, shown.run) if shown.run is not None and shown.outcome.startswith("running") else None


def no_run(console: Console, loaded: LoadedRecipe, target: Path, *, as_json: bool) -> int:
    """No run folder to show: say whether one is being made, or what a killed start-up left; the exit code.

    0 while a run is starting (it is running), else 1: there is no finished run to show.
    """
    holder = store_user(loaded)
    running = holder is not None and is_run(holder)
    killed = None if running else killed_before_folder(loaded)
    if as_json:
        typer.echo(json.dumps({"recipe": str(loaded.path), "run": None,
                               "in_progress": holder, "before_run_folder": killed,
                               "about": {"run": None, "overrides": [], "recipe": "file"}}, ensure_ascii=False))
    else:
        console.print(f"no run yet for {esc(str(loaded.path))} (runs go to {esc(str(loaded.run_root() / 'runs'))})",
                      highlight=False)
        if holder is not None:
            console.print(f"{esc(in_progress_text(holder))}; it has not made its run folder yet", highlight=False)
        if killed is not None:
            console.print(f"{esc(killed)}; start it again with: {esc(resume_command(target))}", highlight=False)
    return EXIT_OK if running else EXIT_FAILED_SUBJECTS


def as_document(shown: Shown, target: Path) -> dict[str, Any]:
    """The JSON `status --json` prints."""
    run, outcome, info, plan = shown.run, shown.outcome, shown.info, shown.plan
    about = shown.about or About(run, (), "run")
    return {
        "recipe": str(shown.loaded.path),
        "run": None if run is None else {
            "id": run.run_id, "path": str(run.path), "outcome": outcome,
            "started_at": info.get("started_at"), "ended_at": info.get("ended_at"),
            **({"stopped": (info.get("summary") or {}).get("write_failure")}
               if outcome in STOPPED_BY_WRITES else {}),
            **({"resume": resume_command(target)} if outcome in UNFINISHED else {})},
        "in_progress": shown.busy,
        "stages": {s.name: s.counts() for s in plan},
        "packages_changed": {s.name: s.package_changes for s in plan if s.package_changes},
        "failures": shown.failed,
        **({"run_failures": shown.run_failed} if shown.run_failed is not None else {}),
        "resources": shown.stats,
        "unreadable": shown.damaged,
        "store_damage": shown.notes,
        "cohort": cohort_document(shown),
        "about": about.as_json(),
        "memory": run_memory(info),
        **({"slurm": shown.slurm.as_dict()} if shown.slurm is not None else {}),
    }


def print_run(console: Console, shown: Shown, target: Path) -> None:
    """The run's outcome and times, the stage counts now, the resources and package changes."""
    run, outcome, info = shown.run, shown.outcome, shown.info
    if run is None:  # values no run used: what they select, without a run to show
        console.print(esc(shown.about.line() if shown.about else NO_RUN), highlight=False)
        print_counts(console, shown.plan, f"stages of {esc(shown.loaded.recipe.name)} now")
        print_package_changes(console, shown.plan)
        return
    given = f" ({shown.about.words()})" if shown.about is not None and shown.about.overrides else ""
    console.print(f"[bold]run {esc(run.run_id)}[/]: {esc(outcome_text(outcome, info))}{esc(given)}", highlight=False)
    console.print(f"  folder   {esc(str(run.path))}")
    console.print(f"  started  {esc(str(info.get('started_at', '?')))}")
    if info.get("ended_at"):
        console.print(f"  ended    {esc(str(info['ended_at']))}")
    why = (info.get("summary") or {}).get("stop_reason")
    if why and outcome in ("interrupted", "failed", "error"):  # a signal, fail_fast, a worker that cannot start
        console.print(f"  stopped  {esc(str(why).splitlines()[0])}", highlight=False)
    starting = shown.busy is not None and is_run(shown.busy)
    if outcome in UNFINISHED and not starting:  # a run starting now is what the hint would start
        console.print(f"  {esc(unfinished_hint(outcome, target))}", highlight=False)
    if shown.busy is not None:
        later = "; it has not made its run folder yet" if is_run(shown.busy) else ""
        console.print(f"[bold]now:[/] {esc(in_progress_text(shown.busy))}{later}", highlight=False)
    print_counts(console, shown.plan, f"stages of {esc(shown.loaded.recipe.name)} now")
    if shown.slurm is not None:
        from habitrun.study.slurm_arrays import arrays_lines

        console.print("\n".join(esc(line) for line in arrays_lines(shown.slurm)), highlight=False)
    if shown.stats:
        print_resources(console, shown.stats)
        slowest = []  # one print for every stage: rich's cost per print is a millisecond
        for name, st in shown.stats.items():
            slow = ", ".join(f"{esc(s['subject'])} {_seconds(s['duration_sec'])}" for s in st["slowest"])
            slowest.append(f"  slowest in {esc(name)}: {slow}")
        console.print("\n".join(slowest), highlight=False)
    print_package_changes(console, shown.plan)
    memory = run_memory(info)
    if memory is not None:
        console.print("\n".join(memory_lines(memory)), highlight=False)
    print_cohort_status(console, shown)


def group_members(plan: Plan) -> dict[str, int]:
    """Each collect/train stage that takes subjects -> how many it takes now."""
    return {s.name: len(s.members) for s in plan if s.is_group and s.members}


def cohort_document(shown: Shown) -> dict[str, Any] | None:
    """``cohort`` of `status --json`: found, incomplete (with what is missing), excluded, in the run,
    what each collect/train stage takes, the stages refused on a partial cohort; None for an older run."""
    if shown.cohort is None:
        return None
    refused = (shown.info.get("summary") or {}).get("cohort_refused") or []
    return {**shown.cohort.as_dict(), "members": group_members(shown.plan), "refused": refused}


def print_cohort_status(console: Console, shown: Shown) -> None:
    """The cohort line (who is not in the run and why) and any stage refused on a partial cohort."""
    if shown.cohort is None:
        return
    line = shown.cohort.line(group_members(shown.plan))
    if line is not None:
        console.print(f"[yellow]cohort:[/] {esc(line)}", highlight=False)
    for message in (shown.info.get("summary") or {}).get("cohort_refused") or []:
        console.print(f"  [red]refused:[/] {esc(str(message))}", highlight=False)


def print_problems(console: Console, shown: Shown, target: Path, *, show_all: bool) -> None:
    """Store damage, unreadable stored results and each failed subject with its log; ``target`` as given."""
    more = f"({command('habitrun', 'status', target, '--all')})"
    for note in shown.notes:
        err_console.print(f"[bold red]store damaged:[/] {esc(note)}", highlight=False)
    damaged, failed = shown.damaged, shown.failed
    if damaged:
        console.print(f"[yellow]{len(damaged)} stored result(s) unreadable[/] (stale: "
                      f"`{command('habitrun', 'resume', target)}` or `run` recomputes them):", highlight=False)
        for d in damaged[:MAX_FAILURES_SHOWN] if not show_all else damaged:
            console.print(f"  {esc(d['stage'])} {esc(d['subject'])}: {esc(d['reason'])}", highlight=False)
    if not failed and shown.run_failed:
        print_run_failures(console, shown.run_failed, more, show_all=show_all)
        return
    if not failed:
        if shown.outcome == "failed":  # failed, yet no failure of its own nor stored: say what made it fail
            stages = (shown.info.get("summary") or {}).get("stages") or {}
            totals = {k: sum(int(c.get(k) or 0) for c in stages.values()) for k in ("failed", "skipped", "not_run")}
            console.print(f"no failed subject is recorded now; the run counted {totals['failed']} failed, "
                          f"{totals['skipped']} skipped and {totals['not_run']} not run", highlight=False)
        else:
            console.print("no failed subjects")
        return
    console.print(f"[red]{len(failed)} failed subject(s)[/]:")
    listed = failed if show_all else failed[:MAX_FAILURES_SHOWN]
    for f in listed:
        what = f"{f['kind']}: {f['error']}" if f["kind"] else f["error"]
        console.print(f"  {esc(f['stage'])} {esc(f['subject'])}: {esc(what)}", highlight=False)
        if f["log"] and os.path.exists(f["log"]):
            console.print(f"      log: {esc(f['log'])}", highlight=False)
        else:  # a subject that printed nothing before it was stopped, or a log folder since deleted
            console.print("      log: none was written", highlight=False)
    if len(listed) < len(failed):
        console.print(f"  ... and {len(failed) - len(listed)} more {more}", highlight=False)


def print_run_failures(console: Console, listed: list[dict[str, Any]], more: str, *, show_all: bool) -> None:
    """The failures of a failed run that the store no longer holds as failures (with what each is now).

    ``more`` is the hint that lists them all (the exact `status --all` command, escaped)."""
    console.print(f"[red]{len(listed)} subject(s) failed in this run[/] (under the recipe and inputs as they "
                  "are now, none is a recorded failure):")
    shown = listed if show_all else listed[:MAX_FAILURES_SHOWN]
    for f in shown:
        what = f"{f['kind']}: {f['error']}" if f["kind"] else f["error"]
        console.print(f"  {esc(f['stage'])} {esc(f['subject'])}: {esc(what)} (now {esc(f['now'])})", highlight=False)
        if f["log"] and os.path.exists(f["log"]):
            console.print(f"      log: {esc(f['log'])}", highlight=False)
    if len(shown) < len(listed):
        console.print(f"  ... and {len(listed) - len(shown)} more {more}", highlight=False)


def exit_code_for(outcome: str) -> int:
    """0: the last run succeeded (or is running); 1: it failed, was interrupted or stopped, or did not finish."""
    if outcome == "success" or outcome.startswith("running"):
        return EXIT_OK
    return EXIT_FAILED_SUBJECTS

"""`habitrun plan RECIPE [OVERRIDES...]`: what a run would do, per stage, without running anything.

Reads the recipe file with the overrides given (never a run's: `plan` says what
running this command line would do), the manifest and (if there is one) the
checkpoint store those values select, and prints per stage how many subjects are done, failed, stale, pending,
forced or blocked. ``--reason`` says why each one that would run (or
cannot) is in that state; ``--json`` prints it all for machines. A store is
never created here, and no record is written: only the digests of input files
that had to be read go into an existing store's file table, so the next plan
does not read them again.
"""

from __future__ import annotations

import json
import shlex
from collections import defaultdict
from typing import Any, Optional

import typer
from rich.console import Console

from habitrun.cli.app import app, err_console
from habitrun.cli.busy import in_progress_text, store_user
from habitrun.cli.findrecipe import recipe_and_overrides
from habitrun.cli.longtable import Cell, print_table
from habitrun.cli.memory_text import plan_memory, plan_memory_lines
from habitrun.cli.subjects_text import subjects_lines
from habitrun.cli.text import esc
from habitrun.errors import EXIT_USAGE
from habitrun.planner.explain import merged_by_pattern
from habitrun.planner.plan import Plan, StagePlan, SubjectStatus
from habitrun.planner.subject_files import outside_inputs
from habitrun.spec.loader import LoadedRecipe
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.guard import empty_store_file
from habitrun.store.recovery import Recovery, examine, unsettled
from habitrun.study.facade import Study

COLUMNS = ("done", "failed", "stale", "pending", "forced", "blocked")
_STYLE = {"failed": "red", "stale": "yellow", "pending": "cyan", "forced": "magenta", "blocked": "yellow"}


def make_console() -> Console:
    """Rich console; wide enough for the table when the output is not a terminal."""
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, width=120)
    return console


def store_notes(loaded: LoadedRecipe, store: CheckpointStore | None, run_command: str,
                recovery: Recovery | None | bool = True) -> list[str]:
    """What is wrong with the store file (damaged, or empty, or short of records a run committed):
    the command then exits 2.

    ``run_command`` is the exact `habitrun run ...` that fixes it (shlex-joined, not escaped).
    ``recovery``: the journals' check if made already (True: make it).
    """
    notes = []
    empty = empty_store_file(loaded.store_dir())
    if empty:
        notes.append(empty + f"; `{run_command}` starts a new store")
    if store is not None and store.damage is not None:
        notes.append(store.damage.summary(loaded.store_dir()) + f"; `{run_command}` repairs it (keeping the damaged file)")
    if recovery is True:
        recovery = journal_check(loaded, store)
    if isinstance(recovery, Recovery):
        notes.extend(recovery.losses(advice=True))
    return notes


def journal_check(loaded: LoadedRecipe, store: CheckpointStore | None) -> Recovery | None:
    """The unsettled run journals compared with the store (store/recovery.py); None while a run
    holds the store (its journal is being written, and it stored the others at its start)."""
    journals = unsettled(loaded.run_root(), loaded.store_dir())  # usually none: a clean close settles them
    if not journals:
        return None
    # imported only here: `plan` without journals never reads the lock (tests/cli/test_light_imports.py)
    from habitrun.store.lock import default_lock_path, holder_alive, read_holder

    holder = read_holder(default_lock_path(loaded.store_dir()))
    if holder and holder_alive(holder) is not False:
        return None
    return examine(store, journals, loaded.store_dir())


def outside_notes(plan: Plan, store: CheckpointStore | None) -> list[str]:
    """Stages whose stored results name absolute paths outside the study (they do not move with it)."""
    notes: list[str] = []
    if store is None:
        return notes
    for stage in plan:
        count, example = store.outside_paths(stage.name)
        if count:
            notes.append(f"stage {stage.name}: {count} stored result(s) name paths outside the study "
                         f"(e.g. {example}); they stay where they are if the study moves")
    return notes


def print_counts(console: Console, plan: Plan, title: str | None = None) -> None:
    """The per-stage counts table (``title`` is markup); many stages are drawn by ``longtable``."""
    headers = ("stage", "kind", *COLUMNS, "to run")
    justify = ("left", "left", *("right" for _ in COLUMNS), "right")
    rows = []
    for stage in plan:
        counts = stage.counts()
        cells = [Cell(str(counts[c]), _STYLE[c] if counts[c] and c in _STYLE else None) for c in COLUMNS]
        rows.append([Cell(stage.name), Cell(stage.kind), *cells, Cell(str(len(stage.to_run())))])
    print_table(console, title, headers, justify, rows)


def failure_texts(stage: StagePlan, store: CheckpointStore | None, sids: list[str]) -> dict[str, str]:
    """subject -> "kind: error" of its stored failure under the current key."""
    if store is None or not sids:
        return {}
    states = store.states([stage.keys[s] for s in sids])
    out = {}
    for sid in sids:
        state = states.get(stage.keys[sid])
        if state is not None and not state.ok:
            out[sid] = f"{state.kind}: {state.error}" if state.kind else str(state.error)
    return out


def reason_groups(stage: StagePlan, store: CheckpointStore | None) -> dict[tuple[str, str], list[str]]:
    """(status, reason text) -> subjects, for every subject that is not simply done."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    failed = [sid for sid, st in stage.status.items() if st is SubjectStatus.FAILED]
    errors = failure_texts(stage, store, failed)
    for sid, st in stage.status.items():
        if st is SubjectStatus.DONE:
            continue
        if st is SubjectStatus.FAILED:
            why = f"recorded failure: {errors.get(sid, 'unknown')}"
        elif st is SubjectStatus.PENDING:
            why = "never run"
        else:
            why = ", ".join(stage.reasons.get(sid) or ["?"])
        groups[(st.value, why)].append(sid)
    return groups


def print_package_changes(console: Console, plan: Plan) -> None:
    """Per stage, the packages its code imports whose version changed since its stored results."""
    for stage in plan:
        if stage.package_changes:
            console.print(
                f"[yellow]packages[/] {esc(stage.name)}: {esc(', '.join(stage.package_changes))} since these results"
                " (not rerun; policy.rerun_on_package_change puts versions in the keys)",
                highlight=False,
            )


def print_reasons(console: Console, plan: Plan, store: CheckpointStore | None, limit: int) -> None:
    for stage in plan:
        groups = merged_by_pattern(reason_groups(stage, store))  # one line for a reason many share
        if not groups:
            continue
        console.print(f"[bold]{esc(stage.name)}[/]")
        ordered = sorted(groups.items(), key=lambda item: -len(item[1]))  # the commonest cause first
        if limit > 0 and len(ordered) > limit:
            rest = ordered[limit:]
            ordered = ordered[:limit]
            console.print(f"  ({len(rest)} more reasons for {sum(len(s) for _, s in rest)} subjects not shown; --limit 0 shows all)")
        for (status, why), sids in ordered:
            shown = sids if limit <= 0 else sids[:limit]
            more = f" ... and {len(sids) - len(shown)} more" if len(shown) < len(sids) else ""
            console.print(
                f"  [{_STYLE.get(status, 'default')}]{status}[/] ({esc(why)}): {len(sids)}",
                highlight=False,
            )
            console.print("    " + esc(", ".join(shown)) + more, highlight=False)


def plan_json(loaded: LoadedRecipe, plan: Plan, store: CheckpointStore | None,
              subjects: Any = None) -> dict[str, Any]:
    data = plan.to_json(subjects=True)
    report = getattr(subjects, "discovery", None)
    if report is not None:
        data["found"] = {
            "source": report.source, "files": report.files, "subjects": report.found,
            "file_columns": list(report.file_columns),
            "incomplete": {sid: list(missing) for sid, missing in report.incomplete},
        }
    for stage_data, stage in zip(data["stages"], plan, strict=True):
        failed = [sid for sid, st in stage.status.items() if st is SubjectStatus.FAILED]
        for sid, text in failure_texts(stage, store, failed).items():
            stage_data["subjects"][sid]["error"] = text
    return {
        "recipe": {"name": loaded.recipe.name, "path": str(loaded.path), "sha256": loaded.sha256},
        "store": str(loaded.store_dir()) if store is not None else None,
        **data,
    }


@app.command()
def plan(
    recipe_word: Optional[str] = typer.Argument(None, metavar="RECIPE", help="The recipe file (default: recipe.yaml here or in the nearest parent folder)."),  # noqa: UP045
    overrides: list[str] = typer.Argument(None, help="Overrides like stages.features.params.bins=64."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON (every subject's status)."),
    reason: bool = typer.Option(False, "--reason", help="Say for each subject that is not done why."),
    limit: int = typer.Option(50, "--limit", help="With --reason: subjects listed per reason (0: all)."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Plan as `run --retry-failed` would: recorded failures rerun."),
    verify: bool = typer.Option(False, "--verify", help="Check every stored result against its checksum "
                                "(large ones are always checked when their file changed)."),
) -> None:
    """Show what a run would do, per stage: done / failed / stale / pending / forced / blocked."""
    recipe, overrides = recipe_and_overrides(recipe_word, overrides)
    study = Study.of_file(recipe, (*(overrides or ()), *(("policy.retry_failed_subjects=true",) if retry_failed else ())))
    loaded = study.loaded
    subjects, store = study.subjects_and_store(verify=verify)
    try:
        the_plan = study.plan(subjects, store)
        recovery = journal_check(loaded, store)
        damaged = store_notes(loaded, store, shlex.join(["habitrun", "run", str(recipe), *(overrides or ())]), recovery)
        pending = recovery.pending_notes() if recovery is not None else []
        busy = store_user(loaded)
        memory = plan_memory(loaded, the_plan, store, subjects)
        if as_json:
            data = plan_json(loaded, the_plan, store, subjects)
            data["about"] = study.about.as_json()
            data["in_progress"] = busy
            data["store_damage"] = damaged
            data["journaled"] = pending
            data["outside_paths"] = outside_notes(the_plan, store)
            data["outside_inputs"] = outside_inputs(loaded, subjects, limit=0)
            if memory:
                data["memory"] = memory
            typer.echo(json.dumps(data, indent=1, ensure_ascii=False))
            if damaged:
                raise typer.Exit(EXIT_USAGE)
            return
        console = make_console()
        where = (f"store {loaded.store_dir()}" if store is not None
                 else "no readable store: see below" if damaged else "no store yet: nothing has run")
        given = f"; {study.about.words()}" if study.about.overrides else ""
        title = f"plan for {loaded.recipe.name} ({len(subjects)} subjects; {where}{given})"
        print_counts(console, the_plan, esc(title))
        if busy is not None:
            console.print(f"[yellow]{esc(in_progress_text(busy))}[/]: these counts are the store's now and change "
                          "as it stores results", highlight=False)
        if getattr(subjects, "discovery", None) is not None or getattr(subjects, "notes", None):
            lines = subjects_lines(loaded, subjects)
            for line in lines if getattr(subjects, "discovery", None) is not None else lines[1:]:
                console.print(f"subjects: {esc(line)}", highlight=False)
        print_package_changes(console, the_plan)
        if memory:
            console.print("\n".join(plan_memory_lines(memory)), highlight=False)
        if reason:
            print_reasons(console, the_plan, store, limit)
        for note in outside_notes(the_plan, store):
            console.print(esc(note), highlight=False)
        for name, paths in outside_inputs(loaded, subjects, limit=0).items():
            shown = ", ".join(paths[:3]) + (" ..." if len(paths) > 3 else "")
            console.print(f"[yellow]{esc(name)}[/]: {len(paths)} input file(s) outside the study and its data roots, "
                          f"by absolute path (a moved or cloned study needs them at the same place): {esc(shown)}",
                          highlight=False)
        total = sum(len(s.to_run()) for s in the_plan)
        failed = sum(s.counts()["failed"] for s in the_plan)
        if total:
            console.print(f"{total} subject-stage(s) would run")
        else:
            console.print("nothing to run: every stage is done" if not failed else "nothing to run")
        if failed:
            again = shlex.join(["habitrun", "run", str(recipe), *(overrides or ()), "--retry-failed"])
            console.print(f"[yellow]{failed} recorded failure(s) will not be retried[/]; retry them with: {esc(again)}",
                          highlight=False)
        for note in pending:
            console.print(f"[yellow]journal:[/] {esc(note)}", highlight=False)
        for note in damaged:
            err_console.print(f"[bold red]store damaged:[/] {esc(note)}", highlight=False)
        if damaged:
            raise typer.Exit(EXIT_USAGE)
    finally:
        if store is not None:
            store.close()

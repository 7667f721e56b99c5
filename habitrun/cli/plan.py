"""`habitrun plan RECIPE [OVERRIDES...]`: what a run would do, per stage, without running anything.

Reads the recipe, the manifest and (if there is one) the checkpoint store,
and prints per stage how many subjects are done, failed, stale, pending,
forced or blocked. ``--reason`` says why each one that would run (or
cannot) is in that state; ``--json`` prints it all for machines. A store is
never created or written here.
"""

from __future__ import annotations

import json
import shlex
from collections import defaultdict
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from habitrun.cli.app import app
from habitrun.cli.text import esc
from habitrun.planner.plan import Plan, StagePlan, SubjectStatus, plan_study
from habitrun.spec.loader import LoadedRecipe, load_recipe
from habitrun.spec.subjects import load_subjects
from habitrun.store.checkpoint import CheckpointStore

COLUMNS = ("done", "failed", "stale", "pending", "forced", "blocked")
_STYLE = {"failed": "red", "stale": "yellow", "pending": "cyan", "forced": "magenta", "blocked": "yellow"}


def make_console() -> Console:
    """Rich console; wide enough for the table when the output is not a terminal."""
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, width=120)
    return console


def open_existing_store(loaded: LoadedRecipe) -> CheckpointStore | None:
    """The recipe's store if one exists (StoreError if something else is there); never creates one."""
    store_dir = loaded.store_dir()
    if not CheckpointStore.exists(store_dir):
        return None
    return CheckpointStore.open(store_dir, create=False)


def counts_table(plan: Plan, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("stage")
    table.add_column("kind")
    for column in (*COLUMNS, "to run"):
        table.add_column(column, justify="right")
    for stage in plan:
        counts = stage.counts()
        cells = [
            f"[{_STYLE[c]}]{counts[c]}[/]" if counts[c] and c in _STYLE else str(counts[c]) for c in COLUMNS
        ]
        table.add_row(esc(stage.name), esc(stage.kind), *cells, str(len(stage.to_run())))
    return table


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


def print_reasons(console: Console, plan: Plan, store: CheckpointStore | None, limit: int) -> None:
    for stage in plan:
        groups = reason_groups(stage, store)
        if not groups:
            continue
        console.print(f"[bold]{esc(stage.name)}[/]")
        for (status, why), sids in groups.items():
            shown = sids if limit <= 0 else sids[:limit]
            more = f" ... and {len(sids) - len(shown)} more" if len(shown) < len(sids) else ""
            console.print(
                f"  [{_STYLE.get(status, 'default')}]{status}[/] ({esc(why)}): {len(sids)}",
                highlight=False,
            )
            console.print("    " + esc(", ".join(shown)) + more, highlight=False)


def plan_json(loaded: LoadedRecipe, plan: Plan, store: CheckpointStore | None) -> dict[str, Any]:
    data = plan.to_json(subjects=True)
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
    recipe: Path = typer.Argument(Path("recipe.yaml"), help="The recipe file (default: ./recipe.yaml)."),
    overrides: list[str] = typer.Argument(None, help="Overrides like stages.features.params.bins=64."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON (every subject's status)."),
    reason: bool = typer.Option(False, "--reason", help="Say for each subject that is not done why."),
    limit: int = typer.Option(50, "--limit", help="With --reason: subjects listed per reason (0: all)."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Plan as `run --retry-failed` would: recorded failures rerun."),
) -> None:
    """Show what a run would do, per stage: done / failed / stale / pending / forced / blocked."""
    loaded = load_recipe(recipe, (*(overrides or ()), *(("policy.retry_failed_subjects=true",) if retry_failed else ())))
    subjects = load_subjects(loaded)
    store = open_existing_store(loaded)
    try:
        the_plan = plan_study(loaded, subjects, store)
        if as_json:
            typer.echo(json.dumps(plan_json(loaded, the_plan, store), indent=1, ensure_ascii=False))
            return
        console = make_console()
        where = f"store {loaded.store_dir()}" if store is not None else "no store yet: nothing has run"
        title = f"plan for {loaded.recipe.name} ({len(subjects)} subjects; {where})"
        console.print(counts_table(the_plan, esc(title)))
        if reason:
            print_reasons(console, the_plan, store, limit)
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
    finally:
        if store is not None:
            store.close()

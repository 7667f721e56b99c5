"""The closing report of `run` and `resume`: per stage counts, results, failures with kind and log, next step."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from habitrun.cli.text import esc
from habitrun.engine.run_summary import FailureLine, RunSummary
from habitrun.store.cohort import PARTIAL_COHORT

MAX_FAILURES_SHOWN = 20
MAX_FILES_SHOWN = 5
RESULT_CHARS = 160  # a collect/train result is shown up to this long


def failure_text(line: FailureLine) -> str:
    """``features S3: timeout: subject exceeded 900 s  (log: ...)``, escaped for rich."""
    what = f"{line.kind}: {line.error}" if line.kind and not line.error.startswith(f"{line.kind}:") else line.error
    if line.recorded:
        what = f"recorded failure: {what}"
    if line.log_path and os.path.exists(line.log_path):
        where = f"log: {esc(line.log_path)}"
    else:
        where = "no log written"
    return f"  {esc(line.stage)} {esc(line.subject_id)}: {esc(what)}  [dim]({where})[/]"


def short_result(result: Any) -> str:
    """A result on one line, cut at RESULT_CHARS."""
    try:
        text = json.dumps(result, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(result)
    return text if len(text) <= RESULT_CHARS else text[:RESULT_CHARS - 3] + "..."


def files_under(folder: str, limit: int = MAX_FILES_SHOWN) -> tuple[list[str], int]:
    """Up to ``limit`` files under ``folder`` (sorted, relative) and how many there are."""
    found: list[str] = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        found.extend(os.path.relpath(os.path.join(root, f), folder) for f in sorted(files))
    return found[:limit], len(found)


def print_outputs(console: Console, summary: RunSummary) -> None:
    """Each collect/train stage's result (short) and the files it wrote in its work folder."""
    for stage, folder in summary.outputs.items():
        console.print(f"[bold]{esc(stage)}[/]: {esc(short_result(summary.results.get(stage)))}", highlight=False)
        shown, total = files_under(folder)
        if not total:
            console.print(f"  no files in {esc(folder)}", highlight=False)
            continue
        more = f" (and {total - len(shown)} more)" if total > len(shown) else ""
        console.print(f"  files in {esc(Path(folder))}: {esc(', '.join(shown))}{more}", highlight=False)


def print_cohort(console: Console, summary: RunSummary) -> None:
    """Who is not in the run and why (subject ids escaped)."""
    line = summary.cohort.line(summary.members) if summary.cohort is not None else None
    if line is not None:
        console.print(f"[yellow]cohort:[/] {esc(line)}", highlight=False)


def print_failures(console: Console, lines: list[FailureLine], title: str, recipe_arg: str) -> None:
    if not lines:
        return
    console.print(title)
    for line in lines[:MAX_FAILURES_SHOWN]:
        console.print(failure_text(line), highlight=False)
    if len(lines) > MAX_FAILURES_SHOWN:
        console.print(f"  ... and {len(lines) - MAX_FAILURES_SHOWN} more: "
                      f"habitrun status {esc(shlex.quote(recipe_arg))} --all", highlight=False)


def print_recorded(console: Console, summary: RunSummary, recipe_arg: str, retry_command: str | None) -> None:
    recorded = summary.recorded_failures
    if not recorded:
        return
    print_failures(console, recorded, f"[yellow]{len(recorded)} recorded failure(s) not retried[/] "
                   "(stored by an earlier run; retry rounds do not rerun them):", recipe_arg)
    if retry_command:
        console.print(f"retry them with: {esc(retry_command)}", highlight=False)


def print_summary(console: Console, summary: RunSummary, *, recipe_arg: str, retry_command: str | None = None,
                  err: Console | None = None) -> None:
    """The run's outcome on ``console``; a stop's one line (what is stored, how to go on) on ``err``."""
    for warning in summary.warnings if summary.noop else ():
        console.print(f"[yellow]warning:[/] {esc(warning)}", highlight=False)
    if summary.noop:
        cached = sum(c.cached for c in summary.stages.values())
        failed = len(summary.recorded_failures)
        extra = f", {failed} recorded failure(s) not retried" if failed else ""
        console.print(f"nothing to run: {cached} subject-stage(s) already stored as done{extra} "
                      "(no run folder written; --record-noop writes one)", highlight=False)
        print_recorded(console, summary, recipe_arg, retry_command)
        return
    assert summary.run is not None
    table = Table(title=esc(f"run {summary.run.run_id}: {summary.outcome}"), title_justify="left")
    for column in ("stage", "total", "done", "cached", "failed", "skipped"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for name, c in summary.stages.items():
        table.add_row(esc(name), str(c.total), str(c.done), str(c.cached),
                      f"[red]{c.failed}[/]" if c.failed else "0",
                      f"[yellow]{c.skipped}[/]" if c.skipped else "0")
    console.print(table)
    print_cohort(console, summary)
    print_outputs(console, summary)
    new = [f for f in summary.failures if not f.recorded and f.kind != PARTIAL_COHORT]
    print_failures(console, new, f"[red]{len(new)} failed subject(s):[/]", recipe_arg)
    for refused in (f for f in summary.failures if f.kind == PARTIAL_COHORT):
        console.print(f"[red]refused:[/] {esc(refused.error)}", highlight=False)
    print_recorded(console, summary, recipe_arg, retry_command)
    console.print(f"run folder: {esc(summary.run.path)}", highlight=False)
    if summary.outcome == "detached":
        console.print(f"[bold]detached[/]: the SLURM arrays run on; follow them with: habitrun status "
                      f"{esc(shlex.quote(recipe_arg))}; merge and go on with: habitrun resume "
                      f"{esc(shlex.quote(recipe_arg))}", highlight=False)
    elif summary.outcome == "interrupted":
        (err or console).print(f"[yellow]stopped ({esc(summary.stop_reason)}); finished subjects are stored.[/] "
                      f"Continue with: habitrun resume {esc(shlex.quote(recipe_arg))}", highlight=False)
    elif summary.stop_reason and summary.stop_reason.startswith("fail_fast"):
        console.print(f"[red]{esc(summary.stop_reason)}[/]", highlight=False)
        console.print(f"Fix it, then: habitrun resume {esc(shlex.quote(recipe_arg))}", highlight=False)

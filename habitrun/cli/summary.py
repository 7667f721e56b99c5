"""The closing report of `run` and `resume`: per stage counts, failures with log paths, next step."""

from __future__ import annotations

import json
import shlex

from rich.console import Console
from rich.table import Table

from habitrun.cli.text import esc
from habitrun.engine.runner import RunSummary

MAX_FAILURES_SHOWN = 20


def print_summary(console: Console, summary: RunSummary, *, recipe_arg: str) -> None:
    table = Table(title=esc(f"run {summary.run.run_id}: {summary.outcome}"), title_justify="left")
    for column in ("stage", "total", "done", "cached", "failed", "skipped"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for name, c in summary.stages.items():
        table.add_row(esc(name), str(c.total), str(c.done), str(c.cached),
                      f"[red]{c.failed}[/]" if c.failed else "0",
                      f"[yellow]{c.skipped}[/]" if c.skipped else "0")
    console.print(table)
    for stage, result in summary.results.items():
        if isinstance(result, dict) and any(k in result for k in ("accuracy", "loss", "metrics")):
            console.print(f"[bold]{esc(stage)}[/]: " + esc(json.dumps(result, default=str)), highlight=False)
    if summary.failures:
        console.print(f"[red]{len(summary.failures)} failed subject(s):[/]")
        for line in summary.failures[:MAX_FAILURES_SHOWN]:
            console.print(f"  {esc(line.stage)} {esc(line.subject_id)}: {esc(line.error)}  [dim]({esc(line.log_path)})[/]",
                          highlight=False)
        if len(summary.failures) > MAX_FAILURES_SHOWN:
            console.print(f"  ... and {len(summary.failures) - MAX_FAILURES_SHOWN} more: "
                          f"habitrun status {esc(shlex.quote(recipe_arg))}")
    console.print(f"run folder: {esc(summary.run.path)}", highlight=False)
    if summary.outcome == "interrupted":
        console.print(f"[yellow]stopped ({esc(summary.stop_reason)}); finished subjects are stored.[/] "
                      f"Continue with: habitrun resume {esc(shlex.quote(recipe_arg))}", highlight=False)
    elif summary.stop_reason and summary.stop_reason.startswith("fail_fast"):
        console.print(f"[red]{esc(summary.stop_reason)}[/]", highlight=False)
        console.print(f"Fix it, then: habitrun resume {esc(shlex.quote(recipe_arg))}", highlight=False)

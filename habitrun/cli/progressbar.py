"""The progress bars `run` draws on a terminal: one per stage, with counts, rate, ETA and elapsed time.

Kept apart from :mod:`habitrun.cli.progress` so that a run that draws no bars
(``-q``, output to a file or pipe) never imports ``rich.progress``.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class _RateColumn(ProgressColumn):
    """Subjects per second over the subjects this run computed (cached ones excluded)."""

    def render(self, task: Task) -> Text:
        started = task.fields.get("started")
        ran = task.fields.get("ran", 0)
        if not started or not ran:
            return Text("    -/s", style="progress.data.speed")
        rate = ran / max(time.monotonic() - started, 1e-9)
        return Text(f"{rate:7.1f}/s", style="progress.data.speed")


class _CountsColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        f = task.fields
        text = Text()
        text.append(f"{f.get('done', 0)} done", style="green")
        text.append(" · ")
        text.append(f"{f.get('failed', 0)} failed", style="red" if f.get("failed") else "dim")
        text.append(" · ")
        text.append(f"{f.get('cached', 0)} cached", style="cyan" if f.get("cached") else "dim")
        if f.get("skipped"):
            text.append(f" · {f['skipped']} skipped", style="yellow")
        return text


def stage_bars(console: Console) -> Progress:
    """The (not yet started) progress display, one task per stage added as each starts."""
    return Progress(
        TextColumn("[bold]{task.description:<14}"),
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        _CountsColumn(),
        _RateColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
        refresh_per_second=5,
    )

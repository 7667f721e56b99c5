"""Showing a run as it goes: a progress bar per stage on a terminal, plain lines elsewhere.

The engine emits events; this module only draws them. Plain mode prints a
line when a stage starts, at most every few seconds while it runs, on each
final failure, and when it ends, so a log file or CI output stays readable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console

from habitrun.cli.text import esc
from habitrun.engine.events import (
    CheckpointCleared,
    ConsoleLine,
    Event,
    LargeResult,
    RetryRound,
    RunStarted,
    RunWarning,
    StageDetached,
    StageFinished,
    StagePublished,
    StageStarted,
    Stopping,
    SubjectDone,
    SubjectFailed,
    TrainStarted,
)

if TYPE_CHECKING:
    from rich.progress import Progress

PLAIN_INTERVAL_SEC = 5.0
BAR_UPDATE_SEC = 0.1  # a bar takes the subjects finished since its last update at most this often


def _tag(stage: str) -> str:
    """`[stage]` escaped, so rich does not read it as markup."""
    return esc(f"[{stage}]")


class RunDisplay:
    """Receives engine events; draws bars (terminal), plain lines (not a terminal) or nothing (quiet)."""

    def __init__(self, console: Console | None = None, *, quiet: bool = False, plain: bool | None = None) -> None:
        self.console = console or Console(highlight=False, soft_wrap=True)
        self.quiet = quiet
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self.progress: Progress | None = None
        self.tasks: dict[str, Any] = {}
        self.stats: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> RunDisplay:
        if not self.quiet and not self.plain:
            # rich.progress is imported only to draw a terminal's bars
            from habitrun.cli.progressbar import stage_bars

            self.progress = stage_bars(self.console)
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            for stage in self.tasks:
                self._show(stage)
            self.progress.stop()
            self.progress = None

    # ------------------------------------------------------------------
    def print(self, text: str, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.console.print(text, **kwargs)
        else:
            self.console.print(text, **kwargs)

    def on_event(self, event: Event) -> None:
        """Draw one engine event; when quiet, only what a stop waits for and warnings."""
        handler = _HANDLERS.get(type(event))
        if handler is not None and (not self.quiet or isinstance(event, (Stopping, RunWarning, LargeResult))):
            # even when quiet: what Ctrl-C waits for; a damaged or emptied store, a recipe mismatch
            handler(self, event)

    def _on_warning(self, e: RunWarning) -> None:
        self.print(f"[yellow]warning:[/] {esc(e.message)}")

    def _on_run_started(self, e: RunStarted) -> None:
        resumed = f" (resuming {e.resumed_from})" if e.resumed_from else ""
        self.print(esc(f"habitrun run {e.run_id}{resumed}: {e.subjects} subjects, "
                       f"stages {' -> '.join(e.stages)}"))

    def _on_stage_started(self, e: StageStarted) -> None:
        stage = e.stage
        st = {"total": e.total, "done": 0, "failed": e.recorded_failures, "cached": e.cached,
              "skipped": e.blocked, "ran": 0, "started": time.monotonic(), "last": time.monotonic(),
              "to_run": e.to_run, "unshown": 0, "shown_at": time.monotonic()}
        self.stats[stage] = st
        if self.progress is not None:
            completed = e.cached + e.recorded_failures + e.blocked
            fields: dict[str, Any] = {k: st[k] for k in ("done", "failed", "cached", "skipped", "ran", "started")}
            self.tasks[stage] = self.progress.add_task(esc(stage), total=max(e.total, 1), completed=completed,
                                                       **fields)
        else:
            self.print(f"{_tag(stage)} {esc(e.kind)} stage: {e.total} subject(s), {e.cached} cached, "
                       f"{e.to_run} to run" + (f", {e.blocked} skipped (upstream failed)" if e.blocked else ""))

    def _advance(self, stage: str) -> None:
        st = self.stats.get(stage)
        if st is None:
            return
        if self.progress is not None and stage in self.tasks:
            # One bar update per BAR_UPDATE_SEC, not per subject: an update costs about 20 us,
            # as much as storing the subject, and the bar is redrawn only 5 times a second.
            st["unshown"] += 1
            if time.monotonic() - st["shown_at"] >= BAR_UPDATE_SEC:
                self._show(stage)
        elif self.plain:
            now = time.monotonic()
            if now - st["last"] >= PLAIN_INTERVAL_SEC:
                st["last"] = now
                self._plain_line(stage, st)

    def _show(self, stage: str) -> None:
        """Bring a stage's bar up to date with every subject counted so far."""
        st = self.stats[stage]
        if self.progress is not None and st["unshown"]:
            self.progress.update(self.tasks[stage], advance=st["unshown"],
                                 **{k: st[k] for k in ("done", "failed", "cached", "skipped", "ran")})
            st["unshown"] = 0
        st["shown_at"] = time.monotonic()

    def _plain_line(self, stage: str, st: dict[str, Any]) -> None:
        elapsed = max(time.monotonic() - st["started"], 1e-9)
        rate = st["ran"] / elapsed
        left = st["to_run"] - st["ran"]
        eta = f", ETA {left / rate:.0f}s" if rate > 0 and left > 0 else ""
        self.print(f"{_tag(stage)} {st['done'] + st['cached']}/{st['total']} done, {st['failed']} failed, "
                   f"{st['cached']} cached ({rate:.1f}/s{eta})")

    def _on_subject_done(self, e: SubjectDone) -> None:
        st = self.stats.get(e.stage)
        if st is not None:
            st["done"] += 1
            st["ran"] += 1
        self._advance(e.stage)

    def _on_subject_failed(self, e: SubjectFailed) -> None:
        if not e.final:
            return
        st = self.stats.get(e.stage)
        if st is not None:
            st["failed"] += 1
            st["ran"] += 1
        self.print(f"[red]{_tag(e.stage)} {esc(e.subject)} failed[/] ({esc(e.kind)}): {esc(e.error)}  "
                   f"[dim]log: {esc(e.log)}[/]")
        self._advance(e.stage)

    def _on_retry_round(self, e: RetryRound) -> None:
        kinds = f" ({', '.join(f'{kind}: {n}' for kind, n in e.kinds.items())})" if e.kinds else ""
        named = ""
        if e.subject_ids:
            more = f" and {e.subjects - len(e.subject_ids)} more" if e.subjects > len(e.subject_ids) else ""
            named = f": {', '.join(e.subject_ids)}{more}"
        self.print(f"{_tag(e.stage)} retrying {e.subjects} subject(s), attempt {e.attempt}{esc(kinds + named)}")

    def _on_stage_finished(self, e: StageFinished) -> None:
        if e.stage in self.tasks:
            self._show(e.stage)
        if self.plain:
            self.print(f"{_tag(e.stage)} finished: {e.done} done, {e.cached} cached, {e.failed} failed, "
                       f"{e.skipped} skipped" + (f", {e.not_run} not run" if e.not_run else ""))

    def _on_stage_detached(self, e: StageDetached) -> None:
        self.print(f"{_tag(e.stage)} detached: {e.subjects} subject(s) left to batch job(s) "
                   f"{esc(', '.join(e.jobs))}")

    def _on_stage_published(self, e: StagePublished) -> None:
        removed = f", {e.removed} removed" if e.removed else ""
        self.print(f"{_tag(e.stage)} published {e.files} file(s) to {esc(e.folder)} "
                   f"({e.written} written{removed})")

    def _on_stopping(self, e: Stopping) -> None:
        self.print(f"[yellow]{esc(stopping_text(e))}[/]")

    def _on_checkpoint_cleared(self, e: CheckpointCleared) -> None:
        retried = f", {e.retried} after a retry" if e.retried else ""
        self.print(f"{_tag(e.stage)} checkpoint cleared: {e.records} record(s) removed "
                   f"(clear_checkpoint_on_success; every subject succeeded{retried})")

    def _on_large_result(self, e: LargeResult) -> None:
        self.print(f"[yellow]warning:[/] {esc(large_result_text(e))}")

    def _on_train_started(self, e: TrainStarted) -> None:
        nodes = int(e.nnodes or 1)
        where = f" on {nodes} nodes ({e.nproc_per_node} each)" if nodes > 1 else ""
        self.print(f"{_tag(e.stage)} starting {nodes * e.nproc_per_node} rank(s){where}")

    def _on_console(self, e: ConsoleLine) -> None:
        line = e.line.rstrip("\n")
        if self.progress is not None:
            self.progress.console.print(line, markup=False, highlight=False)
        else:
            self.console.print(line, markup=False, highlight=False)


_HANDLERS: dict[type[Event], Callable[[RunDisplay, Any], None]] = {
    RunWarning: RunDisplay._on_warning,
    RunStarted: RunDisplay._on_run_started,
    StageStarted: RunDisplay._on_stage_started,
    SubjectDone: RunDisplay._on_subject_done,
    SubjectFailed: RunDisplay._on_subject_failed,
    RetryRound: RunDisplay._on_retry_round,
    StageFinished: RunDisplay._on_stage_finished,
    StagePublished: RunDisplay._on_stage_published,
    StageDetached: RunDisplay._on_stage_detached,
    Stopping: RunDisplay._on_stopping,
    CheckpointCleared: RunDisplay._on_checkpoint_cleared,
    TrainStarted: RunDisplay._on_train_started,
    LargeResult: RunDisplay._on_large_result,
    ConsoleLine: RunDisplay._on_console,
}


def large_result_text(e: LargeResult) -> str:
    """The warning about a stage's large result: what it costs, and what to do instead."""
    return (f"stage {e.stage}: the result of subject {e.subject} is {e.size_mb:g} MB pickled (over {e.limit_mb:g} MB); "
            "every result is kept in the checkpoint store and read back by the stages that need it. Write large "
            "data to a file in the subject's work folder (subject.workdir) and return its path instead "
            "(said once per stage)")


def stopping_text(e: Stopping) -> str:
    """``stopping: 2 subjects still running, waiting up to 15 s; Ctrl-C again to stop them now``."""
    again = "Ctrl-C again" if e.signal in (None, "SIGINT") else f"{e.signal} again"
    running = e.running
    train = e.kind == "train"
    if train:
        what = f"{running} rank(s) of stage {e.stage} still running"
    elif running is None:
        what = "the subjects still running"
    else:
        what = f"{running} subject(s) still running"
    if e.now:
        return "stopping now: the ranks are stopped at once" if train else "stopping now: running subjects are stopped at once"
    if e.backend == "serial" and not train:
        return "stopping after the subject that is running (the serial backend cannot stop it early)"
    if not running and not train:
        return "stopping: no subject is running; finishing up"
    return f"stopping: {what}, waiting up to {e.grace_sec or 0:g} s; {again} to stop them now"

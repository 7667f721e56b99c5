"""What a running study is doing now: per stage progress, its rate and ETA, and subjects that look stuck.

Read only, and never through the store lock: the run folder's ``events.jsonl``
(a torn last line is skipped), its ``running.json`` (rewritten each second by
the runner: engine/running_file.py) and the trace in the store, opened
read-only, for the durations a stage's subjects took in this and earlier runs.
A subject running longer than ``STUCK_FACTOR`` times its stage's p95 duration
(and at least ``STUCK_FLOOR_SEC``, so a stage of short subjects does not flag
them all) is named as possibly stuck, with its pid and log.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from habitrun.cli.text import esc
from habitrun.cli.text import human as fmt
from habitrun.errors import StoreError
from habitrun.spec.loader import LoadedRecipe
from habitrun.store.runs import RUNNING_FILE, RunFolder
from habitrun.store.trace import COL, spread
from habitrun.study.opening import open_store

STUCK_FACTOR = 5.0  # running longer than this many times the stage's p95 duration: possibly stuck
STUCK_FLOOR_SEC = 10.0  # ... and never sooner than this (a stage of 50 ms subjects flags nothing at 250 ms)
MIN_LEARNED = 3  # durations needed before an ETA or a stuck flag is given
RATE_WINDOW_SEC = 60.0  # the rate is over the last minute (or the stage so far, if shorter)
STALE_AFTER_SEC = 5.0  # a running file older than this: its runner no longer writes it


@dataclass
class StageLive:
    """One stage of the run as the events tell it so far."""

    name: str
    kind: str = ""
    total: int = 0
    cached: int = 0
    to_run: int = 0
    done: int = 0
    failed: int = 0
    running: int = 0
    started_at: float | None = None
    finished: bool = False
    ends: list[float] = field(default_factory=list)  # when each of its subjects ended in this run
    durations: list[float] = field(default_factory=list)  # of its subjects done in this run
    rate: float | None = None  # subjects per second
    median_sec: float | None = None
    p95_sec: float | None = None
    eta_sec: float | None = None

    @property
    def pending(self) -> int:
        return max(0, self.to_run - self.done - self.failed - self.running)

    @property
    def state(self) -> str:
        return "finished" if self.finished else "running" if self.started_at is not None else "waiting"


@dataclass
class RunningLive:
    """A subject running now (from the running file)."""

    stage: str
    subject: str
    pid: int | None
    elapsed_sec: float
    log: str | None
    output: str | None
    stuck_after_sec: float | None = None  # its stage's threshold (None: not enough durations learned)

    @property
    def stuck(self) -> bool:
        return self.stuck_after_sec is not None and self.elapsed_sec > self.stuck_after_sec


@dataclass
class LiveView:
    """Everything the live part of `status` shows."""

    stages: list[StageLive]
    running: list[RunningLive]
    snapshot_age_sec: float | None  # how old the running file is (None: there is none)

    def as_dict(self) -> dict[str, Any]:
        """The ``live`` part of `status --json`."""
        return {
            "stages": {s.name: {"state": s.state, "total": s.total, "cached": s.cached, "done": s.done,
                                "failed": s.failed, "running": s.running, "pending": s.pending,
                                "rate_per_sec": s.rate, "median_sec": s.median_sec, "p95_sec": s.p95_sec,
                                "eta_sec": s.eta_sec} for s in self.stages},
            "running": [{"stage": r.stage, "subject": r.subject, "pid": r.pid, "elapsed_sec": round(r.elapsed_sec, 3),
                         "log": r.log, "output": r.output, "stuck_after_sec": r.stuck_after_sec,
                         "possibly_stuck": r.stuck} for r in self.running],
            "running_file_age_sec": self.snapshot_age_sec,
        }


def read_stages(run: RunFolder) -> list[StageLive]:
    """Per stage, what the run's events say so far (in the order the run named its stages)."""
    stages: dict[str, StageLive] = {}
    for e in run.events.read():
        kind, name = e.get("event"), e.get("stage")
        if kind == "run_started":
            for s in e.get("stages") or ():
                stages.setdefault(str(s), StageLive(str(s)))
            continue
        if not isinstance(name, str):
            continue
        st = stages.setdefault(name, StageLive(name))
        if kind == "stage_started":
            st.kind, st.started_at = str(e.get("kind") or ""), _num(e.get("ts"))
            st.total, st.cached, st.to_run = int(e.get("total") or 0), int(e.get("cached") or 0), int(e.get("to_run") or 0)
        elif kind == "subject_done":
            st.done += 1
            _ended(st, e)
            if isinstance(e.get("duration_sec"), (int, float)):
                st.durations.append(float(e["duration_sec"]))
        elif kind == "subject_failed" and e.get("final", True):
            st.failed += 1
            _ended(st, e)
        elif kind == "stage_finished":
            st.finished = True
    return list(stages.values())


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _ended(st: StageLive, event: dict[str, Any]) -> None:
    ts = _num(event.get("ts"))
    if ts is not None:
        st.ends.append(ts)


def read_running(run: RunFolder) -> tuple[list[dict[str, Any]], float | None, str | None]:
    """The running file's subjects, its age in seconds and its stage (nothing when absent or unreadable)."""
    try:
        data = json.loads((run.path / RUNNING_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], None, None
    if not isinstance(data, dict) or _num(data.get("ts")) is None:
        return [], None, None
    age = time.time() - float(data["ts"])
    subjects = [s for s in data.get("subjects") or () if isinstance(s, dict)]
    return subjects, age, data.get("stage")


def learned_durations(store: Any, stage: str) -> list[float]:
    """Durations of the stage's subjects that succeeded, in this run and earlier ones (the trace)."""
    if store is None:
        return []
    wall, outcome = COL["wall_sec"], COL["outcome"]
    return [row[wall] for row in store.trace(stage=stage) if row[outcome] == "done" and row[wall] is not None]


def live_view(run: RunFolder, store: Any, now: float | None = None) -> LiveView:
    """The run's live view now; ``store``: the study's store opened read-only (or None)."""
    now = time.time() if now is None else now
    stages = read_stages(run)
    subjects, age, running_stage = read_running(run)
    if age is not None and age > STALE_AFTER_SEC:
        subjects = []  # the runner stopped writing it: what it names may have ended since
    by_name = {s.name: s for s in stages}
    for s in stages:
        if s.started_at is None or s.finished:
            continue
        learned = learned_durations(store, s.name) or s.durations
        if len(learned) >= MIN_LEARNED:
            sp = spread(learned)
            s.median_sec, s.p95_sec = sp["median"], sp["p95"]
        if s.name == running_stage:
            s.running = len(subjects)
        s.rate = _rate(s, now)
    running = []
    for r in subjects:
        st = by_name.get(str(running_stage))
        threshold = None
        if st is not None and st.p95_sec is not None:
            threshold = max(STUCK_FACTOR * st.p95_sec, STUCK_FLOOR_SEC)
        started = _num(r.get("started_at"))
        running.append(RunningLive(str(running_stage), str(r.get("subject")), r.get("pid"),
                                   max(0.0, now - started) if started is not None else 0.0,
                                   r.get("log"), r.get("output"), threshold))
    running.sort(key=lambda r: -r.elapsed_sec)
    for s in stages:  # a stuck subject makes its stage's end unknown
        if s.median_sec is not None and not (s.name == running_stage and any(r.stuck for r in running)):
            s.eta_sec = eta(s, [r.elapsed_sec for r in running] if s.name == running_stage else [])
    return LiveView(stages, running, None if age is None else round(age, 3))


def eta(s: StageLive, elapsed: list[float]) -> float:
    """Seconds until the stage ends, by its median duration: the pending subjects in waves over the slots
    running now, after what the running ones have left (a stuck subject makes it unknown: not called)."""
    median = s.median_sec or 0.0
    slots = max(1, s.running)
    left_running = max((max(0.0, median - e) for e in elapsed), default=0.0)
    return left_running + math.ceil(s.pending / slots) * median


def _rate(s: StageLive, now: float) -> float | None:
    """Subjects ended per second over the last minute, or since the stage started if that is shorter."""
    if s.started_at is None:
        return None
    span = min(RATE_WINDOW_SEC, now - s.started_at)
    if span <= 0:
        return None
    return sum(1 for t in s.ends if t >= now - span) / span


def render(view: LiveView, shown_running: int = 10) -> Group:
    """The live view as rich renderables: the stage table, then the subjects running now, stuck ones first."""
    table = Table(title="live progress", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for header, justify in (("stage", "left"), ("state", "left"), ("done", "right"), ("failed", "right"),
                            ("running", "right"), ("pending", "right"), ("rate", "right"), ("ETA", "right")):
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    stuck = [r for r in view.running if r.stuck]
    for s in view.stages:
        rate = f"{s.rate:.3g}/s" if s.rate is not None else "–"
        eta = ("about " + fmt(s.eta_sec, "s")) if s.eta_sec is not None else "?" if stuck else "–"
        if s.state == "waiting":
            table.add_row(esc(s.name), "waiting", "", "", "", "", "", "")
            continue
        table.add_row(esc(s.name), s.state, str(s.done + s.cached), _red(s.failed), str(s.running),
                      str(s.pending), rate if s.state == "running" else "–", eta if s.state == "running" else "–")
    parts: list[Any] = [table]
    for r in stuck:
        parts.append(Text.from_markup(
            f"[bold yellow]possibly stuck:[/] {esc(r.stage)} {esc(r.subject)} running for {fmt(r.elapsed_sec, 's')} "
            f"(over {STUCK_FACTOR:g}× the stage's p95, {fmt(r.stuck_after_sec, 's')}) on pid {esc(r.pid)}"))
        parts.append(Text.from_markup(f"      log: {esc(r.log)}"))
        if r.output:
            parts.append(Text.from_markup(f"      output so far in its worker's file: {esc(r.output)}"))
    others = [r for r in view.running if not r.stuck][:shown_running]
    if others:
        lines = [f"  {esc(r.stage)} {esc(r.subject)}: {fmt(r.elapsed_sec, 's')} on pid {esc(r.pid)}" for r in others]
        more = len(view.running) - len(stuck) - len(others)
        parts.append(Text.from_markup("subjects running:\n" + "\n".join(lines) + (f"\n  ... and {more} more" if more > 0 else "")))
    if view.snapshot_age_sec is None:
        parts.append(Text("(no running.json yet: which subjects run, and on which pid, is not known)"))
    elif view.snapshot_age_sec > STALE_AFTER_SEC:
        parts.append(Text(f"(running.json was last written {fmt(view.snapshot_age_sec, 's')} ago: the runner may be stuck)"))
    return Group(*parts)


def _red(n: int) -> str:
    return f"[red]{n}[/]" if n else "0"



def view_of(loaded: LoadedRecipe, run: RunFolder) -> LiveView:
    """The live view of ``run``, its learned durations read from the study's store opened read-only."""
    try:
        store = open_store(loaded)
    except StoreError:  # a damaged store: `status` says so; the events alone still tell the progress
        store = None
    try:
        return live_view(run, store)
    finally:
        if store is not None:
            store.close()

"""The run display: bars with counts on a terminal, readable plain lines elsewhere, nothing with --quiet."""

from __future__ import annotations

import io

from rich.console import Console

from habitrun.cli.progress import RunDisplay
from habitrun.engine.events import parse_event  # events as the events file holds them

EVENTS = [
    {"event": "run_started", "run_id": "r1", "subjects": 3, "stages": ["features"], "resumed_from": None},
    {"event": "stage_started", "stage": "features", "kind": "map", "total": 3, "cached": 1, "to_run": 2,
     "blocked": 0, "recorded_failures": 0},
    {"event": "subject_done", "stage": "features", "subject": "A", "attempt": 1},
    {"event": "subject_failed", "stage": "features", "subject": "B", "attempt": 1, "kind": "exception",
     "error": "ValueError: bad voxel", "final": True, "log": "/tmp/B.log"},
    {"event": "stage_finished", "stage": "features", "total": 3, "done": 1, "cached": 1, "failed": 1,
     "skipped": 0, "not_run": 0},
]


def render(**kwargs: object) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=140, force_terminal=kwargs.pop("terminal", False), color_system=None)
    with RunDisplay(console, **kwargs) as display:  # type: ignore[arg-type]
        for event in EVENTS:
            display.on_event(parse_event(event))
    return buffer.getvalue()


def test_terminal_shows_a_bar_with_done_failed_cached_counts() -> None:
    out = render(terminal=True)
    assert "features" in out
    assert "3/3" in out
    assert "1 done" in out and "1 failed" in out and "1 cached" in out
    assert "B failed" in out and "ValueError: bad voxel" in out


def test_plain_output_is_lines_without_control_sequences() -> None:
    out = render(terminal=False)
    assert "\x1b[" not in out
    assert "[features] map stage: 3 subject(s), 1 cached, 2 to run" in out
    assert "[features] finished: 1 done, 1 cached, 1 failed, 0 skipped" in out
    assert "/tmp/B.log" in out


def test_quiet_prints_nothing_while_running() -> None:
    assert render(quiet=True) == ""


def test_a_bar_takes_many_subjects_per_update_and_ends_exact_even_without_stage_finished() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=140, force_terminal=True, color_system=None)
    with RunDisplay(console) as display:
        assert display.progress is not None
        updates = []
        real_update = display.progress.update
        display.progress.update = lambda *a, **k: (updates.append(k.get("advance")), real_update(*a, **k))[1]
        display.on_event(parse_event({"event": "stage_started", "stage": "features", "kind": "map",
                                      "total": 500, "cached": 0, "to_run": 500}))
        for i in range(500):  # far faster than one update per BAR_UPDATE_SEC
            display.on_event(parse_event({"event": "subject_done", "stage": "features", "subject": f"S{i}",
                                          "attempt": 1}))
        # interrupted: no stage_finished; leaving the display shows what was counted
    assert len(updates) < 50 and sum(a for a in updates if a) == 500
    assert "500/500" in buffer.getvalue() and "500 done" in buffer.getvalue()


MARKUP_EVENTS = [
    {"event": "warning", "message": "odd [/x] value [bold red]y"},
    {"event": "run_started", "run_id": "r[/x]", "subjects": 1, "stages": ["f[/x]"], "resumed_from": None},
    {"event": "stage_started", "stage": "f[/x]", "kind": "map", "total": 1, "cached": 0, "to_run": 1,
     "blocked": 0, "recorded_failures": 0},
    {"event": "subject_failed", "stage": "f[/x]", "subject": "[link=file:///etc]s", "attempt": 1,
     "kind": "exception", "error": "FileNotFoundError: no image for [/data/S002/ct.nii]", "final": True,
     "log": "/tmp/[bold red]s.log"},
    {"event": "console", "line": "[f/0] rank says [/x]\n"},
    {"event": "stage_finished", "stage": "f[/x]", "total": 1, "done": 0, "cached": 0, "failed": 1,
     "skipped": 0, "not_run": 0},
]


def test_markup_in_events_is_drawn_literally_on_bars_and_plain_lines() -> None:
    for terminal in (True, False):
        buffer = io.StringIO()
        console = Console(file=buffer, width=200, force_terminal=terminal, color_system=None)
        with RunDisplay(console) as display:
            for event in MARKUP_EVENTS:
                display.on_event(parse_event(event))
        out = buffer.getvalue()
        for text in ("odd [/x] value [bold red]y", "f[/x]", "[link=file:///etc]s failed",
                     "no image for [/data/S002/ct.nii]", "/tmp/[bold red]s.log", "[f/0] rank says [/x]"):
            assert text in out, (terminal, text, out)

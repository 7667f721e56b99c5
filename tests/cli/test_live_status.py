"""`status` of a running study: per stage progress and a hung subject flagged with its pid and log;
`status --watch` refreshes until the run ends, or stops on Ctrl-C with 130 (the real CLI, a real run on
the process backend, real signals)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pexpect
import pytest
from rich.console import Console

from habitrun.cli.live import STUCK_FLOOR_SEC, StageLive, eta, live_view, render
from habitrun.store.runs import RunFolder
from tests.engine.study import events, habitrun_cmd, make_study, markers, run_cli
from tests.engine.test_crash_safety import start_run
from tests.engine.test_status_truth import stop_if_running


def wait_for(check, what: str, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        assert proc.poll() is None, f"the process ended before {what}"
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


def start_watch(recipe: Path, out: Path, interval: str = "0.2") -> subprocess.Popen[str]:
    return subprocess.Popen(habitrun_cmd("status", str(recipe), "--watch", "--interval", interval),
                            stdout=open(out, "w"), stderr=subprocess.STDOUT, text=True, cwd=recipe.parent)


@pytest.mark.slow  # waits out STUCK_FLOOR_SEC (10 s) by design
@pytest.mark.timeout(150)
def test_a_hung_subject_is_flagged_with_its_pid_and_log_and_watch_stops_on_ctrl_c(tmp_path: Path) -> None:
    folder = tmp_path / "study [x]"  # brackets: markup in a path must be printed as is
    gate = tmp_path / "never"
    recipe = make_study(folder, subjects=5, policy={"workers": 2, "subject_timeout_sec": None},
                        square_params={"sleep": 0.1, "gate": str(gate), "gate_from": 4})
    run = start_run(recipe)
    watcher: subprocess.Popen[str] | None = None
    try:
        done = lambda: sum(1 for e in events(folder) if e.get("event") == "subject_done") >= 4  # noqa: E731
        wait_for(done, "four subjects done", run)
        hung = markers(folder)["square-S004"][0]  # (start, time, pid): S004 waits at the gate for ever
        time.sleep(max(0.0, hung[1] + STUCK_FLOOR_SEC + 1.5 - time.time()))

        doc = json.loads(run_cli("status", str(recipe), "--json", cwd=folder).stdout)
        assert doc["run"]["outcome"].startswith("running")
        live = doc["live"]
        square = live["stages"]["square"]
        assert (square["state"], square["done"], square["failed"], square["running"], square["pending"]) == \
            ("running", 4, 0, 1, 0), square
        assert square["median_sec"] is not None and square["rate_per_sec"] > 0
        assert square["eta_sec"] is None  # not while a subject looks stuck: the median says nothing of it
        assert live["stages"]["plus_one"]["state"] == "waiting"
        [running] = live["running"]
        assert (running["subject"], running["pid"], running["possibly_stuck"]) == ("S004", hung[2], True), running
        run_folder = Path(doc["run"]["path"])
        assert running["log"] == str(run_folder / "logs" / "square" / "S004.log")

        both = run_cli("status", str(recipe), "--json", "--watch", cwd=folder)
        assert both.returncode == 2 and "--watch redraws the status for people" in both.stderr

        text = run_cli("status", str(recipe), cwd=folder)
        assert text.returncode == 0, text.stdout + text.stderr
        out = " ".join(text.stdout.split())  # the console may wrap a long line
        assert "live progress" in out and "possibly stuck: square S004 running for" in out, text.stdout
        assert f"on pid {hung[2]}" in out and f"log: {run_folder / 'logs' / 'square' / 'S004.log'}" in out, text.stdout
        assert "Traceback" not in text.stdout + text.stderr

        shown = tmp_path / "watch.txt"
        watcher = start_watch(recipe, shown)
        wait_for(lambda: shown.read_text().count("possibly stuck: square S004") >= 2, "two refreshes", watcher)
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=30) == 130
        assert "stopped watching; the run goes on" in shown.read_text() and "Traceback" not in shown.read_text()
        assert run.poll() is None  # watching never touched the run
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        stop_if_running(run)


@pytest.mark.timeout(150)
def test_watch_follows_the_run_to_its_end_and_exits_with_the_final_status(tmp_path: Path) -> None:
    folder = tmp_path / "study"
    gate = tmp_path / "open"
    recipe = make_study(folder, subjects=4, square_params={"gate": str(gate)})
    run = start_run(recipe)
    watcher: subprocess.Popen[str] | None = None
    try:
        started = lambda: any(e.get("event") == "stage_started" for e in events(folder))  # noqa: E731
        wait_for(started, "the first stage started", run)
        shown = tmp_path / "watch.txt"
        watcher = start_watch(recipe, shown)
        wait_for(lambda: "live progress" in shown.read_text(), "a first refresh", watcher)
        gate.write_text("")  # the subjects go on: the run ends
        assert watcher.wait(timeout=90) == 0, shown.read_text()
        assert run.wait(timeout=30) == 0
        text = shown.read_text()
        final = text[text.rindex("live progress"):]
        assert ": success" in final and "no failed subjects" in final, text
        assert "running (pid" in text  # the refreshes said it was running
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        stop_if_running(run)


@pytest.mark.timeout(150)
def test_ctrl_c_stops_watch_on_a_terminal_with_130_and_the_run_goes_on(tmp_path: Path) -> None:
    # the Ctrl-C path of the two `slow` tests above without their wait for a stuck subject
    # (.ci/matrix runs this one on every Python)
    folder = tmp_path / "study"
    recipe = make_study(folder, subjects=3, square_params={"gate": str(tmp_path / "never")})
    run = start_run(recipe)
    child = None
    try:
        started = lambda: any(e.get("event") == "stage_started" for e in events(folder))  # noqa: E731
        wait_for(started, "the first stage started", run)
        child = pexpect.spawn(habitrun_cmd()[0], [*habitrun_cmd("status", str(recipe), "--watch", "--interval", "0.2")[1:]],
                              cwd=str(folder), env={**os.environ, "TERM": "xterm-256color"}, encoding="utf-8",
                              timeout=60, dimensions=(40, 160))
        child.expect("live progress")
        child.expect("live progress")  # redrawn in place
        child.sendintr()
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 130
        assert "stopped watching; the run goes on" in child.before and "Traceback" not in child.before
        assert "\x1b[?25h" in child.before  # the cursor rich hid is shown again
        assert run.poll() is None  # watching never touched the run
    finally:
        if child is not None:
            child.close(force=True)
        stop_if_running(run)


def test_the_eta_is_what_the_running_subjects_have_left_then_the_pending_ones_in_waves() -> None:
    stage = StageLive("square", to_run=10, done=4, running=2, median_sec=1.0)  # 4 pending over 2 slots
    assert eta(stage, [0.5, 0.2]) == pytest.approx(0.8 + 2 * 1.0)
    assert eta(stage, [3.0, 2.5]) == pytest.approx(2.0)  # past the median: nothing left is assumed


@pytest.mark.slow  # waits out STUCK_FLOOR_SEC (10 s) by design
@pytest.mark.timeout(150)
def test_serial_backend_names_the_runner_and_watch_on_a_terminal_restores_it_on_ctrl_c(tmp_path: Path) -> None:
    folder = tmp_path / "study"
    recipe = make_study(folder, subjects=4, policy={"backend": "serial", "workers": 1, "subject_timeout_sec": None},
                        square_params={"sleep": 0.05, "gate": str(tmp_path / "never"), "gate_from": 3})
    run = start_run(recipe)
    child = None
    try:
        wait_for(lambda: "square-S003" in markers(folder), "S003 started", run)
        time.sleep(max(0.0, markers(folder)["square-S003"][0][1] + STUCK_FLOOR_SEC + 1.5 - time.time()))
        doc = json.loads(run_cli("status", str(recipe), "--json", cwd=folder).stdout)
        [running] = doc["live"]["running"]
        assert (running["subject"], running["pid"], running["possibly_stuck"]) == ("S003", run.pid, True), running

        child = pexpect.spawn(habitrun_cmd()[0], [*habitrun_cmd("status", str(recipe), "--watch", "--interval", "0.2")[1:]],
                              cwd=str(folder), env={**os.environ, "TERM": "xterm-256color"}, encoding="utf-8",
                              timeout=60, dimensions=(40, 160))
        flagged = r"possibly stuck:\S*\s+square S003"  # styled: an escape code after the colon
        child.expect(flagged)
        child.expect(flagged)  # redrawn in place
        child.sendintr()
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 130
        assert "stopped watching; the run goes on" in child.before
        assert "\x1b[?25h" in child.before  # the cursor rich hid is shown again
        assert run.poll() is None
    finally:
        if child is not None:
            child.close(force=True)
        stop_if_running(run)


def test_the_events_are_read_past_a_torn_last_line_and_a_long_runner_is_flagged_by_the_events_durations(
        tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "run", {})
    run.path.mkdir()
    now = time.time()
    lines = [{"ts": now - 30, "event": "run_started", "stages": ["a", "b"]},
             {"ts": now - 30, "event": "stage_started", "stage": "a", "kind": "map", "total": 6, "cached": 0,
              "to_run": 6},
             *({"ts": now - 29 + i, "event": "subject_done", "stage": "a", "subject": f"S{i}", "duration_sec": 0.5}
               for i in range(3)),
             {"ts": now - 20, "event": "subject_failed", "stage": "a", "subject": "S3", "final": False},
             {"ts": now - 19, "event": "subject_failed", "stage": "a", "subject": "S3", "final": True}]
    text = "".join(json.dumps(e) + "\n" for e in lines) + '{"ts": 1, "event": "subject_do'  # torn by a SIGKILL
    (run.path / "events.jsonl").write_text(text)
    running = [{"subject": "S4", "pid": 4242, "started_at": now - 25, "log": "/logs/a/S4 [x].log"},
               {"subject": "S5", "pid": 4243, "started_at": now - 1, "log": "/logs/a/S5.log"}]
    (run.path / "running.json").write_text(json.dumps({"ts": now, "stage": "a", "subjects": running}))
    view = live_view(run, None, now)
    a, b = view.stages
    assert (a.state, a.done, a.failed, a.running, a.pending, b.state) == ("running", 3, 1, 2, 0, "waiting")
    assert a.rate == pytest.approx(4 / 30) and a.median_sec == 0.5 and a.eta_sec is None
    stuck, fine = view.running
    assert (stuck.subject, stuck.stuck, stuck.stuck_after_sec, fine.stuck) == ("S4", True, STUCK_FLOOR_SEC, False)
    console = Console(width=200, file=io.StringIO(), color_system=None)
    console.print(render(view))
    shown = console.file.getvalue()
    assert "possibly stuck: a S4 running for 25.0 s" in shown and "on pid 4242" in shown
    assert "log: /logs/a/S4 [x].log" in shown  # escaped: printed as is

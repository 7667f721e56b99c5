"""A stop (Ctrl-C, SIGTERM) never turns into a recorded subject failure; resume runs the rest.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group. The
runner alone decides how its workers stop: they and the fork server live
outside that group, and a worker's death once a stop was asked for is "not
run", never "failed".
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine.study import events, habitrun_cmd, make_study, markers, run_cli
from tests.engine.test_crash_safety import stored_results

SUBJECTS = 160


def _study(tmp_path: Path, subjects: int, sleep: float = 0.03, sleep2: float = 0.03) -> Path:
    recipe = make_study(tmp_path / "study", subjects=subjects, square_params={"sleep": sleep},
                        plus_params={"sleep": sleep2}, policy={"graceful_shutdown_sec": 1})
    data = json.loads(recipe.read_text())
    data["stages"][1]["policy"] = {"parallel_mode": "isolated"}  # stage 2: a fresh process per subject
    recipe.write_text(json.dumps(data))
    return recipe


def _start(recipe: Path, command: str) -> subprocess.Popen[str]:
    # A group of its own, as a shell gives a foreground job: killpg is the terminal's Ctrl-C.
    return subprocess.Popen(habitrun_cmd(command, str(recipe)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _failed_events(folder: Path) -> list[dict]:
    return [e for e in events(folder) if e.get("event") == "subject_failed"]


def _runs(folder: Path) -> set[str]:
    runs = folder / ".habitrun" / "runs"
    return {p.name for p in runs.glob("*")} if runs.exists() else set()


def _wait_for_new_run(folder: Path, before: set[str], proc: subprocess.Popen[str]) -> Path | None:
    """Until the runner has made its run folder (a Ctrl-C during Python's own start-up is not ours)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        new = _runs(folder) - before
        if new:
            return folder / ".habitrun" / "runs" / new.pop()
        time.sleep(0.01)
    return None


def _started(folder: Path, stage: str) -> int:
    """Marker lines of ``stage``'s subjects that started (every attempt, every run)."""
    return sum(file.read_text().count("start") for file in (folder / "markers").glob(f"{stage}*.log"))


def _wait_for_start(folder: Path, stage: str, before: int, proc: subprocess.Popen[str]) -> None:
    """Until a subject of ``stage`` starts in this run (its own marker, not the event log's timing)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if _started(folder, stage) > before:
            return
        time.sleep(0.005)


def _interrupted_in(folder: Path) -> set[str]:
    """The stages interrupted runs were in when they stopped."""
    stages = set()
    for run in (folder / ".habitrun" / "runs").glob("*"):
        stage = None
        for line in (run / "events.jsonl").read_text().splitlines():
            e = json.loads(line)
            if e.get("event") == "stage_started":
                stage = e["stage"]
            if e.get("event") == "run_finished" and e.get("outcome") == "interrupted" and stage:
                stages.add(stage)
    return stages


@pytest.mark.timeout(150)
def test_group_sigints_at_random_moments_record_no_failure_and_resume_completes(tmp_path: Path) -> None:
    # about 2 s of work in the persistent stage, 5 s in the isolated one: interrupted runs land in both
    # (isolated subjects start in ~10 ms now, so each sleeps 50 ms: the stage lasts long enough to be hit)
    recipe = _study(tmp_path, subjects=SUBJECTS, sleep=0.02, sleep2=0.05)
    folder = recipe.parent
    rng = random.Random(17)
    outputs = []
    interrupted = 0
    t0 = time.monotonic()
    in_isolated = 0  # rounds aimed at the isolated stage
    for attempt in range(20):
        if time.monotonic() - t0 > 45 and in_isolated >= 4:
            break  # a starved machine: fewer rounds, the same checks
        aim_isolated = attempt >= 5 or time.monotonic() - t0 > 20
        in_isolated += aim_isolated
        runs_before = _runs(folder)
        plus_started = _started(folder, "plus_one")
        proc = _start(recipe, "run" if attempt == 0 else "resume")
        run_dir = _wait_for_new_run(folder, runs_before, proc)
        if aim_isolated and run_dir is not None:
            _wait_for_start(folder, "plus_one", plus_started, proc)  # the isolated stage is running
            time.sleep(rng.uniform(0.0, 0.6))
        else:
            time.sleep(rng.uniform(0.0, 0.6))
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate(timeout=60)
        outputs.append(out)
        assert proc.returncode in (0, 130), out
        interrupted += proc.returncode == 130
        assert "Traceback" not in out, out
        assert not _failed_events(folder), _failed_events(folder)
    assert interrupted >= 3, f"only {interrupted} runs were really interrupted"
    assert {"square", "plus_one"} <= _interrupted_in(folder), _interrupted_in(folder)
    final = run_cli("resume", str(recipe), "--quiet", timeout=120)
    assert final.returncode == 0, final.stdout + final.stderr
    assert not _failed_events(folder)
    results = stored_results(recipe)
    assert all(results[("plus_one", f"S{i:03d}")] == i * i + 1 for i in range(SUBJECTS))
    stages = [e["stage"] for e in events(folder) if e.get("event") == "subject_done"]
    assert "square" in stages and "plus_one" in stages


@pytest.mark.timeout(120)
def test_sigterm_to_the_runner_during_an_isolated_stage_records_no_failure(tmp_path: Path) -> None:
    recipe = _study(tmp_path, subjects=40)
    folder = recipe.parent
    for attempt in range(4):
        proc = _start(recipe, "run" if attempt == 0 else "resume")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if any(e.get("event") == "stage_started" and e.get("stage") == "plus_one" for e in events(folder)):
                break
            time.sleep(0.02)
        time.sleep(0.3 + 0.25 * attempt)  # booting the preloaded fork server, then spawning
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode in (0, 143, -signal.SIGTERM), out  # the CLI ends by its signal
        assert "Traceback" not in out, out
        assert not _failed_events(folder), _failed_events(folder)
    final = run_cli("resume", str(recipe), "--quiet", timeout=120)
    assert final.returncode == 0, final.stdout + final.stderr
    assert not _failed_events(folder)


def _latencies(folder: Path, stage: str) -> list[float]:
    """Per subject: from the operator's last line to its subject_done event (written once committed)."""
    ends = {key.split("-", 1)[1]: max(t for what, t, _ in entries if what == "end")
            for key, entries in markers(folder).items() if key.startswith(stage + "-")}
    done = {e["subject"]: float(e["ts"]) for e in events(folder)
            if e.get("event") == "subject_done" and e.get("stage") == stage}
    return [done[sid] - end for sid, end in ends.items()]


@pytest.mark.timeout(120)
def test_a_finished_subject_is_committed_within_the_documented_window_in_both_modes(tmp_path: Path) -> None:
    # documented: 40 ms hold + 50 ms commit; a loaded machine gets slack, the 0.8 s of a
    # fork server booted before reporting does not
    recipe = _study(tmp_path, subjects=16, sleep=0.05, sleep2=0.05)
    result = run_cli("run", str(recipe), "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    for stage in ("square", "plus_one"):  # persistent, isolated
        latencies = _latencies(recipe.parent, stage)
        assert len(latencies) == 16
        assert max(latencies) < 0.5, (stage, sorted(latencies))


CANNOT_START = """
import multiprocessing, sys
multiprocessing.set_executable(sys.argv[1])  # every worker start (forkserver or spawn) execs this
from habitrun.cli.app import main
main(sys.argv[2:])
"""


@pytest.mark.timeout(60)
def test_workers_that_cannot_start_stop_the_run_with_exit_2_naming_the_cause_and_no_failure(tmp_path: Path) -> None:
    recipe = make_study(tmp_path / "study", subjects=30)
    not_executable = tmp_path / "python"
    not_executable.write_text("#!/bin/sh\n")
    not_executable.chmod(0o644)
    script = tmp_path / "habitrun_with_a_bad_interpreter.py"
    script.write_text(CANNOT_START)
    done = subprocess.run([sys.executable, str(script), str(not_executable), "run", str(recipe)],
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot start a worker process" in done.stderr and "Permission denied" in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert not _failed_events(recipe.parent)
    assert not [e for e in events(recipe.parent) if e.get("event") == "subject_done"]
    [finished] = [e for e in events(recipe.parent) if e.get("event") == "run_finished"]
    assert finished["outcome"] == "error" and finished["exit_code"] == 2

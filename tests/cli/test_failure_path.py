"""The user's path through a failure, typed as a user would: what the summary, plan and
status say, the command that retries recorded failures, and which failures are retried."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

OPS = '''
import json, os, signal
from pathlib import Path

HERE = Path(__file__).parent

def measure(subject, offset):
    with open(HERE / "calls.txt", "a") as f:
        f.write(f"measure {subject.id}\\n")
    if subject.id in os.environ.get("FAIL", "").split(","):
        raise ValueError(f"no scan for {subject.id} in [/data]")
    if subject.id in os.environ.get("HANG", "").split(","):
        import time
        time.sleep(60)
    if subject.id in os.environ.get("DIE", "").split(","):
        marker = HERE / f"died-{subject.id}"
        if not marker.exists():
            marker.write_text("x")
            os.kill(os.getpid(), signal.SIGKILL)
    return offset + len(subject.id)

def double(subject):
    with open(HERE / "calls.txt", "a") as f:
        f.write(f"double {subject.id}\\n")
    return 2 * subject.inputs["a"]

def table(results):
    (results.workdir / "table.csv").write_text("id,value\\n")
    (results.workdir / "notes.txt").write_text("x")
    return {"subjects": len(results), "file": str(results.workdir / "table.csv")}
'''

RECIPE = """\
habitrun: 1
name: failure-path
subjects: {manifest: subjects.csv}
policy: {backend: serial, subject_timeout_sec: null}
stages:
  - {name: a, operator: "ops:measure", params: {offset: 1}}
  - {name: b, operator: "ops:double", needs: [a]}
  - {name: summary, kind: collect, operator: "ops:table", needs: [b]}
"""

IDS = ["S1", "S2", "[bold]x"]


def habitrun(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=90, cwd=cwd, env={**os.environ, **(env or {})})
    out = done.stdout + done.stderr
    assert "Traceback" not in out and "MarkupError" not in out, out
    return done


@pytest.fixture
def study(tmp_path: Path) -> Path:
    (tmp_path / "ops.py").write_text(OPS)
    (tmp_path / "subjects.csv").write_text("subject_id\n" + "".join(f"{i}\n" for i in IDS))
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    return tmp_path / "recipe.yaml"


def calls(recipe: Path) -> list[str]:
    path = recipe.parent / "calls.txt"
    return path.read_text().splitlines() if path.exists() else []


def runs(recipe: Path) -> list[Path]:
    folder = recipe.parent / ".habitrun" / "runs"
    return sorted(folder.iterdir()) if folder.is_dir() else []


@pytest.mark.timeout(120)
def test_recorded_failures_say_how_to_retry_them_and_the_command_works(study: Path) -> None:
    folder = study.parent
    first = habitrun("run", "recipe.yaml", env={"FAIL": "[bold]x"}, cwd=folder)
    assert first.returncode == 1, first.stdout + first.stderr
    line = next(x for x in first.stdout.splitlines() if x.startswith("  a [bold]x:"))
    assert "exception: ValueError: no scan for [bold]x in [/data]" in line
    log = Path(line.split("(log: ", 1)[1].rstrip(")"))
    assert log.is_file() and "no scan for" in log.read_text()
    assert "b [bold]x" not in first.stdout  # skipped, not failed
    assert calls(study).count("measure [bold]x") == 1  # an exception is not retried by default

    plan = habitrun("plan", "recipe.yaml", cwd=folder)
    assert "1 recorded failure(s) will not be retried; retry them with: habitrun run recipe.yaml --retry-failed" \
        in plan.stdout

    again = habitrun("run", "recipe.yaml", cwd=folder)
    assert again.returncode == 1
    out = again.stdout.splitlines()
    assert out[0].startswith("nothing to run: 5 subject-stage(s) already stored as done, 1 recorded failure(s)")
    assert any(x.startswith("  a [bold]x: recorded failure: exception: ValueError") for x in out)
    command = next(x for x in out if x.startswith("retry them with: ")).split(": ", 1)[1]
    assert command == "habitrun run recipe.yaml --retry-failed"
    assert len(runs(study)) == 1  # nothing ran: no run folder

    argv = shlex.split(command)
    retried = habitrun(*argv[1:], cwd=folder)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "run " in retried.stdout and ": success" in retried.stdout
    assert calls(study).count("measure [bold]x") == 2 and calls(study).count("double [bold]x") == 1

    status = habitrun("status", "recipe.yaml", cwd=folder)
    assert status.returncode == 0 and "no failed subjects" in status.stdout


@pytest.mark.timeout(120)
def test_status_shows_kind_and_log_and_exits_1_after_a_failed_run(study: Path) -> None:
    folder = study.parent
    assert habitrun("run", "recipe.yaml", "-q", env={"FAIL": "S2"}, cwd=folder).returncode == 1
    status = habitrun("status", "recipe.yaml", cwd=folder)
    assert status.returncode == 1
    assert "a S2: exception: ValueError: no scan for S2 in [/data]" in status.stdout
    assert "log: " in status.stdout and ": failed" in status.stdout.splitlines()[0]
    assert habitrun("status", "recipe.yaml", "--json", cwd=folder).returncode == 1


@pytest.mark.timeout(120)
def test_rerun_chosen_subjects_of_one_stage(study: Path) -> None:
    folder = study.parent
    assert habitrun("run", "recipe.yaml", "-q", cwd=folder).returncode == 0
    before = calls(study)
    done = habitrun("run", "recipe.yaml", "--rerun", "S1", "--rerun", "[bold]x", "--stage", "a", cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls(study)[len(before):] == ["measure S1", "measure [bold]x"]  # only stage a, only those two
    assert "3 subjects, stages a\n" in done.stdout and "summary" not in done.stdout

    whole = habitrun("run", "recipe.yaml", "--stage", "b", "--rerun", "S2", cwd=folder)
    assert whole.returncode == 0 and calls(study)[-1] == "double S2"
    n = len(calls(study))
    resumed = habitrun("resume", "recipe.yaml", "--stage", "b", "--rerun", "S2", cwd=folder)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # the run resumed from stored S2's b; asked again by name, it reruns even within the resume chain
    assert calls(study)[n:] == ["double S2"]

    bad = habitrun("run", "recipe.yaml", "--rerun", "S9", "--stage", "sumary", cwd=folder)
    assert bad.returncode == 2 and "--stage 'sumary': no such stage in the recipe; did you mean 'summary'?" in bad.stderr
    bad = habitrun("run", "recipe.yaml", "--rerun", "[bold]y", cwd=folder)
    assert bad.returncode == 2
    assert "--rerun '[bold]y': no subject with this id in the manifest; did you mean '[bold]x'?" in bad.stderr


@pytest.mark.timeout(120)
def test_a_run_with_nothing_to_do_says_so_and_leaves_no_run_folder(study: Path) -> None:
    folder = study.parent
    first = habitrun("run", "recipe.yaml", cwd=folder)
    assert first.returncode == 0, first.stdout + first.stderr
    # the collect stage's result and the files it wrote are shown
    assert 'summary: {"subjects": 3, "file": ' in first.stdout
    # the stage's own work folder: one per cache key, under work/<stage>/_stage/
    shown = re.search(r"files in (\S+): notes\.txt, table\.csv", first.stdout)
    assert shown and Path(shown[1]).parent == folder / ".habitrun" / "work" / "summary" / "_stage", first.stdout
    assert (Path(shown[1]) / "table.csv").is_file()
    noop = habitrun("run", "recipe.yaml", cwd=folder)
    assert noop.returncode == 0
    assert noop.stdout.splitlines() == [
        "nothing to run: 7 subject-stage(s) already stored as done (no run folder written; --record-noop writes one)"]
    assert len(runs(study)) == 1
    recorded = habitrun("resume", "recipe.yaml", "--record-noop", "-q", cwd=folder)
    assert recorded.returncode == 0 and len(runs(study)) == 2


@pytest.mark.timeout(120)
def test_retry_rounds_rerun_deaths_by_default_and_exceptions_only_when_asked(study: Path) -> None:
    folder = study.parent
    all_kinds = habitrun("run", "recipe.yaml", "policy.auto_retry_on=all", "-q", env={"FAIL": "S1"}, cwd=folder)
    assert all_kinds.returncode == 1
    assert calls(study).count("measure S1") == 3  # auto_retry_rounds 2: three attempts

    study.write_text(RECIPE.replace("{backend: serial, subject_timeout_sec: null}", "{workers: 1}"))
    died = habitrun("run", "recipe.yaml", "--stage", "a", "--rerun", "S2", env={"DIE": "S2"}, cwd=folder)
    assert died.returncode == 1, died.stdout + died.stderr  # S1's failure is recorded, not retried
    assert calls(study).count("measure S2") == 3  # the first run, the death, the retry
    assert calls(study).count("measure S1") == 3
    assert "retrying 1 subject(s), attempt 2" in died.stdout and "a S2" not in died.stdout
    assert "retry them with: habitrun run recipe.yaml --stage a --retry-failed" in died.stdout


@pytest.mark.timeout(120)
def test_a_timeout_is_not_retried_by_default_and_the_summary_names_its_kind(study: Path) -> None:
    study.write_text(RECIPE.replace("{backend: serial, subject_timeout_sec: null}",
                                    "{workers: 2, subject_timeout_sec: 1, graceful_shutdown_sec: 1}"))
    done = habitrun("run", "recipe.yaml", "--stage", "a", env={"HANG": "[bold]x"}, cwd=study.parent)
    assert done.returncode == 1, done.stdout + done.stderr
    assert calls(study).count("measure [bold]x") == 1  # one attempt: a timeout would only repeat
    line = next(x for x in done.stdout.splitlines() if x.startswith("  a [bold]x: "))
    assert line.startswith("  a [bold]x: timeout: ") and ("(log: " in line or "(no log written)" in line)
    status = habitrun("status", "recipe.yaml", cwd=study.parent)
    assert status.returncode == 1 and "a [bold]x: timeout: " in status.stdout
    log = status.stdout.split("a [bold]x: timeout: ", 1)[1].splitlines()[1].strip()
    assert log == "log: none was written" or Path(log.split("log: ", 1)[1]).is_file()

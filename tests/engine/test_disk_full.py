"""A disk that fills under the store mid-run: stop at the first failed commit, exit 2, one message;
what was stored stays readable and `resume` finishes once there is space again."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from habitrun.engine.control import StopFlag
from habitrun.engine.write_failure import WriteFailure
from habitrun.store.runs import RESERVE_BYTES, RESERVE_FILE, RunFolder, list_runs
from tests.engine.mounts import small_tmpfs
from tests.engine.study import run_cli

SUBJECTS = 400
RESULT_BYTES = 100_000  # over the 32 KB spill size: each result is a file on the small disk

OPS = textwrap.dedent('''
    import os
    import time


    def big(subject, marker_dir, size, sleep=0.0):
        with open(os.path.join(marker_dir, subject.id), "a") as fh:
            fh.write("start\\n")
        time.sleep(sleep)
        return subject.id + "x" * size


    def check(results):
        damaged = [sid for sid, v in results.items() if v != sid + "x" * RESULT_BYTES]
        if damaged:
            raise ValueError(f"damaged results: {damaged[:5]}")
        return {"n": len(results)}
''').replace("RESULT_BYTES", str(RESULT_BYTES))


def make_study(folder: Path, run_dir: Path, markers: Path) -> Path:
    folder.mkdir(parents=True)
    markers.mkdir()
    (folder / "ops.py").write_text(OPS)
    (folder / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i:03d}\n" for i in range(SUBJECTS)))
    recipe = {
        "habitrun": 1, "name": "disk-full", "run_dir": str(run_dir), "subjects": {"manifest": "subjects.csv"},
        "policy": {"backend": "process", "workers": 2, "subject_timeout_sec": 60},
        "stages": [
            {"name": "big", "operator": "ops:big",
             "params": {"marker_dir": str(markers), "size": RESULT_BYTES, "sleep": 0.02}},
            {"name": "check", "kind": "collect", "operator": "ops:check", "needs": ["big"]},
        ],
    }
    (folder / "recipe.yaml").write_text(json.dumps(recipe, indent=1))
    return folder / "recipe.yaml"


@pytest.mark.timeout(120)
def test_a_full_disk_stops_the_run_at_the_first_failed_commit_then_resume_finishes(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    with small_tmpfs(tmp_path / "disk", "3m") as disk:
        recipe = make_study(tmp_path / "study", disk / "hr", markers)
        study = recipe.parent
        done = run_cli("run", "recipe.yaml", cwd=study)
        out = done.stdout + done.stderr
        assert done.returncode == 2, out
        assert "Traceback" not in out, out
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, done.stderr
        message = " ".join(done.stderr.split())
        assert f"cannot write the checkpoint store at {disk / 'hr' / 'store'}" in message
        assert "No space left on device" in message
        assert message.rstrip().endswith("continue with: habitrun resume recipe.yaml"), message
        stored = int(message.split(" result(s) of this run were stored")[0].rsplit(" ", 1)[1])
        assert 0 < stored < SUBJECTS
        assert f"[big] finished: {stored} done, 0 cached, 0 failed" in done.stdout, done.stdout  # what is stored
        started = len(list(markers.iterdir()))
        # Dispatching stopped at the failed commit: only what was already running or finishing started.
        assert started <= stored + 40, f"{started} subjects started, {stored} stored"
        # The store on the full disk still answers, with every record committed before the failure.
        con = sqlite3.connect(f"file:{disk}/hr/store/cache.db?mode=ro", uri=True)
        try:
            assert con.execute("SELECT count(*) FROM habitrun_record WHERE ok = 1").fetchone()[0] == stored
        finally:
            con.close()

        assert_status_says_disk_full(study, disk / "hr", disk / "hr" / "store")

        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True, timeout=30)
        resumed = run_cli("resume", "recipe.yaml", "-q", cwd=study)
        out = resumed.stdout + resumed.stderr
        assert resumed.returncode == 0, out
        assert (disk / "hr" / RESERVE_FILE).stat().st_size >= RESERVE_BYTES  # set aside again
        status = run_cli("status", "recipe.yaml", "--json", cwd=study)
        stages = json.loads(status.stdout)["stages"]
        assert stages["big"]["done"] == SUBJECTS and stages["check"]["done"] == 1, stages
        runs = [run.path for run in list_runs(disk / "hr")]  # oldest first (two runs can share a second)
        events = [json.loads(line) for line in (runs[-1] / "events.jsonl").read_text().splitlines()]
        started_stage = next(e for e in events if e.get("event") == "stage_started" and e["stage"] == "big")
        assert started_stage["cached"] == stored  # every record stored before the failure was reused
        finished = next(e for e in events if e.get("event") == "run_finished")
        assert finished["outcome"] == "success"
        collect = [e for e in events if e.get("event") == "subject_done" and e["stage"] == "check"]
        assert collect, "the collect stage did not run"



def assert_status_says_disk_full(study: Path, run_root: Path, under: Path) -> None:
    """The stop is recorded on the full disk itself (in the room its run folder set aside) and shown
    as a full disk with the resume command, exit 1: not as a runner that died."""
    run = list_runs(run_root)[-1].path
    provenance = json.loads((run / "provenance.json").read_text())
    assert provenance["outcome"] == "disk_full", provenance
    folder = provenance["summary"]["write_failure"]["folder"]
    assert folder.startswith(str(under)), folder
    assert "No space left on device" in provenance["summary"]["write_failure"]["reason"]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.endswith("}")]
    assert events[-1]["event"] == "run_finished" and events[-1]["outcome"] == "disk_full", events[-1]
    shown = run_cli("status", "recipe.yaml", cwd=study)
    text = " ".join(shown.stdout.split())
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert f"stopped: the disk was full at {folder}" in text, text
    assert "free space there" in text and "continue with: habitrun resume recipe.yaml" in text, text
    assert "runner died" not in text and "Traceback" not in shown.stderr, text + shown.stderr
    as_json = json.loads(run_cli("status", "recipe.yaml", "--json", cwd=study).stdout)
    assert as_json["run"]["outcome"] == "disk_full" and as_json["run"]["stopped"]["folder"] == folder
    assert as_json["run"]["resume"] == "habitrun resume recipe.yaml"


CHATTY = textwrap.dedent('''
    def chatty(subject, lines=1500):
        for i in range(lines):
            print(f"{subject.id} line {i} " + "y" * 60)
        return 1
''')


@pytest.mark.timeout(120)
def test_a_full_disk_under_the_run_folder_stops_the_run_the_same_way(tmp_path: Path) -> None:
    """The store is elsewhere and has room; the run folder (events, logs) fills up."""
    study = tmp_path / "study"
    study.mkdir()
    (study / "ops.py").write_text(CHATTY)
    (study / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i:03d}\n" for i in range(200)))
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        recipe = {
            "habitrun": 1, "name": "run-folder-full", "run_dir": str(disk / "hr"),
            "subjects": {"manifest": "subjects.csv"},
            "policy": {"backend": "process", "workers": 2, "subject_timeout_sec": 60,
                       "checkpoint_dir": str(tmp_path / "store")},
            "stages": [{"name": "chatty", "operator": "ops:chatty"}],
        }
        (study / "recipe.yaml").write_text(json.dumps(recipe, indent=1))
        done = run_cli("run", "recipe.yaml", cwd=study)
        out = done.stdout + done.stderr
        assert done.returncode == 2, out
        assert "Traceback" not in out, out
        message = " ".join(done.stderr.split())
        assert "No space left on device" in message, message
        assert f"{disk / 'hr'}" in message and "habitrun resume recipe.yaml" in message, message
        assert_status_says_disk_full(study, disk / "hr", disk / "hr" / "runs")

        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True, timeout=30)
        resumed = run_cli("resume", "recipe.yaml", "-q", cwd=study)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr


def fill(disk: Path) -> None:
    """Write into ``disk`` until not one more byte fits."""
    with open(disk / "filler", "wb", buffering=0) as fh:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    fh.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    with pytest.raises(OSError) as full:
        (disk / "probe").write_text("x" * 5000)
    assert full.value.errno == errno.ENOSPC


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reserve", [RESERVE_BYTES, 0])
def test_the_end_of_a_run_is_recorded_on_a_disk_with_not_one_byte_left(tmp_path: Path, reserve: int) -> None:
    """The room the run folder set aside when it was made is what records the stop: without it
    (a file system that cannot allocate ahead), the run's end is lost and the run reads as still running."""
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        run = RunFolder.create(disk / "hr", resolved_yaml="habitrun: 1\n", recipe_path=tmp_path / "recipe.yaml",
                               argv=["habitrun", "run"], provenance={"outcome": "running"}, reserve=reserve)
        run.events.write({"event": "run_started"})
        fill(disk)
        stop = StopFlag()
        try:
            failure = WriteFailure(stop)
            failure.note(disk / "hr" / "store", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
            error = failure.end_run(run, {}, 7, time.monotonic(), disk / "hr" / "store")
        finally:
            stop.close()
        assert "7 result(s) of this run were stored" in error.message
        provenance = json.loads((run.path / "provenance.json").read_text())
        lines = (run.path / "events.jsonl").read_text().splitlines()
        if not reserve:  # (an event line may still fit in the page the log file already has)
            assert provenance["outcome"] == "running", provenance
            return
        assert provenance["outcome"] == "disk_full", provenance
        assert provenance["summary"]["write_failure"] == {"folder": str(disk / "hr" / "store"),
                                                          "reason": "No space left on device (errno 28)"}
        assert json.loads(lines[-1])["event"] == "run_finished" and json.loads(lines[-1])["outcome"] == "disk_full"
        assert not (disk / "hr" / RESERVE_FILE).exists()  # spent; the next run sets it aside again


SMALL = textwrap.dedent('''
    import os
    import time


    def small(subject, marker_dir):
        with open(os.path.join(marker_dir, subject.id), "a") as fh:
            fh.write("start\\n")
        time.sleep(0.02)
        return subject.id + "y" * 20_000  # kept in the record's row (and in the run's journal)
''')


@pytest.mark.timeout(180)
def test_outcomes_the_full_store_refused_are_kept_and_stored_by_resume_without_running_again(tmp_path: Path) -> None:
    """The store's disk fills; the run folder has room: what the runner received and could not
    commit is counted in the message and stored by `resume` from the run's journal."""
    study, markers = tmp_path / "study", tmp_path / "markers"
    study.mkdir()
    markers.mkdir()
    (study / "ops.py").write_text(SMALL)
    (study / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i:03d}\n" for i in range(300)))
    with small_tmpfs(tmp_path / "disk", "2m") as disk:
        (study / "recipe.yaml").write_text(json.dumps({
            "habitrun": 1, "name": "store-full", "subjects": {"manifest": "subjects.csv"},
            "policy": {"backend": "process", "workers": 2, "subject_timeout_sec": 60,
                       "checkpoint_dir": str(disk / "store")},
            "stages": [{"name": "small", "operator": "ops:small", "params": {"marker_dir": str(markers)}}],
        }))
        done = run_cli("run", "recipe.yaml", cwd=study)
        assert done.returncode == 2, done.stdout + done.stderr
        message = " ".join(done.stderr.split())
        assert f"cannot write the checkpoint store at {disk / 'store'}" in message, message
        stored = int(message.split(" result(s) of this run were stored")[0].rsplit(" ", 1)[1])
        kept = int(message.split(" more are kept in the run's journal")[0].rsplit(" ", 1)[1]) \
            if "kept in the run's journal" in message else 0
        ran = {f.name: f.read_text().count("start") for f in markers.iterdir()}
        assert sum(ran.values()) <= stored + kept + 2 * 2, (ran, stored, kept)  # at most what two workers ran on

        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True, timeout=30)
        resumed = run_cli("resume", "recipe.yaml", "-q", cwd=study)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        if kept:
            assert f"{kept} outcome(s) run" in " ".join(resumed.stdout.split()), resumed.stdout
        again = {f.name: f.read_text().count("start") for f in markers.iterdir()}
        repeated = sum(n - 1 for n in again.values())
        assert len(again) == 300 and repeated <= 2, f"{repeated} subject(s) ran twice (stored {stored}, kept {kept})"

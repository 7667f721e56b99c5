"""Commits SQLite loses without a word (noise in, or the deletion of, cache.db-wal after a SIGKILL) are
named by `plan` and `status`, and `run` stores them again from the killed run's journal, or refuses."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_gone
from tests.engine.study import events, make_study, markers, run_cli
from tests.engine.test_crash_safety import start_run


def kill_after(folder: Path, proc: subprocess.Popen[str], done: int, timeout: float = 90) -> list[str]:
    """SIGKILL the runner once ``done`` subjects are reported stored; the subjects reported so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if sum(1 for e in events(folder) if e.get("event") == "subject_done") >= done:
            break
        time.sleep(0.02)
    workers = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)] if proc.poll() is None else []
    assert proc.poll() is None, "the run ended before the kill"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    if proc.stdout:
        proc.stdout.close()
    assert wait_gone(workers, timeout=10.0) == []
    return [f"{e['stage']}-{e['subject']}" for e in events(folder) if e.get("event") == "subject_done"]


def starts(folder: Path) -> dict[str, int]:
    return {key: sum(1 for what, *_ in entries if what == "start") for key, entries in markers(folder).items()}


def run_id(folder: Path) -> str:
    return next((folder / ".habitrun" / "runs").iterdir()).name


def counts_in(text: str, run: str) -> tuple[int, int]:
    """(committed, readable) as the message says them."""
    found = re.search(rf"(\d+) record\(s\) were committed by run {run} .*?, (\d+) are readable there", text)
    assert found, text
    return int(found.group(1)), int(found.group(2))


def noise_in_wal(store: Path) -> None:
    """4 KB of random bytes a third of the way into the write-ahead log."""
    wal = store / "cache.db-wal"
    size = wal.stat().st_size
    assert size > 64 * 1024, size
    with open(wal, "r+b") as fh:
        fh.seek(size // 3)
        fh.write(os.urandom(4096))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("damage", ["noise", "deleted"])
def test_commits_lost_from_the_wal_are_named_then_restored_without_running_again(tmp_path: Path,
                                                                                 damage: str) -> None:
    recipe = make_study(tmp_path / "study", subjects=200, square_params={"sleep": 0.01})
    study = recipe.parent
    store = study / ".habitrun" / "store"
    reported = kill_after(study, start_run(recipe, "-q"), 120)
    run = run_id(study)
    if damage == "noise":
        noise_in_wal(store)
    else:
        (store / "cache.db-wal").unlink()
        (store / "cache.db-shm").unlink(missing_ok=True)

    plan = run_cli("plan", "recipe.yaml", cwd=study)
    assert plan.returncode == 2, plan.stdout + plan.stderr
    message = " ".join(plan.stderr.split())
    committed, readable = counts_in(message, run)
    assert committed >= len(reported) and readable < committed, message
    assert "kept in the run's journal" in message and "stores them again from the journal" in message
    assert "no store yet" not in plan.stdout and "Traceback" not in plan.stdout + plan.stderr

    status = run_cli("status", "recipe.yaml", cwd=study)
    assert status.returncode == 2, status.stdout + status.stderr
    assert counts_in(" ".join(status.stderr.split()), run) == (committed, readable)
    plan_json = json.loads(run_cli("plan", "recipe.yaml", "--json", cwd=study).stdout)
    assert any(f"by run {run}" in note for note in plan_json["store_damage"])

    before = starts(study)
    resumed = run_cli("resume", "recipe.yaml", cwd=study, timeout=180)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{committed - readable} record(s) committed by run {run} were lost" in " ".join(resumed.stdout.split())
    after = starts(study)
    again = [key for key in reported if after[key] != before[key]]
    assert again == [], f"{len(again)} subject(s) reported stored before the kill ran again: {again[:5]}"
    # The journals are settled: nothing more to say, and the study is whole.
    clean = run_cli("plan", "recipe.yaml", cwd=study)
    assert clean.returncode == 0 and "nothing to run" in clean.stdout, clean.stdout + clean.stderr
    assert not list((study / ".habitrun" / "runs").glob("*/journal.bin"))


BIG = textwrap.dedent('''
    import os
    import time


    def big(subject, marker_dir):
        with open(os.path.join(marker_dir, f"big-{subject.id}.log"), "a") as fh:
            fh.write(f"start {time.time():.6f} {os.getpid()}\\n")
        time.sleep(0.01)
        return subject.id + "x" * 100_000  # over what a journal keeps: its loss cannot be undone
''')


@pytest.mark.timeout(240)
def test_committed_records_the_journal_cannot_restore_stop_run_until_the_loss_is_accepted(tmp_path: Path) -> None:
    study = tmp_path / "study"
    (study / "markers").mkdir(parents=True)
    (study / "ops.py").write_text(BIG)
    (study / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i:03d}\n" for i in range(150)))
    (study / "recipe.yaml").write_text(json.dumps({
        "habitrun": 1, "name": "big", "subjects": {"manifest": "subjects.csv"},
        "policy": {"backend": "process", "workers": 2},
        "stages": [{"name": "big", "operator": "ops:big", "params": {"marker_dir": str(study / "markers")}}],
    }))
    reported = kill_after(study, start_run(study / "recipe.yaml", "-q"), 60)
    run = run_id(study)
    (study / ".habitrun" / "store" / "cache.db-wal").unlink()

    before = starts(study)
    refused = run_cli("run", "recipe.yaml", cwd=study)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = " ".join(refused.stderr.split())
    committed, readable = counts_in(message, run)
    assert committed >= len(reported) and readable < committed
    assert "cannot be restored" in message and "Nothing was run" in message, message
    assert message.rstrip().endswith("habitrun run recipe.yaml --accept-loss"), message
    assert "Traceback" not in refused.stdout + refused.stderr
    assert starts(study) == before, "a refused run ran subjects"
    # Refused, the loss is still named, as often as asked.
    assert run_cli("status", "recipe.yaml", cwd=study).returncode == 2
    assert counts_in(" ".join(run_cli("plan", "recipe.yaml", cwd=study).stderr.split()), run) == (committed, readable)

    accepted = run_cli("run", "recipe.yaml", "--accept-loss", "-q", cwd=study, timeout=180)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "accepted (--accept-loss)" in accepted.stdout
    assert run_cli("plan", "recipe.yaml", cwd=study).returncode == 0

"""`habitrun debug RECIPE SUBJECT` (issue 32): one subject's map stages in the CLI's own process.

Through the real CLI, on a real study: what it computes is not stored unless --store (then `plan`
says done, and a run reuses it); --stage reads its upstream results from the store; an operator
that raises exits 1 with its own traceback, and with --pdb the debugger (driven through a
pseudo-terminal by pexpect) stops in the operator's frame; bad subjects and stages exit 2.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pexpect

import habitrun

OPS = textwrap.dedent('''
    import os


    def load(subject, offset: float = 1.0):
        print("loading", subject.id, "pid", os.getpid())
        (subject.workdir / "loaded.txt").write_text(subject.id)
        return {"size": len(subject.id) + offset}


    def features(subject):
        size = subject.inputs["load"]["size"]
        if subject.fields["group"] == "bad":
            spacing_mm = size * 7
            raise ValueError(f"spacing must be positive, got {-spacing_mm}")
        return size * 2


    def hang(subject):
        import time

        waited_sec = 0
        while True:
            time.sleep(0.05)
            waited_sec += 1


    def table(collection):
        return len(collection.results)
''')

RECIPE = textwrap.dedent('''
    habitrun: 1
    name: debugged
    subjects: {manifest: subjects.csv}
    policy: {backend: serial, subject_timeout_sec: null}
    stages:
      - {name: load, operator: 'ops:load'}
      - {name: features, operator: 'ops:features', needs: [load]}
      - {name: summary, kind: collect, operator: 'ops:table', needs: [features]}
''')


def study(tmp_path: Path) -> Path:
    (tmp_path / "ops.py").write_text(OPS)
    (tmp_path / "subjects.csv").write_text("subject_id,group\nsub-001,good\nsub-002,bad\nsub-003,good\n")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    return tmp_path / "recipe.yaml"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=60, check=False, cwd=cwd)


def plan_status(recipe: Path) -> dict[str, dict[str, str]]:
    done = cli("plan", str(recipe), "--json", cwd=recipe.parent)
    assert done.returncode == 0, done.stderr
    return {s["name"]: {sid: v["status"] for sid, v in s["subjects"].items()} for s in json.loads(done.stdout)["stages"]}


def test_a_subject_runs_in_the_foreground_and_nothing_is_stored(tmp_path: Path) -> None:
    recipe = study(tmp_path)
    done = cli("debug", str(recipe), "sub-001", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # the operator's own print reaches the terminal, from the CLI's own process (no worker)
    assert "loading sub-001 pid" in done.stdout
    assert "load sub-001: {'size': 8.0}" in done.stdout and "features sub-001: 16.0" in done.stdout
    assert "nothing stored" in done.stderr
    assert "summary" not in done.stdout  # the collect stage is not one subject's work
    # the work folder is the one a run uses: under the run root, the subject's, the key's
    [made] = list((tmp_path / ".habitrun" / "work" / "load" / "sub-001").glob("*/loaded.txt"))
    assert made.read_text() == "sub-001"
    assert not (tmp_path / ".habitrun" / "runs").exists()  # no run folder, no captured log
    statuses = plan_status(recipe)
    assert set(statuses["load"].values()) == {"pending"} and set(statuses["features"].values()) == {"pending"}


def test_store_stores_under_the_run_key_and_a_run_reuses_it(tmp_path: Path) -> None:
    recipe = study(tmp_path)
    done = cli("debug", str(recipe), "sub-001", "--store", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("stored under key") == 2
    statuses = plan_status(recipe)
    assert statuses["load"] == {"sub-001": "done", "sub-002": "pending", "sub-003": "pending"}
    assert statuses["features"]["sub-001"] == "done"
    ran = cli("run", str(recipe), "-q", cwd=tmp_path)
    assert ran.returncode == 1  # sub-002 fails in features, as it does in debug
    [run] = (tmp_path / ".habitrun" / "runs").iterdir()
    logs = {p.name for p in (run / "logs" / "load").iterdir()}
    assert logs == {"sub-002.log", "sub-003.log"}  # sub-001's stored load result was reused, not run again


def test_stage_reads_its_upstream_results_from_the_store(tmp_path: Path) -> None:
    recipe = study(tmp_path)
    missing = cli("debug", str(recipe), "sub-003", "--stage", "features", cwd=tmp_path)
    assert missing.returncode == 2
    assert "needs the result of stage 'load' for subject sub-003, which is not stored" in missing.stderr
    assert f"habitrun debug {recipe} sub-003 --stage load --store" in missing.stderr
    assert "Traceback" not in missing.stderr
    first = cli("debug", str(recipe), "sub-003", "--stage", "load", "stages.load.params.offset=10", "--store",
                cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    done = cli("debug", str(recipe), "sub-003", "--stage", "features", "stages.load.params.offset=10", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "loading" not in done.stdout  # load did not run again: its stored result was read
    assert "features sub-003: 34\n" in done.stdout  # (7 + 10) * 2: the stored result, not a recomputed default
    stale = cli("debug", str(recipe), "sub-003", "--stage", "features", cwd=tmp_path)  # another load key
    assert stale.returncode == 2 and "which is not stored" in stale.stderr


def test_an_operator_that_raises_exits_1_with_its_own_traceback(tmp_path: Path) -> None:
    recipe = study(tmp_path)
    done = cli("debug", str(recipe), "sub-002", cwd=tmp_path)
    assert done.returncode == 1
    assert "failed: stage features, subject sub-002: ValueError: spacing must be positive, got -56.0" in done.stderr
    traceback = done.stderr.split("Traceback (most recent call last):")[1]
    assert 'ops.py", line' in traceback and "in features" in traceback
    frames = traceback.split("ValueError")[0]
    package = str(Path(habitrun.__file__).parent)
    assert package not in frames, frames  # the user's frames, not habitrun's
    assert "--pdb" in done.stderr
    statuses = plan_status(recipe)
    assert statuses["features"]["sub-002"] == "pending"  # a failure is not stored either


def test_pdb_stops_in_the_operators_frame(tmp_path: Path) -> None:
    recipe = study(tmp_path)
    child = pexpect.spawn(sys.executable, ["-m", "habitrun.cli.app", "debug", str(recipe), "sub-002", "--pdb"],
                          cwd=str(tmp_path), env={**os.environ, "TERM": "dumb"}, encoding="utf-8", timeout=30)
    try:
        child.expect(r"\(Pdb\) ")
        shown = child.before
        assert re.search(r"> .*ops\.py\(\d+\)features\(\)", shown)  # pdb's location: the frame that raised
        assert '-> raise ValueError(f"spacing must be positive' in shown  # its source line
        child.sendline("p spacing_mm")
        child.expect(r"\(Pdb\) ")
        assert "56.0" in child.before
        child.sendline("q")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 1


def test_unknown_subject_and_stages_exit_2_with_close_matches(tmp_path: Path) -> None:
    recipe = study(tmp_path)
    done = cli("debug", str(recipe), "sub-01", cwd=tmp_path)
    assert done.returncode == 2
    assert "no subject 'sub-01'" in done.stderr and "did you mean sub-001" in done.stderr
    assert "Traceback" not in done.stderr
    typo = cli("debug", str(recipe), "sub-001", "--stage", "featres", cwd=tmp_path)
    assert typo.returncode == 2 and "did you mean features?" in typo.stderr
    collect = cli("debug", str(recipe), "sub-001", "--stage", "summary", cwd=tmp_path)
    assert collect.returncode == 2 and "'summary' is a collect stage" in collect.stderr
    bad = cli("debug", str(tmp_path / "nope.yaml"), "sub-001", cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_ctrl_c_on_a_hung_operator_shows_where_it_was(tmp_path: Path) -> None:
    recipe = study(tmp_path)
    (tmp_path / "recipe.yaml").write_text(RECIPE.replace("'ops:features'", "'ops:hang'"))
    child = pexpect.spawn(sys.executable, ["-m", "habitrun.cli.app", "debug", str(recipe), "sub-001", "--pdb"],
                          cwd=str(tmp_path), env={**os.environ, "TERM": "dumb"}, encoding="utf-8", timeout=30)
    try:
        child.expect("debug: stage features")
        child.expect(r"\r\n")  # the whole line: the operator is being called
        child.sendintr()
        child.expect(r"\(Pdb\) ")
        assert "interrupted: stage features, subject sub-001: KeyboardInterrupt" in child.before
        assert re.search(r"> .*ops\.py\(\d+\)hang\(\)", child.before)
        child.sendline("p waited_sec >= 0")
        child.expect(r"\(Pdb\) ")
        assert "True" in child.before
        child.sendline("q")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 130


def test_a_map_stage_after_a_collect_stage_gets_its_one_result(tmp_path: Path) -> None:
    """A run gives every subject the collect stage's one result (it was a KeyError traceback); debug the same."""
    recipe = study(tmp_path)
    (tmp_path / "ops.py").write_text(OPS + textwrap.dedent('''
        def scaled(subject):
            return subject.inputs["count"] * 100 + subject.inputs["load"]["size"]
    '''))
    (tmp_path / "subjects.csv").write_text("subject_id,group\nsub-001,good\nsub-003,good\n")
    (tmp_path / "recipe.yaml").write_text(RECIPE.replace("'ops:table', needs: [features]}", textwrap.dedent("""\
        'ops:table', needs: [load]}
          - {name: count, kind: collect, operator: 'ops:table', needs: [load]}
          - {name: scaled, operator: 'ops:scaled', needs: [count, load]}
    """)))
    missing = cli("debug", str(recipe), "sub-003", "--stage", "scaled", cwd=tmp_path)
    assert missing.returncode == 2 and "needs the result of collect stage 'count'" in missing.stderr
    ran = cli("run", str(recipe), "-q", "--stage", "count", cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    done = cli("debug", str(recipe), "sub-003", "--stage", "scaled", "--store", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "scaled sub-003: 208.0" in done.stdout  # 2 subjects * 100 + 8
    assert plan_status(recipe)["scaled"] == {"sub-001": "pending", "sub-003": "done"}
    ran = cli("run", str(recipe), "-q", cwd=tmp_path)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stdout + ran.stderr
    table = cli("results", str(recipe), "scaled", cwd=tmp_path)
    assert table.stdout.count(",208.0\n") == 2, table.stdout  # the run's sub-001 and debug's stored sub-003

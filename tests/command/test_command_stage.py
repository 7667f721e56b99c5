"""Command map stages through the CLI, with real processes: failures, the tool in the key, accounting."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

from habitrun.errors import RecipeError
from habitrun.planner.context import build_context
from habitrun.spec.loader import load_recipe
from habitrun.spec.subjects import load_subjects
from tests.command.study import cli, output, results, script, trace, write_study

FAKE_TOOL = """
case "$1" in
  ok) echo "converted $2"; echo "$2" > out.txt ;;
  exit3) echo "reading $2"; echo "bad header in $2" >&2; echo "giving up" >&2; exit 3 ;;
  forget) echo "wrote nothing" ;;
  loud) head -c 100000000 /dev/zero | tr '\\0' 'x'; echo done > out.txt ;;
  hang) sleep 300 & echo $! > "$3"; wait ;;
  hog) exec PYTHON -c "import time
b = []
while True:
    b.append(b'x' * (20 << 20)); time.sleep(0.02)" ;;
esac
"""


def test_each_way_a_tool_fails_fails_that_subject_only_and_says_how(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    script(bin_dir, "faketool", FAKE_TOOL.replace("PYTHON", sys.executable))  # not a slow pyenv shim
    pidfile = tmp_path / "sleeper.pid"
    rows = [{"subject_id": f"s-{m}", "mode": m} for m in ("ok", "exit3", "forget", "loud", "hang", "hog")]
    recipe = write_study(tmp_path / "study", [{
        "name": "convert",
        "command": ["faketool", "{mode}", "{subject}", "{params.pidfile}"],
        "params": {"pidfile": str(pidfile)},
        "outputs": {"text": "out.txt"},
        "policy": {"subject_timeout_sec": 4, "worker_memory_limit_mb": 400},
    }], rows)
    done = cli("run", str(recipe), path_first=bin_dir)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    got = results(recipe, "convert", path_first=bin_dir)
    assert got["s-ok"]["status"] == "done"
    assert output(recipe, got["s-ok"]["text"]).read_text() == "s-ok\n"
    assert got["s-loud"]["status"] == "done"
    assert got["s-exit3"]["status"] == "failed"
    assert "faketool exited with code 3; stderr ends: bad header in s-exit3 | giving up" in got["s-exit3"]["error"]
    assert "output 'text' (out.txt) matched nothing" in got["s-forget"]["error"]
    assert got["s-hang"]["kind"] == "timeout", got["s-hang"]
    assert got["s-hog"]["kind"] == "oom", got["s-hog"]  # the tool's memory counts against the worker's limit
    # the hanging tool's own child was killed with it
    sleeper = int(pidfile.read_text())
    assert not psutil.pid_exists(sleeper) or psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE
    logs = {p.stem: p for p in recipe.parent.glob(".habitrun/runs/*/logs/convert/*.log")}
    assert "converted s-ok" in logs["s-ok"].read_text()
    exit3 = logs["s-exit3"].read_text()
    assert "reading s-exit3" in exit3 and "giving up" in exit3  # stdout and stderr both in the log
    loud = logs["s-loud"].stat().st_size
    assert 1 << 20 < loud < 25 << 20, loud  # 100 MB printed: the log keeps its head and tail
    assert b"bytes cut here" in logs["s-loud"].read_bytes()


VERSIONED_TOOL = """
if [ "$1" = "--version" ]; then echo "mytool version VERSION (built today)"; exit 3; fi
echo "VERSION $(cat "$1")" > out.txt
"""


def test_a_new_tool_version_reruns_that_stage_and_what_follows_with_the_reason(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    script(bin_dir, "mytool", VERSIONED_TOOL.replace("VERSION", "v1.0.1"))
    study = tmp_path / "study"
    (study / "data").mkdir(parents=True)
    rows = []
    for sid in ("a", "b"):
        (study / "data" / f"{sid}.txt").write_text(f"raw {sid}\n")
        rows.append({"subject_id": sid, "src": f"data/{sid}.txt"})
    recipe = write_study(study, [
        {"name": "prep", "command": ["cp", "{src}", "copy.txt"], "outputs": {"copy": "copy.txt"}},
        {"name": "convert", "command": ["mytool", "{prep.copy}"], "version": ["mytool", "--version"],
         "outputs": {"text": "out.txt"}, "needs": ["prep"]},
        {"name": "after", "command": ["sh", "-c", 'cat "$0" > final.txt', "{convert.text}"],
         "outputs": {"final": "final.txt"}, "needs": ["convert"]},
    ], rows, files=["src"])
    first = cli("run", str(recipe), path_first=bin_dir)
    assert first.returncode == 0, first.stdout + first.stderr
    final = results(recipe, "after", path_first=bin_dir)
    assert output(recipe, final["a"]["final"]).read_text() == "v1.0.1 raw a\n"
    again = cli("run", str(recipe), path_first=bin_dir)
    assert "nothing to run: 6 subject-stage(s) already stored as done" in again.stdout, again.stdout

    script(bin_dir, "mytool", VERSIONED_TOOL.replace("VERSION", "v2.0.0"))
    plan = cli("plan", str(recipe), "--reason", path_first=bin_dir)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "tool mytool: v1.0.1 → v2.0.0" in plan.stdout, plan.stdout
    second = cli("run", str(recipe), path_first=bin_dir)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "[prep] finished: 0 done, 2 cached" in second.stdout, second.stdout
    assert "[convert] finished: 2 done, 0 cached" in second.stdout
    assert "[after] finished: 2 done, 0 cached" in second.stdout
    final = results(recipe, "after", path_first=bin_dir)
    assert output(recipe, final["b"]["final"]).read_text() == "v2.0.0 raw b\n"


def test_a_missing_tool_is_exit_2_naming_the_stage_and_the_path(tmp_path: Path) -> None:
    recipe = write_study(tmp_path, [{"name": "convert", "command": ["no-such-tool-x", "{subject}"],
                                     "outputs": {"x": "x.txt"}}], [{"subject_id": "a"}])
    for command in ("validate", "run"):
        done = cli(command, str(recipe), path_first=tmp_path / "empty-bin")
        assert done.returncode == 2, done.stdout + done.stderr
        assert "stage 'convert': 'no-such-tool-x' not found (PATH searched:" in done.stderr
        assert str(tmp_path / "empty-bin") in done.stderr
        assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob(".habitrun/runs/*/logs"))


def test_command_recipe_mistakes_are_exit_2_at_their_line(tmp_path: Path) -> None:
    cases = [
        ({"name": "s", "operator": "os:getcwd", "outputs": {"x": "x"}}, "'outputs' belongs to a map stage with a 'command'"),
        ({"name": "s", "command": ["echo", "{other.x}"]}, "'other' is not a stage this stage needs"),
        ({"name": "s", "command": ["echo", "{params.nope}"]}, "the stage has no param 'nope'"),
        ({"name": "s", "command": ["{tool}", "x"]}, "cannot hold a placeholder"),
        ({"name": "s", "command": ["echo", "{subject!r}"]}, "a placeholder is a name in braces"),
        ({"name": "s", "command": ["echo", "{colour}"]}, "no manifest column 'colour'"),
        ({"name": "s", "command": ["echo"], "outputs": {"x": "../x"}}, "must be a path inside the work folder"),
        ({"name": "s", "command": ["echo"], "container": {"image": "img", "engine": "podman"},
          "version": ["echo", "1"]}, "the image's identity is the tool's"),
    ]
    for i, (stage, message) in enumerate(cases):  # what `validate` does, in this process
        recipe = write_study(tmp_path / str(i), [stage], [{"subject_id": "a", "size": 1}])
        with pytest.raises(RecipeError) as caught:
            loaded = load_recipe(recipe)
            build_context(loaded, load_subjects(loaded), None, save=False, verify_only=True)
        text = str(caught.value)
        assert message in text and "recipe.yaml:" in text, (stage, text)
        assert caught.value.exit_code == 2
    done = cli("validate", str(recipe))  # the last one through the CLI: exit 2, the message, no traceback
    assert done.returncode == 2, done.stdout + done.stderr
    assert cases[-1][1] in done.stderr and "Traceback" not in done.stderr


BURNER = """
import sys, time
block = b"x" * (80 << 20)  # 80 MB touched
t = time.process_time()
while time.process_time() - t < 0.4:
    pass
open("out.txt", "w").write(str(len(block)))
"""


PY_OPERATOR = """
import sys

import habitrun


def burn(subject, script):
    habitrun.run_tool([sys.executable, script], cwd=subject.workdir)
    habitrun.run_tool(["sh", "-c", "echo from-the-tool; echo failing >&2; exit 5"])
"""


def test_the_tools_cpu_and_peak_memory_are_the_subjects_and_shell_quotes_values(tmp_path: Path) -> None:
    (tmp_path / "burn.py").write_text(BURNER)
    (tmp_path / "pyops.py").write_text(PY_OPERATOR)
    python = sys.executable
    recipe = write_study(tmp_path, [
        {"name": "burn", "command": [python, str(tmp_path / "burn.py")], "outputs": {"n": "out.txt"}},
        {"name": "py", "operator": "pyops:burn", "params": {"script": str(tmp_path / "burn.py")}},
        {"name": "quoted", "shell": True, "command": ["printf '%s|' {note} > note.txt"],
         "outputs": {"note": "note.txt"}},
    ], [{"subject_id": "a", "note": "two words; rm -rf x"}])
    done = cli("run", str(recipe))
    assert done.returncode == 1, done.stdout + done.stderr  # the Python operator's second tool exits 5
    for stage in ("burn", "py"):  # a command stage's tool, and one a Python operator ran with run_tool
        row = trace(recipe, stage)["a"]
        assert row["cpu_sec"] >= 0.3, row
        assert row["peak_rss_mb"] >= 80, row
    failed = results(recipe, "py")["a"]
    assert failed["error"] == "habitrun.errors.ToolError: sh exited with code 5; stderr ends: failing", failed
    [log] = recipe.parent.glob(".habitrun/runs/*/logs/py/a.log")
    assert "from-the-tool" in log.read_text()
    note = results(recipe, "quoted")["a"]["note"]
    assert output(recipe, note).read_text() == "two words; rm -rf x|"


def test_a_serial_run_puts_the_tools_output_in_the_log(tmp_path: Path) -> None:
    recipe = write_study(tmp_path, [{"name": "say", "command": ["sh", "-c", "echo out-$0; echo err-$0 >&2; exit 4",
                                                               "{subject}"]}],
                         [{"subject_id": "a"}], policy={"backend": "serial", "workers": 1,
                                                         "subject_timeout_sec": None})
    done = cli("run", str(recipe))
    assert done.returncode == 1, done.stdout + done.stderr
    [log] = recipe.parent.glob(".habitrun/runs/*/logs/say/a.log")
    text = log.read_text()
    assert "out-a" in text and "err-a" in text
    assert "sh exited with code 4; stderr ends: err-a" in results(recipe, "say")["a"]["error"]
    assert os.environ.get("PATH")  # the runner's PATH is what the tool was found on

"""The CLI behaves like the ones people know (issue 32): ``-h``, ``-V``, flags listed as flags, completion."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from habitrun import __version__
from habitrun.cli.app import COMMANDS

ENV = {**os.environ, "COLUMNS": "100", "TERMINAL_WIDTH": "100", "NO_COLOR": "1"}


def cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "habitrun.cli.app", *argv], capture_output=True, text=True,
                          timeout=60, check=False, cwd=cwd, env=ENV)


def test_dash_v_is_version_and_dash_h_is_help_at_the_top() -> None:
    for flag in ("-V", "--version"):
        done = cli(flag)
        assert done.returncode == 0 and done.stdout == f"habitrun {__version__}\n", done
    short, long = cli("-h"), cli("--help")
    assert short.returncode == long.returncode == 0
    assert short.stdout == long.stdout and "Commands" in short.stdout
    assert "-V" in short.stdout and "-h" in short.stdout
    script = shutil.which("habitrun", path=str(Path(sys.executable).parent))  # the console script, too
    assert script is not None
    for flag in ("-V", "-h"):
        done = subprocess.run([script, flag], capture_output=True, text=True, timeout=60, env=ENV, check=False)
        assert done.returncode == 0 and done.stdout == (f"habitrun {__version__}\n" if flag == "-V" else short.stdout)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_dash_h_and_lists_flags_as_flags(command: str) -> None:
    short, long = cli(command, "-h"), cli(command, "--help")
    assert short.returncode == long.returncode == 0, short.stderr
    assert short.stdout == long.stdout
    text = short.stdout
    assert f"Usage: habitrun {command} [OPTIONS]" in text
    assert "<bool>" not in text, text  # a flag takes no value
    assert not re.search(r"\{\w+\}", text), text  # arguments are named RECIPE, not {recipe}
    assert re.search(r"--help\s+-h\s+Show this message", text), text


def test_arguments_are_named_in_capitals_optional_ones_in_brackets() -> None:
    assert "Usage: habitrun results [OPTIONS] [RECIPE] [STAGE] [OVERRIDES]..." in cli("results", "-h").stdout
    assert "Usage: habitrun run [OPTIONS] [RECIPE] [OVERRIDES]..." in cli("run", "-h").stdout
    status = cli("status", "-h").stdout
    assert re.search(r"--json\s+Print the status as JSON", status), status


def test_bash_completion_script_and_completions() -> None:
    shown = cli("--show-completion", "bash")
    assert shown.returncode == 0
    assert "complete -o default -F _habitrun_completion habitrun" in shown.stdout
    assert "_HABITRUN_COMPLETE=complete_bash" in shown.stdout
    assert cli("--show-completion", "zsh").stdout.startswith("#compdef habitrun")
    wrong = cli("--show-completion", "tcsh")
    assert wrong.returncode == 2 and "'tcsh' is not a shell habitrun completes" in wrong.stderr
    script = shutil.which("habitrun", path=str(Path(sys.executable).parent))
    assert script is not None
    env = {**ENV, "_HABITRUN_COMPLETE": "complete_bash", "COMP_WORDS": "habitrun sta", "COMP_CWORD": "1"}
    done = subprocess.run([script], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.stdout.split() == ["status"], done
    env.update(COMP_WORDS="habitrun status --a", COMP_CWORD="2")
    done = subprocess.run([script], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.stdout.split() == ["--all"], done


OPS = "def one(subject):\n    return {'x': len(subject.id)}\n"


def write_study(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "ops.py").write_text(OPS)
    (folder / "subjects.csv").write_text("subject_id\ns1\ns22\n")
    (folder / "recipe.yaml").write_text(
        "habitrun: 1\nname: up\nsubjects: {manifest: subjects.csv}\n"
        "policy: {backend: serial, subject_timeout_sec: null}\nstages:\n  - {name: a, operator: 'ops:one'}\n")
    return folder / "recipe.yaml"


@pytest.mark.timeout(240)
def test_every_command_finds_the_recipe_upward_from_a_subfolder(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study")
    deep = tmp_path / "study" / "notes" / "day1"
    deep.mkdir(parents=True)
    plan = cli("plan", cwd=deep)
    assert plan.returncode == 0 and "plan for up (2 subjects" in plan.stdout, plan
    done = cli("run", "-q", "policy.workers=1", cwd=deep)  # an override as the first word is an override
    assert done.returncode == 0 and "success" in done.stdout, done
    assert str(recipe.parent / ".habitrun" / "runs") in done.stdout and ".." not in done.stdout
    for argv in (("validate",), ("status",), ("resume",), ("gc",), ("trace",), ("report", "-o", str(tmp_path / "r.html"))):
        step = cli(*argv, cwd=deep)
        assert step.returncode == 0 and "Traceback" not in step.stderr, (argv, step)
    assert "s22" in cli("trace", cwd=deep).stdout
    assert (tmp_path / "r.html").is_file()
    one = cli("results", "a", "--meta", cwd=deep)  # one word is the stage
    two = cli("results", str(recipe), "a", "--meta", cwd=tmp_path)
    assert one.returncode == two.returncode == 0 and one.stdout == two.stdout, one
    assert one.stdout.splitlines()[-1].startswith("s22,done,") and one.stdout.rstrip().endswith(",3"), one
    missing = cli("results", cwd=deep)
    assert missing.returncode == 2 and "give the stage: habitrun results [RECIPE] STAGE; its stages are: a" in missing.stderr


@pytest.mark.parametrize("command", ["run", "resume", "plan", "status", "validate", "results", "trace", "report", "gc"])
def test_no_recipe_anywhere_up_to_the_repository_is_a_clear_exit_2(tmp_path: Path, command: str) -> None:
    write_study(tmp_path / "outer")  # above the repository: never reached
    repo = tmp_path / "outer" / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    done = cli(command, *(("a",) if command == "results" else ()), cwd=repo / "src")
    assert done.returncode == 2, done
    assert done.stderr == f"error: no recipe.yaml here or in any parent folder up to {repo}; give its path\n"


@pytest.mark.timeout(240)
def test_hints_print_the_exact_command_with_the_recipe_path_and_overrides(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "my study [v2]")  # a space to quote, brackets rich would eat
    (recipe.parent / "ops.py").write_text("def one(subject, k: int = 1):\n    return {'x': k}\n")
    assert cli("run", "-q", str(recipe), cwd=tmp_path).returncode == 0
    gc = cli("gc", str(recipe), "stages.a.params.k=2", cwd=tmp_path)  # the k=1 results are not current
    assert gc.returncode == 0, gc
    assert f"run `habitrun gc '{recipe}' stages.a.params.k=2 --yes` to delete them" in gc.stdout, gc.stdout
    (tmp_path / "my study [v2]" / "subjects.csv").write_text("subject_id\n" + "".join(f"t{i}\n" for i in range(25)))
    (tmp_path / "my study [v2]" / "ops.py").write_text("def one(subject):\n    raise ValueError('no')\n")
    assert cli("run", "-q", str(recipe), cwd=tmp_path).returncode == 1
    status = cli("status", str(recipe), cwd=tmp_path)
    assert status.returncode == 1
    assert f"... and 5 more (habitrun status '{recipe}' --all)" in status.stdout, status.stdout
    init = cli("init", "new study", cwd=tmp_path)
    assert "next: habitrun validate 'new study/recipe.yaml'  then  habitrun run 'new study/recipe.yaml'" in init.stdout


@pytest.mark.timeout(120)
def test_trace_has_iso_8601_utc_times_next_to_the_epoch_seconds(tmp_path: Path) -> None:
    import csv
    import io
    import json
    from datetime import datetime, timezone

    recipe = write_study(tmp_path / "study")
    assert cli("run", "-q", str(recipe)).returncode == 0
    rows = list(csv.DictReader(io.StringIO(cli("trace", str(recipe)).stdout)))
    assert len(rows) == 2
    header = list(rows[0])
    assert header.index("started") + 1 == header.index("started_at")
    assert header.index("ended") + 1 == header.index("ended_at")
    for row in rows:
        for iso, epoch in (("queued", "queued_at"), ("started", "started_at"), ("ended", "ended_at")):
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", row[iso]), row
            parsed = datetime.strptime(row[iso], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
            assert abs(parsed.timestamp() - float(row[epoch])) < 0.001, row
    out = tmp_path / "t.jsonl"
    assert cli("trace", str(recipe), "-o", str(out)).returncode == 0
    first = json.loads(out.read_text().splitlines()[0])
    assert first["started"].endswith("Z") and isinstance(first["started_at"], float)


@pytest.mark.timeout(240)
def test_exit_codes_are_the_ones_the_readme_lists(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")

    def code(*argv: str) -> int:
        done = cli(*argv, cwd=recipe.parent)
        assert "Traceback" not in done.stderr, (argv, done.stderr)
        if done.returncode == 2:
            assert done.stderr.startswith(("error:", "Usage:")), (argv, done.stderr)
        return done.returncode

    # before any run: done (0); status has no run to show (1); asking for what is not there (2)
    assert [code("validate"), code("plan"), code("gc"), code("schema", "-o", str(tmp_path / "s"))] == [0, 0, 0, 0]
    assert code("status") == 1
    assert [code("trace"), code("report"), code("results", "a")] == [2, 2, 2]
    assert [code("schema", "-o", str(blocker / "s")), code("init", str(blocker / "new"))] == [2, 2]
    assert code("init", str(recipe.parent)) == 2  # it would overwrite
    assert code("run", "-q") == 0
    assert [code("status"), code("trace"), code("report"), code("results", "a"), code("gc")] == [0, 0, 0, 0, 0]
    assert [code("results", "nope"), code("trace", "--run", "nope"), code("trace", "--stage", "nope")] == [2, 2, 2]
    assert code("run", "no-such.yaml") == 2 and code("validate", "policy.workers=-3") == 2
    (recipe.parent / "ops.py").write_text("def one(subject):\n    raise ValueError('bad scan')\n")
    assert code("run", "-q") == 1 and code("status") == 1

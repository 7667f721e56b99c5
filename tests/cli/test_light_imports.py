"""What the commands that only look at a study do NOT import, so their start-up can't silently grow back.

Each module named here cost a measured few to 16 ms of a command that takes about 0.25 s
(benchmarks/cli_overhead.py); the test runs the real command on the demo recipe in a fresh
interpreter and reads ``sys.modules`` at its end.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo"

SCRIPT = """
import sys
from habitrun.cli import app as cli
try:
    cli.main(sys.argv[1:])
except SystemExit:
    pass
print("MODULES", *sorted(sys.modules))
"""

NEVER = {  # imported by none of the commands below
    "psutil",  # the lock's holder check only (status reads a lock only while a run holds it)
    "habitrun.store.provenance",  # what a run records about itself: git, package metadata
    "habitrun.engine.runner",
    "habitrun.engine.process.forkserver",
    "rich.progress",
}
NOT_BY = {
    "validate": {"habitrun.store.lock", "habitrun.cli.plan",
                 "habitrun.planner.plan", "habitrun.store.checkpoint", "diskcache"},  # the stage inputs only
    "plan": {"habitrun.store.lock", "habitrun.cli.status"},
    "status": set(),
}


def modules_of(*argv: str, cwd: Path) -> tuple[str, set[str]]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, *argv], capture_output=True, text=True,
                          timeout=120, check=False, cwd=cwd)
    out, _, modules = done.stdout.rpartition("MODULES")
    assert out, done.stderr
    return out, set(modules.split())


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the demo recipe with a stored run of its map stage (so status has a run to show)."""
    study = tmp_path_factory.mktemp("demo") / "demo"
    shutil.copytree(DEMO, study, ignore=shutil.ignore_patterns(".habitrun", "__pycache__"))
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "run", str(study / "recipe.yaml"), "-q",
                           "--stage", "features"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return study / "recipe.yaml"


@pytest.mark.parametrize("command", sorted(NOT_BY))
def test_a_light_command_leaves_out_what_it_does_not_need(command: str, demo: Path) -> None:
    out, modules = modules_of(command, str(demo), cwd=demo.parent)
    assert "error" not in out.lower()
    assert not (NEVER | NOT_BY[command]) & modules


def test_a_quiet_run_draws_no_bars_and_imports_no_progress_module(demo: Path) -> None:
    out, modules = modules_of("run", str(demo), "-q", "--stage", "features", "--rerun", "LUNG001", cwd=demo.parent)
    assert "success" in out
    assert "habitrun.engine.runner" in modules  # it did run
    assert not {"rich.progress", "habitrun.cli.progressbar", "habitrun.cli.report"} & modules


# The console script pauses the cycle collector while the command imports: it must run again after.
GC_STATE = """
import atexit, gc, sys
atexit.register(lambda: print("GC", gc.isenabled(), gc.get_freeze_count() > 0))
from habitrun.cli.app import main
main()
"""


def test_the_collector_runs_again_once_the_command_is_imported(demo: Path) -> None:
    done = subprocess.run([sys.executable, "-c", GC_STATE, "plan", str(demo)], capture_output=True, text=True,
                          timeout=120, check=False, cwd=demo.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("GC True True")  # enabled; the imports' objects frozen

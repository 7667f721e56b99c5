"""A recipe of 2000 stages plans through the CLI (timing: benchmarks/plan_stages.py); a table of
many rows is drawn line by line exactly as rich's Table draws it; stage order and lookups stay right."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

from benchmarks.plan_stages import write_study
from habitrun.cli import longtable
from habitrun.cli.longtable import Cell, print_table
from habitrun.spec.loader import load_recipe


@pytest.mark.timeout(180)
@pytest.mark.parametrize("shape", ["chain", "fan"])
def test_plan_of_2000_stages_completes_through_the_cli(tmp_path, shape):
    recipe = write_study(tmp_path, 2000, shape)
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "plan", recipe.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=170, env={**os.environ, "COLUMNS": "120"})
    assert done.returncode == 0, done.stdout + done.stderr
    rows = re.findall(r"^ (s\d+|gather)\s+(map|collect)\s+0\s+0\s+0\s+(\d+)\s+0\s+0\s+(\d+) $", done.stdout, re.M)
    stages = 2000 + (shape == "fan")
    assert len(rows) == stages
    assert [r[0] for r in rows[:3]] == ["s0", "s1", "s2"] and rows[1999][0] == "s1999"
    assert f"{4 * 2000 + (shape == 'fan')} subject-stage(s) would run" in done.stdout


def test_stage_order_puts_each_stage_after_its_needs_and_keeps_recipe_order_otherwise(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    (tmp_path / "subjects.csv").write_text("subject_id\nS1\n")
    (tmp_path / "ops.py").write_text("def f(subject):\n    return 1\n")
    stages = [("d", ["c", "b"]), ("a", []), ("c", ["a"]), ("b", []), ("e", ["a"])]
    recipe.write_text("habitrun: 1\nname: order\nsubjects: {manifest: subjects.csv}\nstages:\n" + "".join(
        f'  - {{name: {n}, operator: "ops:f", needs: [{", ".join(needs)}]}}\n' for n, needs in stages))
    loaded = load_recipe(recipe)
    assert [s.name for s in loaded.recipe.ordered_stages()] == ["a", "c", "b", "d", "e"]
    assert loaded.recipe.stage("c").needs == ("a",)
    with pytest.raises(KeyError):
        loaded.recipe.stage("z")


def _drawn(rows: int, width: int, title: str, terminal: bool, fast: bool, monkeypatch) -> str:
    monkeypatch.setattr(longtable, "FAST_ROWS", 1 if fast else 10**9)
    console = Console(file=io.StringIO(), width=width, highlight=False, soft_wrap=True, force_terminal=terminal,
                      color_system="truecolor" if terminal else None)
    cells = [[Cell(f"s{i}" if i % 7 else "[bold]x 日本"), Cell("map"), Cell(str(i % 3), "red" if i % 3 else None),
              Cell(str(i))] for i in range(rows)]
    print_table(console, title, ["stage", "kind", "failed", "to run"], ["left", "left", "right", "right"], cells)
    return console.file.getvalue()


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize(("width", "title", "direct"), [
    (120, "plan for \\[x] (4 subjects)", True),
    (30, "plan", False),  # cells wrap: rich lays it out
    (60, "a title much longer than the table it is the title of, so wrapped", False),
])
def test_a_long_table_is_drawn_as_rich_draws_it(monkeypatch, terminal, width, title, direct):
    slow = _drawn(300, width, title, terminal, False, monkeypatch)
    if direct:  # and drawn without rich's Table
        monkeypatch.setattr(longtable, "_rich_table", lambda *a: pytest.fail("rich's Table was used"))
        assert "[bold]x 日本" in slow  # user text shown as written, not as markup
    assert _drawn(300, width, title, terminal, True, monkeypatch) == slow


@pytest.mark.timeout(240)
def test_status_of_a_run_of_250_stages_shows_every_stage_in_both_tables(tmp_path):
    write_study(tmp_path, 250, "chain")

    def habitrun(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=200, env={**os.environ, "COLUMNS": "120"})

    run = habitrun("run", "recipe.yaml", "-q")
    assert run.returncode == 0, run.stdout + run.stderr
    status = habitrun("status", "recipe.yaml")
    assert status.returncode == 0, status.stdout + status.stderr
    out = status.stdout
    assert len(re.findall(r"^ s\d+\s+map\s+4\s+0\s+0\s+0\s+0\s+0\s+0 $", out, re.M)) == 250  # counts
    assert len(re.findall(r"^ s\d+\s+4\s+\S+ \S+\s+\S+ \S+\s+\S+ \S+\s+\S+ MB", out, re.M)) == 250  # resources
    assert len(re.findall(r"^  slowest in s\d+: S\d ", out, re.M)) == 250
    assert out.index("duration and peak memory") < out.index("slowest in s0:") < out.index("slowest in s249:")


@pytest.mark.timeout(180)
def test_a_chain_of_2000_stages_listed_last_first_plans_and_a_long_cycle_is_named(tmp_path):
    recipe = write_study(tmp_path, 2000, "chain")
    lines = recipe.read_text().splitlines()
    head, stages = [x for x in lines if not x.startswith("  - ")], [x for x in lines if x.startswith("  - ")]
    recipe.write_text("\n".join(head + stages[::-1]) + "\n")  # the depth-first check went 2000 calls deep

    def plan() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "habitrun.cli.app", "plan", recipe.name], cwd=tmp_path,
                              capture_output=True, text=True, timeout=170, env={**os.environ, "COLUMNS": "120"})

    done = plan()
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert "8000 subject-stage(s) would run" in done.stdout
    recipe.write_text(recipe.read_text().replace('params: {k: 0}}', 'params: {k: 0}, needs: [s1999]}'))
    cycle = plan()
    assert cycle.returncode == 2 and "Traceback" not in cycle.stderr, cycle.stdout + cycle.stderr
    assert "the stages' needs form a cycle: " in cycle.stderr and "s1999 -> s1998" in cycle.stderr

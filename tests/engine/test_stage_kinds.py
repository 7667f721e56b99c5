"""Stage kinds are classes behind one protocol, registered in one place (engine/stage_kinds.py).

A toy kind registered there runs end to end in a real run (serial backend,
real store, real run folder), booked like any other: adding a kind is one
class and one registry line (plus its name in the recipe's ``StageKind``).
Outside the registry, no code asks a stage which kind it is: a scan of the
source finds no comparison with a kind name and no ``.is_group`` (the spec
and the planner keep what they need to parse and plan).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import get_args

import pytest

from habitrun.engine.contract import SubjectOutcome, SubjectTask
from habitrun.engine.ledger import StageLedger
from habitrun.engine.run_context import RunContext
from habitrun.engine.runner import run_study
from habitrun.engine.stage_inputs import StageInputs
from habitrun.engine.stage_kind import OneResultKind
from habitrun.engine.stage_kinds import KINDS
from habitrun.planner.plan import StagePlan
from habitrun.planner.stageplan import GROUP_KINDS
from habitrun.spec.loader import load_recipe
from habitrun.spec.recipe import StageKind, StageSpec
from tests.engine.study import make_study, run_cli

ROOT = Path(__file__).resolve().parents[2]
SERIAL = {"backend": "serial", "workers": 1, "subject_timeout_sec": None}


def test_the_registry_spec_and_planner_name_the_same_kinds() -> None:
    assert set(KINDS) == set(get_args(StageKind))
    assert set(GROUP_KINDS) == {name for name, kind in KINDS.items() if kind.one_result}
    assert all(kind.name == name for name, kind in KINDS.items())


class Tally(OneResultKind):
    """A toy kind: sums its members' results in the runner itself, no operator, no backend."""

    name = "collect"
    on_backend = False
    measured = False

    def tasks(self, inputs: StageInputs, stage: StageSpec, plan: StagePlan, to_run: list[str]) -> list[SubjectTask]:
        return [inputs.group_task(stage, plan)]

    def run(self, ctx: RunContext, stage: StageSpec, plan: StagePlan, to_run: list[str],
            ledger: StageLedger) -> None:
        [task] = self.tasks(ctx.inputs, stage, plan, to_run)
        ledger.done(SubjectOutcome(task=task, ok=True, result={"toy": sum(task.inputs.values())}), time.time())
        ledger.submit()
        ledger.settle()


@pytest.mark.timeout(60)
def test_a_kind_registered_in_the_registry_runs_end_to_end(tmp_path: Path, monkeypatch) -> None:
    recipe = make_study(tmp_path / "study", subjects=5, policy=SERIAL)
    monkeypatch.setitem(KINDS, "collect", Tally())

    summary = run_study(load_recipe(recipe), install_signal_handlers=False)
    assert summary.exit_code == 0, summary.failures
    expected = sum(n * n + 1 for n in range(5))
    assert summary.results["total"] == {"toy": expected}  # the toy ran, not the recipe's operator
    assert summary.stages["total"].as_dict()["done"] == 1

    again = run_study(load_recipe(recipe), install_signal_handlers=False)
    assert again.noop and again.results["total"] == {"toy": expected}  # booked: stored under the stage's key

    shown = run_cli("results", str(recipe), "total", cwd=tmp_path)  # read back by the real CLI
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"toy": expected}


# A comparison of a kind with a kind name, or a plan's ``is_group``: kind-specific behaviour outside the registry.
ASKS_KIND = re.compile(r"""kind\s*(==|!=|\bin\b|\bnot in\b)\s*[("'].*?\b(map|collect|train)\b|\.is_group\b|GROUP_KINDS""")
OWNERS = ("habitrun/spec/", "habitrun/planner/", "habitrun/engine/stage_kinds.py")
ALLOWED = {  # file -> the lines that may, and why
    "habitrun/engine/invoke.py": {'if op.kind == "collect":'},  # the operator's calling convention on the wire
    "habitrun/cli/progress.py": {'train = e.kind == "train"'},  # display words of a Stopping event's kind field
    "habitrun/cli/results.py": {'if kind != "map":'},  # read side: being reworked into the Study facade
    "habitrun/cli/status.py": {"return {s.name: len(s.members) for s in plan if s.is_group and s.members}"},
}


def kind_questions(root: Path) -> list[str]:
    """``path:line: text`` of each line outside the owners that asks which kind a stage is."""
    found = []
    for path in sorted((root / "habitrun").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(OWNERS):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            text = line.strip()
            if ASKS_KIND.search(text) and text not in ALLOWED.get(rel, ()):
                found.append(f"{rel}:{number}: {text}")
    return found


def test_no_code_outside_the_registry_asks_a_stage_its_kind() -> None:
    assert kind_questions(ROOT) == []


def test_the_scan_finds_a_kind_question(tmp_path: Path) -> None:
    (tmp_path / "habitrun" / "engine").mkdir(parents=True)
    (tmp_path / "habitrun" / "engine" / "x.py").write_text(
        'if stage.kind != "map":\n    pass\nif up.is_group:\n    pass\nif s.kind in ("collect", "train"):\n    pass\n')
    assert [q.split(":")[1] for q in kind_questions(tmp_path)] == ["1", "3", "5"]

"""The table of bad recipes: each names its exact line and says what is wrong.

Every case mutates the valid recipe in conftest.BASE (its line numbers are
the ones below) and is checked twice: in-process (the problem's position and
text) and through the real CLI (`habitrun validate` exits 2, no traceback).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from habitrun.cli.validate import check_operators
from habitrun.errors import RecipeError
from habitrun.spec.loader import load_recipe
from habitrun.spec.subjects import load_subjects
from tests.spec.conftest import BASE, make_study, run_cli


@dataclass(frozen=True)
class Bad:
    id: str
    edits: tuple[tuple[str, str], ...] = ()
    where: str = "recipe.yaml"  # file the problem names, or "override"
    line: int | None = None
    fragment: str = ""
    overrides: tuple[str, ...] = ()
    text: str | None = None  # the whole recipe, instead of edits
    env: dict[str, str] = field(default_factory=dict)

    def recipe(self) -> str:
        if self.text is not None:
            return self.text
        out = BASE
        for old, new in self.edits:
            assert old in out, f"{self.id}: {old!r} not in BASE"
            out = out.replace(old, new, 1)
        return out


W = "  workers: 2\n"
T = "  subject_timeout_sec: 60\n"

CASES = [
    # YAML syntax
    Bad("syntax-indent", (("  id: subject_id", " id: subject_id"),), line=6, fragment="syntax:"),
    Bad("syntax-unclosed-flow", (("needs: [prep]", "needs: [prep"),), line=16, fragment="syntax:"),
    Bad("syntax-tab", ((W, "\tworkers: 2\n"),), line=8, fragment="syntax:"),
    Bad("python-tag", (('params: {bins: "${vars.bins}"}', 'params: !!python/object/apply:os.system ["echo hi"]'),), line=16, fragment="not allowed"),
    Bad("custom-tag", (("operator: ops:prep", "operator: !op ops:prep"),), line=12, fragment="not allowed"),
    Bad("duplicate-key", ((T, T + "  workers: 3\n"),), line=10, fragment="duplicate key 'workers'"),
    Bad("two-documents", text=BASE + "---\nname: again\n", line=21, fragment="one YAML document"),
    Bad("empty-file", text="", line=1, fragment="got an empty file"),
    Bad("top-level-list", text="- habitrun: 1\n", line=1, fragment="expected a mapping"),
    # wrong types and values
    Bad("workers-word", ((W, "  workers: four\n"),), line=8, fragment="expected an integer >= 1, got 'four'"),
    Bad("workers-zero", ((W, "  workers: 0\n"),), line=8, fragment="expected an integer >= 1, got 0"),
    Bad("timeout-negative", ((T, "  subject_timeout_sec: -5\n"),), line=9, fragment="expected a number > 0 and <= 2073600 (24 days) (or null), got -5"),
    Bad("timeout-too-large", ((T, "  subject_timeout_sec: 2200000\n"),), line=9, fragment="expected a number > 0 and <= 2073600 (24 days) (or null), got 2200000"),
    Bad("timeout-1e9", ((T, "  subject_timeout_sec: 1e9\n"),), line=9, fragment="<= 2073600 (24 days)"),
    Bad("timeout-inf", ((T, "  subject_timeout_sec: .inf\n"),), line=9, fragment="<= 2073600 (24 days)"),
    Bad("grace-too-large", ((T, T + "  graceful_shutdown_sec: 2073601\n"),), line=10, fragment="expected a number >= 0 and <= 2073600 (24 days), got 2073601"),
    Bad("spawn-timeout-too-large", ((T, T + "  subject_spawn_timeout_sec: 9e12\n"),), line=10, fragment="<= 2073600 (24 days)"),
    Bad("stage-timeout-too-large", (("needs: [prep]", "needs: [prep]\n    policy: {subject_timeout_sec: 3000000}"),), line=16, fragment="<= 2073600 (24 days)"),
    Bad("stages-not-list", text=BASE.split("stages:")[0] + "stages: prep\n", line=10, fragment="expected a list"),
    Bad("name-not-string", (("name: t\n", "name: [t]\n"),), line=2, fragment="expected a string"),
    # unknown keys and misspellings
    Bad("misspelled-policy-key", ((T, "  subject_timout_sec: 60\n"),), line=9, fragment="did you mean 'subject_timeout_sec'?"),
    Bad("misspelled-top-key", (("name: t\n", "nme: t\n"),), line=2, fragment="unknown key 'nme' (did you mean 'name'?)"),
    Bad("misspelled-stage-key", (("needs: [prep]", "needz: [prep]"),), line=15, fragment="did you mean 'needs'?"),
    Bad("policy-key-at-top", (("policy:\n", "workers: 3\npolicy:\n"),), line=7, fragment="put it under 'policy:'"),
    # enums and versions
    Bad("bad-enum", ((T, T + "  on_subject_failure: stop\n"),), line=10, fragment="expected one of 'continue', 'fail_fast', got 'stop'"),
    Bad("misspelled-enum", ((T, T + "  parallel_mode: isolate\n"),), line=10, fragment="did you mean 'isolated'?"),
    Bad("bad-stage-kind", (("kind: collect", "kind: reduce"),), line=18, fragment="expected one of 'map', 'collect', 'train'"),
    Bad("unknown-version", (("habitrun: 1", "habitrun: 2"),), line=1, fragment="unsupported recipe format version 2"),
    Bad("missing-version", (("habitrun: 1\n", ""),), line=1, fragment="missing required key 'habitrun'"),
    # stage graph and kinds
    Bad("unknown-needs", (("needs: [prep]", "needs: [prepp]"),), line=15, fragment="unknown stage 'prepp' (did you mean 'prep'?)"),
    Bad("cycle", (("operator: ops:prep", "operator: ops:prep\n    needs: [table]"),), line=13, fragment="cycle: prep -> table -> feat -> prep"),
    Bad("duplicate-stage", (("- name: feat", "- name: prep"),), line=13, fragment="two stages are named 'prep'"),
    Bad("needs-itself", (("needs: [prep]", "needs: [feat]"),), line=15, fragment="needs itself"),
    Bad("collect-without-needs", (("    needs: [feat]\n", ""),), line=18, fragment="collect stage needs at least one"),
    Bad("train-with-operator", (("kind: collect", "kind: train"),), line=19, fragment="not 'operator'"),
    Bad("map-with-launch", (("operator: ops:prep", "operator: ops:prep\n    launch: {nproc_per_node: 2}"),), line=13, fragment="'launch' belongs to train stages"),
    Bad("serial-with-timeout", ((W, "  backend: serial\n"),), line=8, fragment="backend 'serial' runs subjects in-process"),
    Bad("stage-policy-bad", (("needs: [prep]", "needs: [prep]\n    policy: {workers: 0}"),), line=16, fragment="expected an integer >= 1, got 0"),
    Bad("stage-policy-unknown", (("needs: [prep]", "needs: [prep]\n    policy: {wrkers: 3}"),), line=16, fragment="did you mean 'workers'?"),
    # operators (validate imports them)
    Bad("import-path-format", (("operator: ops:prep", "operator: ops prep"),), line=12, fragment="expected an import path"),
    Bad("missing-module", (("operator: ops:prep", "operator: nomod:prep"),), line=12, fragment="no module named 'nomod'"),
    Bad("missing-attribute", (("operator: ops:prep", "operator: ops:nothere"),), line=12, fragment="has no attribute 'nothere'"),
    Bad("import-raises", (("operator: ops:prep", "operator: broken:fn"),), line=12, fragment="raised RuntimeError: import-time failure"),
    Bad("not-callable", (("operator: ops:prep", "operator: ops:CONSTANT"),), line=12, fragment="is a value of type int, not a function or class"),
    # subjects
    Bad("missing-manifest", (("manifest: subjects.csv", "manifest: nothere.csv"),), line=5, fragment="does not exist"),
    Bad("duplicate-ids", (("manifest: subjects.csv", "manifest: dup.csv"),), where="dup.csv", line=4, fragment="duplicate subject id 'S1' (first on line 2)"),
    Bad("missing-id-column", (("id: subject_id", "id: subjectid"),), where="subjects.csv", line=1, fragment="did you mean 'subject_id'?"),
    Bad("empty-manifest", (("manifest: subjects.csv", "manifest: empty.csv"),), where="empty.csv", fragment="no subjects"),
    Bad("long-int-json", (("manifest: subjects.csv", "manifest: long.json"),), where="long.json", line=4, fragment="[2].subject_id: a number of 5000 digits is too long to read (at most 4300); write a long id as a string in quotes"),
    Bad("long-int-jsonl", (("manifest: subjects.csv", "manifest: long.jsonl"),), where="long.jsonl", line=3, fragment="[1].subject_id: a number of 5000 digits is too long to read"),
    Bad("long-int-yaml", (("manifest: subjects.csv", "manifest: long.yaml"),), where="long.yaml", line=2, fragment="[1].subject_id: a number of 5000 digits is too long to read (at most 4300); quote it"),
    Bad("include-number-not-as-written", overrides=("subjects.manifest=padded.csv", "subjects.include=[1, 2]"), where="override", fragment="subject '2' is not in the manifest (did you mean '002'? write include: ['002'] — ids are text)"),
    Bad("unknown-include", (("id: subject_id", "id: subject_id\n  include: [S1, S9]"),), line=7, fragment="subject 'S9' is not in the manifest"),
    # interpolation
    Bad("missing-var", (("${vars.bins}", "${vars.binz}"),), line=16, fragment="unknown variable 'vars.binz' (did you mean 'vars.bins'?)"),
    Bad("missing-env", (("${vars.bins}", "${env:HABITRUN_TEST_SURELY_UNSET}"),), line=16, fragment="'HABITRUN_TEST_SURELY_UNSET' is not set"),
    Bad("runtime-placeholder-outside-command", (("${vars.bins}", "${workdir}"),), line=16, fragment="only inside a train stage's 'command'"),
    # overrides
    Bad("override-bad-value", overrides=("policy.workers=four",), where="override", fragment="override 'policy.workers=four': policy.workers: expected an integer >= 1, got 'four'"),
    Bad("override-unknown-stage", overrides=("stages.fet.params.bins=3",), where="override", fragment="no stage named 'fet' (did you mean 'feat'?)"),
    Bad("override-no-equals", overrides=("policy.workers",), where="override", fragment="write it as 'dotted.path=value'"),
    Bad("override-unknown-key", overrides=("policy.wrkers=3",), where="override", fragment="unknown key 'wrkers' (did you mean 'workers'?)"),
    Bad("override-bad-yaml", overrides=("subjects.exclude=[S1",), where="override", fragment="not valid YAML"),
]


def _problems(path: Path, case: Bad) -> list[str]:
    try:
        loaded = load_recipe(path, case.overrides)
        problems: list[str] = []
        try:
            load_subjects(loaded)
        except RecipeError as exc:
            problems += exc.problems
        problems += check_operators(loaded)
    except RecipeError as exc:
        return exc.problems
    return problems


def _matching(problems: list[str], case: Bad) -> list[str]:
    if case.where == "override":
        prefix = "override '"
    elif case.line is None:
        prefix = f"{case.where}:"
    else:
        prefix = f"{case.where}:{case.line}:"
    return [p for p in problems if case.fragment in p and re.search(rf"(^|/|error: ){re.escape(prefix)}", p)]


def test_there_are_at_least_25_cases():
    assert len(CASES) >= 25
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_loader_names_line_and_problem(tmp_path: Path, case: Bad):
    path = make_study(tmp_path / case.id, case.recipe())
    for name in ("ops", "broken"):  # import this case's operators, not an earlier case's
        sys.modules.pop(name, None)
    problems = _problems(path, case)
    assert problems, "the bad recipe was accepted"
    assert _matching(problems, case), "\n".join(problems)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cli_exits_2_without_traceback(tmp_path: Path, case: Bad):
    path = make_study(tmp_path / case.id, case.recipe())
    result = run_cli("validate", str(path), *case.overrides, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert _matching(result.stderr.splitlines(), case), output

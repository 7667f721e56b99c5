"""The cohort accounted for, through the real CLI: who left it and why in `run`, `status`, `--json` and
the report; `policy.require_complete_cohort` refusing a collect stage on a partial cohort."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OPS = '''
import os

def feat(subject):
    if subject.id in os.environ.get("FAIL_IDS", "").split(","):
        raise ValueError("bad scan")
    return {"v": len(subject.id)}

def table(results):
    return {"n": len(results), "ids": sorted(results)}

def main():
    raise SystemExit("a refused train stage never launches")
'''

RECIPE = """\
habitrun: 1
name: cohort
subjects:
  from: "data/{subject}/{image}.nii"
  pivot: image
  required: [ct, mask]
  fields: {subject: "[^/]+"}
%s
policy: {backend: serial, subject_timeout_sec: null}
stages:
  - {name: feat, operator: "ops:feat"}
  - {name: table, kind: collect, operator: "ops:table", needs: [feat]}
"""

ODD = "[bold]x"  # a subject id that is rich markup: printed literally


def study(root: Path, complete: list[str], without_mask: list[str], subjects_extra: str = "") -> Path:
    for sid in complete + without_mask:
        (root / "data" / sid).mkdir(parents=True)
        (root / "data" / sid / "ct.nii").write_text("ct")
        if sid in complete:
            (root / "data" / sid / "mask.nii").write_text("mask")
    (root / "ops.py").write_text(OPS)
    recipe = root / "recipe.yaml"
    recipe.write_text(RECIPE % subjects_extra)
    return recipe


def habitrun(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, **(env or {})})
    out = done.stdout + done.stderr
    assert "Traceback" not in out and "MarkupError" not in out, out
    return done


def test_a_subject_missing_its_mask_is_named_in_the_summary_status_json_and_report(tmp_path: Path):
    study(tmp_path, ["S001", "S002", "S004"], [ODD])
    line = f"cohort: 4 found → 1 incomplete (missing mask: {ODD}) → 3 in the run → table took 3"
    run = habitrun("run", "recipe.yaml", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr  # the default stays: the collect runs on the rest
    assert line in run.stdout
    assert '"n": 3' in run.stdout
    status = habitrun("status", "recipe.yaml", cwd=tmp_path)
    assert status.returncode == 0 and line in status.stdout, status.stdout
    doc = json.loads(habitrun("status", "recipe.yaml", "--json", cwd=tmp_path).stdout)
    assert doc["cohort"] == {"found": 4, "in_run": 3, "incomplete": [{"subject": ODD, "missing": "mask"}],
                             "excluded": [], "members": {"table": 3}, "refused": []}
    report = habitrun("report", "recipe.yaml", cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    page = next((tmp_path / ".habitrun" / "runs").glob("*/report.html")).read_text()
    assert f'<p id="cohort"><b>cohort</b>: 4 found → 1 incomplete (missing mask: {ODD})' in page


def test_require_complete_cohort_refuses_the_collect_and_lists_who_is_missing(tmp_path: Path):
    study(tmp_path, ["S001", "S002", "S004"], [ODD])
    run = habitrun("run", "recipe.yaml", "policy.require_complete_cohort=true", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    refusal = (f"refused: stage 'table' not run: require_complete_cohort is on and 1 subject(s) are missing "
               f"from the cohort: {ODD} (incomplete: missing mask)")
    assert refusal in run.stdout, run.stdout
    assert "table:" not in run.stdout  # no result of a collect that did not run
    doc = json.loads(habitrun("status", "recipe.yaml", "--json", cwd=tmp_path).stdout)
    assert doc["run"]["outcome"] == "failed"
    assert doc["stages"]["feat"]["done"] == 3  # the map stage still ran
    assert doc["cohort"]["refused"] == [refusal.removeprefix("refused: ")]
    status = habitrun("status", "recipe.yaml", cwd=tmp_path)
    assert status.returncode == 1 and refusal in status.stdout, status.stdout


def test_a_collect_stored_over_a_partial_cohort_is_refused_once_the_policy_asks(tmp_path: Path):
    study(tmp_path, ["S001", "S002"], ["S003"])
    assert habitrun("run", "recipe.yaml", cwd=tmp_path).returncode == 0
    again = habitrun("run", "recipe.yaml", "policy.require_complete_cohort=true", cwd=tmp_path)
    assert again.returncode == 1, again.stdout + again.stderr  # not "nothing to run": the stored table is partial
    assert "missing from the cohort: S003 (incomplete: missing mask)" in again.stdout, again.stdout


def test_a_train_stage_refuses_too_and_the_map_stage_still_runs(tmp_path: Path):
    recipe = study(tmp_path, ["S001", "S002"], ["S003"])
    recipe.write_text(recipe.read_text().replace(
        '{name: table, kind: collect, operator: "ops:table", needs: [feat]}',
        '{name: fit, kind: train, entrypoint: "ops:main", needs: [feat]}'))
    run = habitrun("run", "recipe.yaml", "policy.require_complete_cohort=true", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert ("refused: stage 'fit' not run: require_complete_cohort is on and 1 subject(s) are missing from the "
            "cohort: S003 (incomplete: missing mask)") in run.stdout, run.stdout
    assert "never launches" not in run.stdout + run.stderr
    doc = json.loads(habitrun("status", "recipe.yaml", "--json", cwd=tmp_path).stdout)
    assert doc["stages"]["feat"]["done"] == 2


def test_the_refusal_names_the_first_few_and_counts_the_rest(tmp_path: Path):
    missing = [f"M{i}" for i in range(8)]
    study(tmp_path, ["S001"], missing)
    run = habitrun("run", "recipe.yaml", "policy.require_complete_cohort=true", cwd=tmp_path)
    assert run.returncode == 1
    assert ("8 subject(s) are missing from the cohort: M0 (incomplete: missing mask), M1 (incomplete: missing "
            "mask), M2 (incomplete: missing mask), M3 (incomplete: missing mask), M4 (incomplete: missing mask) "
            "... and 3 more") in run.stdout, run.stdout
    assert "8 incomplete (missing mask: M0, M1, M2, M3, M4 ... and 3 more)" in run.stdout


def test_a_subject_failing_upstream_makes_the_collect_refuse_and_nothing_is_stored_for_it(tmp_path: Path):
    study(tmp_path, ["S001", "S002", ODD], [])
    run = habitrun("run", "recipe.yaml", "policy.require_complete_cohort=true", cwd=tmp_path,
                   env={"FAIL_IDS": f"S002,{ODD}"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert ("2 subject(s) are missing from the cohort: S002 (failed or skipped upstream), "
            f"{ODD} (failed or skipped upstream)") in run.stdout, run.stdout
    assert "cohort: 3 found → 3 in the run → table took 1" in run.stdout
    again = habitrun("run", "recipe.yaml", "policy.require_complete_cohort=true",
                     "policy.retry_failed_subjects=true", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr  # the complete cohort: the collect runs
    assert '"n": 3' in again.stdout and "cohort:" not in again.stdout


def test_subjects_excluded_are_listed_and_do_not_make_the_cohort_partial(tmp_path: Path):
    study(tmp_path, ["S001", "S002", "S004"], ["S003"], "  exclude: [S003, S004]")
    run = habitrun("run", "recipe.yaml", "policy.require_complete_cohort=true", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "cohort: 4 found → 2 excluded by include/exclude (S003, S004) → 2 in the run → table took 2" in run.stdout
    doc = json.loads(habitrun("status", "recipe.yaml", "--json", cwd=tmp_path).stdout)
    assert doc["cohort"]["incomplete"] == [] and doc["cohort"]["excluded"] == ["S003", "S004"]

"""A memory budget as the user sees it: `plan` predicts each stage's peaks, `status` and the report show
what admission did.

No memory limit here (the cgroup tests are in test_memory_budget_cgroup.py): a budget in MB on a small
study whose subjects take a few MB each.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.engine.memstudy import make_skewed_study


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_plan_predicts_peaks_and_status_shows_budget_waits_and_errors(tmp_path):
    recipe = make_skewed_study(tmp_path / "s", small=3, big=1, small_mb=5, big_mb=30, sleep=0.0,
                               policy={"workers": 2, "memory_budget_mb": 400})
    before = cli("plan", str(recipe), cwd=recipe.parent).stdout
    assert "no peak known yet" in before and "budget 400 MB" in before
    run = cli("run", str(recipe), cwd=recipe.parent)
    assert run.returncode == 0, run.stdout + run.stderr

    status = json.loads(cli("status", str(recipe), "--json", cwd=recipe.parent).stdout)["memory"]
    assert status["budget_mb"] == 400 and status["source"] == "memory_budget_mb"
    hog = status["stages"]["hog"]
    assert hog["ran_alone"] == 1 and hog["predicted_subjects"] == 3 and hog["median_abs_error_mb"] is not None
    text = cli("status", str(recipe), cwd=recipe.parent).stdout
    assert "memory budget 400 MB" in text and "predicted vs measured: median off by" in text
    assert "1 ran alone" in text
    report = cli("report", str(recipe), "-o", str(tmp_path / "report.html"), cwd=recipe.parent)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "report.html").read_text()
    assert '<section id="memory">' in page and "budget <b>400 MB</b>" in page

    # the trace now predicts every subject; a budget under the big one's peak: it would run alone
    data = json.loads(cli("plan", str(recipe), "--json", "policy.memory_budget_mb=40", cwd=recipe.parent).stdout)
    hog = data["memory"]["hog"]
    assert hog["predicted"] == 4 and hog["over_budget"] == 1 and 30 < hog["max_mb"] < 100

    again = cli("run", str(recipe), "policy.memory_budget_mb=40", "policy.resume=false", cwd=recipe.parent)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "predicted to peak above the memory budget of 40 MB: s00" in again.stdout + again.stderr


def test_a_budget_in_mb_needs_the_process_backend_and_auto_does_not_apply_elsewhere(tmp_path):
    serial = {"backend": "serial", "workers": 1, "subject_timeout_sec": None}
    recipe = make_skewed_study(tmp_path / "s", small=1, big=0, policy={**serial, "memory_budget_mb": 2000})
    done = cli("validate", str(recipe), cwd=recipe.parent)
    assert done.returncode == 2
    assert "memory_budget_mb in MB applies to backend 'process'" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    # 'auto' (also the default) is no refusal and no warning with another backend: it just does not apply
    recipe = make_skewed_study(tmp_path / "a", small=1, big=0, policy={**serial, "memory_budget_mb": "auto"})
    done = cli("validate", str(recipe), cwd=recipe.parent)
    assert done.returncode == 0 and "memory_budget" not in done.stdout + done.stderr, done.stdout + done.stderr

"""Read commands answer about a run and say which (issue 31): the override-run read back by `results`
(with the override, with `--run`, and by default after that run), `status` after an all-failed run and
after a `run_dir` run, `habitrun.results()` paths that exist from the study folder, a collect table
through the Python API; all through the real CLI on a real study (serial backend: no worker processes)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.engine.study import run_cli

OPS = textwrap.dedent('''
    from pathlib import Path


    def scale(subject, factor=1):
        if factor == 0:
            raise ValueError(f"{subject.id}: factor 0 is broken on purpose")
        out = Path(subject.workdir) / "scaled.txt"
        out.write_text(str(int(subject.fields["n"]) * factor))
        return {"value": int(subject.fields["n"]) * factor, "file": out}


    def rows(results):
        return [{"subject": sid, "value": r["value"]} for sid, r in sorted(results.items())]
''')


def make(folder: Path) -> Path:
    folder.mkdir()
    (folder / "study_about_ops.py").write_text(OPS)
    (folder / "subjects.csv").write_text("subject_id,n\nS1,1\nS2,2\nS3,3\n")
    recipe = {"habitrun": 1, "name": "about", "subjects": {"manifest": "subjects.csv"},
              "policy": {"backend": "serial", "subject_timeout_sec": None, "auto_retry_rounds": 0},
              "stages": [{"name": "scale", "operator": "study_about_ops:scale", "params": {"factor": 1}},
                         {"name": "table", "kind": "collect", "operator": "study_about_ops:rows",
                          "needs": ["scale"]}]}
    (folder / "recipe.yaml").write_text(json.dumps(recipe))
    return folder / "recipe.yaml"


def ok(*args: str, cwd: Path, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = run_cli(*args, cwd=cwd)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def values(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {row["subject_id"]: row["value"] for row in csv.DictReader(done.stdout.splitlines())}


SPACING = "stages.scale.params.factor=3"


@pytest.fixture(scope="module")
def override_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A study run as the recipe file says (factor 1), then with an override (factor 3); the first run's id."""
    study = make(tmp_path_factory.mktemp("about") / "study").parent
    ok("run", "-q", cwd=study)
    first = json.loads(ok("status", "--json", cwd=study).stdout)["run"]["id"]
    ok("run", SPACING, "--rerun", "S1", "-q", cwd=study)  # --rerun only chose what ran: it selects no result
    return study, first


@pytest.mark.timeout(120)
def test_an_override_run_is_read_back_by_results_by_default_with_the_override_and_with_run(
        override_run: tuple[Path, str]) -> None:
    study, first = override_run
    latest = ok("results", "scale", cwd=study)  # by default: the latest run, with its override
    assert values(latest) == {"S1": "3", "S2": "6", "S3": "9"}, latest.stdout
    head = latest.stderr.splitlines()[0]
    assert head.startswith("about run ") and SPACING in head and first not in head, latest.stderr
    given = ok("results", "scale", SPACING, cwd=study)
    assert given.stdout == latest.stdout and SPACING in given.stderr.splitlines()[0]
    earlier = ok("results", "scale", "--run", first, cwd=study)
    assert values(earlier) == {"S1": "1", "S2": "2", "S3": "3"}
    assert f"about run {first} (no overrides" in earlier.stderr.splitlines()[0]
    unused = ok("results", "scale", "stages.scale.params.factor=2", cwd=study)  # no run used it: not stored
    assert unused.stdout.split() == ["subject_id", "S1", "S2", "S3"] and "no run used them" in unused.stderr

    document = json.loads(ok("status", "--json", cwd=study).stdout)
    assert document["about"] == {"run": document["run"]["id"], "overrides": [SPACING], "recipe": "as run"}
    assert document["stages"]["scale"]["done"] == 3  # the run's keys, not the recipe file's; S1 not "forced"
    shown = ok("status", cwd=study).stdout.splitlines()[0]
    assert document["run"]["id"] in shown and SPACING in shown, shown
    plan = json.loads(ok("plan", "--json", cwd=study).stdout)  # the recipe file: its factor 1 is stored too
    assert plan["about"] == {"run": None, "overrides": [], "recipe": "file"} and plan["stages"][0]["counts"]["done"] == 3
    traced = ok("trace", "--run", first, cwd=study)
    assert first in traced.stderr.splitlines()[0] and len(traced.stdout.splitlines()) == 1 + 3 + 1


@pytest.mark.timeout(120)
def test_results_paths_exist_from_the_study_folder_and_csv_cells_are_plain_paths(
        override_run: tuple[Path, str]) -> None:
    pytest.importorskip("pandas", reason="pandas is not installed (the tables extra)")
    study, _first = override_run
    ok("results", "scale", "-o", "scale.csv", cwd=study)
    with open(study / "scale.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["subject_id", "value", "file"]
    for row in rows:
        assert Path(row["file"]).is_absolute() and Path(row["file"]).read_text() == row["value"], row
    assert '"' not in (study / "scale.csv").read_text()
    code = textwrap.dedent('''
        import json, sys
        from pathlib import Path
        import habitrun
        frame = habitrun.results("recipe.yaml", "scale")
        meta = habitrun.results("recipe.yaml", "scale", meta=True)
        table = habitrun.results("recipe.yaml", "table")
        print(json.dumps({"columns": list(frame.columns), "index": frame.index.name,
                          "exist": [Path(p).exists() and Path(p).is_absolute() for p in frame["file"]],
                          "meta": list(meta.columns), "status": sorted(set(meta["status"])),
                          "table_type": type(table).__name__, "table": table.to_dict("records")}))
    ''')
    done = subprocess.run([sys.executable, "-c", code], cwd=study, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["columns"] == ["value", "file"] and got["index"] == "subject_id"
    assert got["exist"] == [True, True, True]
    assert got["meta"][:6] == ["status", "kind", "error", "duration_sec", "cpu_sec", "peak_rss_mb"]
    assert got["status"] == ["done"]
    assert got["table_type"] == "DataFrame"
    assert got["table"] == [{"subject": "S1", "value": 3}, {"subject": "S2", "value": 6}, {"subject": "S3", "value": 9}]


@pytest.mark.timeout(120)
def test_status_after_an_all_failed_override_run_lists_its_failures(tmp_path: Path) -> None:
    recipe = make(tmp_path / "study")
    study = recipe.parent
    ok("run", "-q", cwd=study)
    broken = "stages.scale.params.factor=0"
    ok("run", broken, "-q", cwd=study, code=1)
    shown = ok("status", cwd=study, code=1).stdout
    first = shown.splitlines()[0]
    assert ": failed" in first and broken in first, shown
    assert "no failed subjects" not in shown and "3 failed subject(s)" in shown, shown
    for sid in ("S1", "S2", "S3"):
        assert f"scale {sid}: exception: ValueError: {sid}: factor 0 is broken on purpose" in shown, shown
    document = json.loads(ok("status", "--json", cwd=study, code=1).stdout)
    assert document["about"]["overrides"] == [broken] and len(document["failures"]) == 3
    assert document["stages"]["scale"]["failed"] == 3
    fine = json.loads(ok("status", "--json", "stages.scale.params.factor=1", cwd=study).stdout)
    assert fine["about"] == {"run": None, "overrides": ["stages.scale.params.factor=1"], "recipe": "file"}
    assert fine["failures"] == [] and fine["stages"]["scale"]["done"] == 3 and fine["run"] is None


@pytest.mark.timeout(120)
def test_a_run_dir_run_is_the_one_status_results_trace_and_report_answer_about(tmp_path: Path) -> None:
    recipe = make(tmp_path / "study")
    study = recipe.parent
    elsewhere = tmp_path / "elsewhere"
    ok("run", f"run_dir={elsewhere}", "stages.scale.params.factor=5", "-q", cwd=study)
    assert not (study / ".habitrun" / "store").exists() and (elsewhere / "store").is_dir()
    shown = ok("status", cwd=study)
    assert "no run yet" not in shown.stdout and ": success" in shown.stdout.splitlines()[0], shown.stdout
    document = json.loads(ok("status", "--json", cwd=study).stdout)
    assert document["run"]["path"].startswith(str(elsewhere)) and document["stages"]["scale"]["done"] == 3
    assert f"run_dir={elsewhere}" in document["about"]["overrides"]
    assert values(ok("results", "scale", cwd=study)) == {"S1": "5", "S2": "10", "S3": "15"}
    assert len(ok("trace", cwd=study).stdout.splitlines()) == 1 + 3 + 1
    report = ok("report", "-o", str(tmp_path / "r.html"), cwd=study)
    assert document["run"]["id"] in report.stderr.splitlines()[0]
    assert "stages.scale.params.factor=5" in (tmp_path / "r.html").read_text()  # the run's overrides, named
    plan = json.loads(ok("plan", "--json", cwd=study).stdout)  # the recipe file alone: its own store, none yet
    assert plan["store"] is None

"""Issue 10: a result is stale when anything it was computed from changed, and only then.

Each test copies a study that has run once (tests/planner/filestudy.py), changes
one thing, and checks through the real CLI: the exact subjects and stages
`plan --json` marks stale, the reason text, and that `run` calls the operators
of exactly those (and their downstream stages).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.planner.filestudy import (
    SUBJECTS,
    habitrun,
    install_fakepkg,
    not_done,
    plan_json,
    run_calls,
    write_study,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def ran_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("template")
    write_study(folder)
    assert len(run_calls(folder)) == 10
    return folder


@pytest.fixture
def study(ran_once: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "study"
    shutil.copytree(ran_once, folder, symlinks=True)
    return folder


ALL_FEATURES = ["features s1", "features s2", "features s3"]


def test_a_copied_study_plans_all_done_and_runs_nothing(study: Path) -> None:
    assert not_done(plan_json(study)) == {}
    assert run_calls(study) == []


def test_changed_file_content_reruns_that_subject_and_what_is_downstream(study: Path) -> None:
    (study / "data" / "s1.txt").write_text("ONE")
    assert not_done(plan_json(study)) == {
        "normalise": {"s1": ["image: data/s1.txt content changed"]},
        "features": {"s1": ["image: data/s1.txt content changed", "upstream 'normalise' changed"]},
        "table": {"*": ["upstream 'features' changed"]},
    }
    reason = habitrun(study, "plan", "recipe.yaml", "--reason").stdout
    assert "stale (image: data/s1.txt content changed): 1" in reason
    assert run_calls(study) == ["features s1", "normalise s1", "table *"]
    assert not_done(plan_json(study)) == {}


def test_a_changed_optional_file_is_a_change_too(study: Path) -> None:
    (study / "data" / "m1.txt").write_text("MASK")
    assert not_done(plan_json(study))["normalise"] == {"s1": ["mask: data/m1.txt content changed"]}


def test_touched_or_replaced_by_an_equal_copy_reruns_nothing(study: Path) -> None:
    image = study / "data" / "s2.txt"
    st = image.stat()
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # touch
    copy = study / "data" / "copy.tmp"
    shutil.copyfile(study / "data" / "s1.txt", copy)
    os.replace(copy, study / "data" / "s1.txt")  # same content, new inode and mtime
    assert (study / "data" / "s1.txt").stat().st_ino != st.st_ino
    assert not_done(plan_json(study)) == {}
    assert run_calls(study) == []


def test_a_deleted_required_file_is_an_error_naming_line_column_and_path(study: Path) -> None:
    (study / "data" / "s2.txt").unlink()
    for command in ("plan", "validate", "run"):
        done = habitrun(study, command, "recipe.yaml")
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "subjects.csv:3: image: subject 's2': data/s2.txt does not exist" in done.stdout + done.stderr


def test_an_empty_required_cell_is_an_error_an_empty_optional_one_is_not(study: Path) -> None:
    manifest = study / "subjects.csv"
    manifest.write_text(manifest.read_text().replace("s3,data/s3,,62", "s3,,,62"))
    done = habitrun(study, "plan", "recipe.yaml")
    assert done.returncode == 2
    assert "subjects.csv:4: image: subject 's3': no file given (the column is required" in done.stdout + done.stderr
    assert "mask" not in done.stdout + done.stderr  # s2 and s3 have no mask: optional


def test_several_files_in_one_cell(study: Path) -> None:
    manifest = study / "subjects.csv"
    (study / "data" / "m2.txt").write_text("m2")
    manifest.write_text(manifest.read_text().replace("s2,data/s2.txt,,61", "s2,data/s2.txt,data/m1.txt;data/m2.txt,61"))
    assert not_done(plan_json(study))["normalise"] == {"s2": ["mask: data/m1.txt added", "mask: data/m2.txt added",
                                                             "manifest row changed: mask \"\" → data/m1.txt;data/m2.txt"]}
    assert run_calls(study) == ["features s2", "normalise s2", "table *"]
    (study / "data" / "m2.txt").write_text("M2")
    assert not_done(plan_json(study))["normalise"] == {"s2": ["mask: data/m2.txt content changed"]}


def test_a_folder_input_that_gains_a_file_reruns_its_subject(study: Path) -> None:
    (study / "data" / "s3" / "sub").mkdir()
    (study / "data" / "s3" / "sub" / "c.txt").write_text("ccc")
    stale = not_done(plan_json(study))
    assert stale["normalise"] == {"s3": ["image: data/s3/ content changed"]}
    assert set(stale) == {"normalise", "features", "table"} and list(stale["features"]) == ["s3"]
    assert run_calls(study) == ["features s3", "normalise s3", "table *"]


def test_a_helper_two_imports_deep_changes_its_stages_keys(study: Path) -> None:
    core = study / "study_ops" / "deep" / "core.py"
    core.write_text(core.read_text().replace("n * 2", "n * 3"))
    stale = not_done(plan_json(study))
    assert stale["normalise"] == dict.fromkeys(SUBJECTS, ["code: study_ops/deep/core.py changed"])
    assert stale["features"] == dict.fromkeys(SUBJECTS, ["upstream 'normalise' changed"])
    assert set(stale) == {"normalise", "features", "table"}  # demographics imports no helper
    reason = habitrun(study, "plan", "recipe.yaml", "--reason").stdout
    assert "stale (code: study_ops/deep/core.py changed): 3" in reason
    assert run_calls(study) == [*ALL_FEATURES, "normalise s1", "normalise s2", "normalise s3", "table *"]


def test_comments_docstrings_and_blank_lines_change_nothing(study: Path) -> None:
    core = study / "study_ops" / "deep" / "core.py"
    core.write_text('"""Core arithmetic, documented better."""\n# a comment\n\n\ndef weight(n):\n'
                    '    """Twice n."""\n    return n * 2  # doubled\n')
    assert not_done(plan_json(study)) == {}
    assert run_calls(study) == []


def test_bumping_code_version_reruns_that_stage_only(study: Path) -> None:
    recipe = study / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace('code_version: "1"', 'code_version: "2"'))
    assert not_done(plan_json(study)) == {"demographics": dict.fromkeys(SUBJECTS, ["code_version: 1 → 2"])}
    # with code_version pinned, an edit of the module does not count
    demo = study / "study_ops" / "demo.py"
    demo.write_text(demo.read_text().replace("// 10", "// 5"))
    assert set(not_done(plan_json(study))) == {"demographics"}
    assert run_calls(study) == ["demographics s1", "demographics s2", "demographics s3"]


def test_a_declared_stage_input_that_changes_reruns_the_stage_for_every_subject(study: Path) -> None:
    (study / "atlas" / "lung.txt").write_text("lung atlas v2")
    stale = not_done(plan_json(study))
    assert stale == {"features": dict.fromkeys(SUBJECTS, ["input atlas/lung.txt changed"]),
                     "table": {"*": ["upstream 'features' changed"]}}
    assert run_calls(study) == [*ALL_FEATURES, "table *"]
    (study / "atlas" / "extra.txt").write_text("more")  # the glob matches one more file
    assert not_done(plan_json(study))["features"] == dict.fromkeys(SUBJECTS, ["input atlas/extra.txt added"])


def test_a_declared_input_that_is_missing_is_an_error_at_its_recipe_line(study: Path) -> None:
    recipe = study / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("inputs: [atlas/*.txt]", "inputs: [atlas/heart.nii]"))
    done = habitrun(study, "validate", "recipe.yaml")
    assert done.returncode == 2
    assert "recipe.yaml:9:" in done.stdout + done.stderr and "atlas/heart.nii does not exist" in done.stdout + done.stderr


def test_a_package_version_change_is_reported_and_reruns_only_when_asked(study: Path) -> None:
    install_fakepkg(study / "site", "2.0")
    plan = plan_json(study)
    assert not_done(plan) == {}
    features = next(s for s in plan["stages"] if s["name"] == "features")
    assert features["packages_changed"] == ["fakepkg 1.0 → 2.0"]
    shown = habitrun(study, "plan", "recipe.yaml").stdout
    assert "packages features: fakepkg 1.0 → 2.0 since these results" in shown
    assert "fakepkg 1.0 → 2.0" in habitrun(study, "status", "recipe.yaml").stdout
    assert run_calls(study) == []

    recipe = study / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("subject_timeout_sec: null}", "subject_timeout_sec: null, rerun_on_package_change: true}"))
    assert run_calls(study) == [*ALL_FEATURES, "table *"]  # the versions are now in the keys
    install_fakepkg(study / "site", "3.0")
    assert not_done(plan_json(study)) == {"features": dict.fromkeys(SUBJECTS, ["packages: fakepkg 2.0 → 3.0"]),
                                          "table": {"*": ["upstream 'features' changed"]}}
    assert run_calls(study) == [*ALL_FEATURES, "table *"]


def test_a_stage_listing_its_fields_ignores_other_columns(study: Path) -> None:
    manifest = study / "subjects.csv"
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join([lines[0] + ",qc_note"] + [line + "," for line in lines[1:]]) + "\n")
    stale = not_done(plan_json(study))
    assert "demographics" not in stale
    assert stale["normalise"]["s1"] == ["manifest row changed: qc_note added (\"\")"]
    assert run_calls(study) == [*ALL_FEATURES, "normalise s1", "normalise s2", "normalise s3", "table *"]
    manifest.write_text(manifest.read_text().replace("62,", "62,looks fine").replace(",61,", ",63,"))
    stale = not_done(plan_json(study))
    assert stale["demographics"] == {"s2": ["manifest row changed: age 61 → 63"]}
    assert set(stale["normalise"]) == {"s2", "s3"}


def test_a_field_the_manifest_lacks_is_an_error(study: Path) -> None:
    recipe = study / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("fields: [age]", "fields: [agee]"))
    done = habitrun(study, "plan", "recipe.yaml")
    assert done.returncode == 2 and "column 'agee' is not in the manifest" in done.stdout + done.stderr


def test_standard_trusts_an_unchanged_stat_deep_reads_everything(study: Path) -> None:
    assert not_done(plan_json(study)) == {}
    assert run_calls(study) == []  # a run (plan is read-only) stores the digests of this copy's files
    image = study / "data" / "s2.txt"
    st = image.stat()
    image.write_text("TWO TWO")  # same size, and the old mtime back: only reading shows it
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not_done(plan_json(study)) == {}
    assert not_done(plan_json(study, "policy.cache=deep"))["normalise"] == {"s2": ["image: data/s2.txt content changed"]}
    assert run_calls(study, "policy.cache=deep") == ["features s2", "normalise s2", "table *"]


def test_lenient_counts_path_and_size_only(study: Path) -> None:
    lenient = "policy.cache=lenient"
    assert not_done(plan_json(study, lenient))["normalise"]["s1"] == [
        "image: cache mode changed (lenient)", "mask: cache mode changed (lenient)"]
    run_calls(study, lenient)
    (study / "data" / "s1.txt").write_text("ONE")  # same size
    assert not_done(plan_json(study, lenient)) == {}
    (study / "data" / "s1.txt").write_text("ONE!")
    assert not_done(plan_json(study, lenient))["normalise"] == {"s1": ["image: data/s1.txt size changed"]}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_an_unreadable_file_is_an_error(study: Path) -> None:
    (study / "data" / "s1.txt").write_text("changed")
    (study / "data" / "s1.txt").chmod(0)
    done = habitrun(study, "plan", "recipe.yaml")
    assert done.returncode == 2 and "data/s1.txt cannot be read (permission denied)" in done.stdout + done.stderr


def test_a_stage_whose_fields_are_file_columns_ignores_the_other_columns(study: Path) -> None:
    only_files = "stages.normalise.fields=[image, mask]"
    assert not_done(plan_json(study, only_files))["normalise"]["s1"] == [
        "manifest columns in the key now: image, mask"]
    run_calls(study, only_files)
    manifest = study / "subjects.csv"
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join([lines[0] + ",qc"] + [line.replace(",61", ",70") + ",ok" for line in lines[1:]]) + "\n")
    stale = not_done(plan_json(study, only_files))
    assert "normalise" not in stale and set(stale["features"]) == set(SUBJECTS)  # features keys on every column
    (study / "data" / "s2.txt").write_text("changed")
    assert not_done(plan_json(study, only_files))["normalise"] == {"s2": ["image: data/s2.txt content changed"]}

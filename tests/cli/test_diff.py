"""`habitrun diff` through the real CLI: a param change, a code change, a package upgrade and a data
change between two runs are each named, and nothing else is; bad input is a usage error (exit 2).

The package is a throw-away distribution made by the test: a module and its ``.dist-info`` folder
(METADATA, RECORD, top_level.txt, as an installer leaves them) in a folder on the CLI's ``PYTHONPATH``;
its upgrade is a new version of both.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RECIPE = """\
habitrun: 1
name: diff-study
subjects: {manifest: subjects.csv, files: [image]}
policy: {backend: serial, subject_timeout_sec: null, rerun_on_package_change: true}
stages:
  - {name: feat, operator: "study_ops:features", params: {bins: 32}}
  - {name: table, kind: collect, operator: "study_ops:table", needs: [feat]}
"""

OPS = '''\
from pathlib import Path

import envlock_tinypkg


def features(subject, bins):
    return {"n": len(Path(subject.fields["image"]).read_text()) * bins, "v": envlock_tinypkg.VERSION}


def table(collection):
    return len(collection)
'''


def install_tinypkg(site: Path, version: str) -> None:
    """The distribution ``envlock-tinypkg`` at ``version`` in ``site``, replacing any other version."""
    for old in site.glob("envlock_tinypkg*"):
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    (site / "envlock_tinypkg").mkdir(parents=True)
    (site / "envlock_tinypkg" / "__init__.py").write_text(f'VERSION = "{version}"\n')
    info = site / f"envlock_tinypkg-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: envlock-tinypkg\nVersion: {version}\n\n")
    (info / "top_level.txt").write_text("envlock_tinypkg\n")
    (info / "RECORD").write_text(f"envlock_tinypkg/__init__.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


@pytest.fixture
def study(tmp_path: Path) -> Path:
    folder = tmp_path / "study"
    (folder / "data").mkdir(parents=True)
    for i in range(1, 4):
        (folder / "data" / f"s{i}.txt").write_text(f"image {i}\n")
    (folder / "subjects.csv").write_text("subject_id,image\n" + "".join(f"s{i},data/s{i}.txt\n" for i in range(1, 4)))
    (folder / "study_ops.py").write_text(OPS)
    (folder / "recipe.yaml").write_text(RECIPE)
    install_tinypkg(tmp_path / "site", "1.0")
    return folder


def cli(study: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(study.parent / "site")}
    return subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=120, check=False, cwd=study, env=env)


def run(study: Path, *overrides: str) -> None:
    done = cli(study, "run", "-q", *overrides)
    assert done.returncode == 0, done.stdout + done.stderr


def diff(study: Path) -> tuple[dict, str]:
    as_json = cli(study, "diff", "--json")
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    words = cli(study, "diff")
    assert words.returncode == 0, words.stdout + words.stderr
    return json.loads(as_json.stdout), words.stdout


def only(found: dict, *kinds: str) -> None:
    """Exactly these kinds of change are in the diff."""
    changed = {k for k in ("recipe", "overrides", "code", "packages", "habitrun", "python", "platform", "git")
               if found[k]}
    if found["data"]["changed"] or found["data"]["added"] or found["data"]["removed"]:
        changed.add("data")
    assert changed == set(kinds), found


def test_each_change_between_two_runs_is_named(study: Path) -> None:
    run(study)
    run(study, "stages.feat.params.bins=64")
    found, words = diff(study)
    only(found, "recipe", "overrides")
    assert found["recipe"] == [{"path": "stages.feat.params.bins", "a": 32, "b": 64}]
    assert found["overrides"] == {"a": [], "b": ["stages.feat.params.bins=64"]}
    assert "recipe: stages.feat.params.bins: 32 -> 64" in words
    assert "overrides: (none) -> stages.feat.params.bins=64" in words

    (study / "study_ops.py").write_text(OPS.replace("* bins", "* bins + 1"))
    run(study, "stages.feat.params.bins=64")
    found, words = diff(study)
    only(found, "code")
    assert found["code"] == [{"file": "study_ops.py", "change": "changed", "stages": ["feat", "table"]}]
    assert "code: study_ops.py changed (stages feat, table)" in words

    install_tinypkg(study.parent / "site", "2.0")
    run(study, "stages.feat.params.bins=64")
    found, words = diff(study)
    only(found, "packages")
    assert found["packages"] == [{"name": "envlock-tinypkg", "a": "1.0", "b": "2.0", "stages": ["feat", "table"]}]
    assert "package: envlock-tinypkg 1.0 -> 2.0 (used by feat, table)" in words

    (study / "data" / "s2.txt").write_text("image 2, scanned again\n")
    run(study, "stages.feat.params.bins=64")
    found, words = diff(study)
    only(found, "data")
    assert found["data"] == {"compared": 3, "changed": 1, "added": 0, "removed": 0,
                             "changed_paths": ["data/s2.txt"], "added_paths": [], "removed_paths": []}
    assert "data: 1 file(s) changed, 0 added, 0 removed (of 3)" in words
    assert "changed: data/s2.txt" in words


def test_the_environment_lock_and_per_stage_packages_are_written(study: Path) -> None:
    run(study)
    (folder,) = (study / ".habitrun" / "runs").iterdir()
    env = json.loads((folder / "environment.json").read_text())
    assert env["distributions"]["envlock-tinypkg"] == "1.0"
    import importlib.metadata as md

    assert {d.metadata["Name"] for d in md.distributions()} <= set(env["distributions"])  # what pip freeze lists
    assert env["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert env["stages"]["feat"]["files"].keys() == {"study_ops.py"}
    assert env["stages"]["feat"]["packages"] == {"envlock-tinypkg": "1.0"}
    assert env["git"]["commit"] is None and "not in a git repository" in env["git"]["status"]
    assert env["inputs"]["count"] == 3
    assert (folder / "inputs.tsv").read_text().splitlines()[1].startswith("s1\timage\tdata/s1.txt\t")
    provenance = json.loads((folder / "provenance.json").read_text())
    assert provenance["operator_packages"] == {"feat": {"envlock-tinypkg": "1.0"}, "table": {"envlock-tinypkg": "1.0"}}


def test_the_lock_names_the_commit_and_digests_each_dirty_tracked_file(study: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(study), *args], check=True, capture_output=True, text=True,
                              timeout=30).stdout.strip()

    git("init", "-q")
    (study / ".gitignore").write_text(".habitrun/\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    (study / "data" / "s1.txt").write_text("image 1, edited\n")
    run(study)
    (folder,) = (study / ".habitrun" / "runs").iterdir()
    lock = json.loads((folder / "environment.json").read_text())["git"]
    import hashlib

    assert lock["commit"] == git("rev-parse", "HEAD") and lock["status"] == "uncommitted changes"
    assert lock["dirty_files"] == {"data/s1.txt": hashlib.sha256(b"image 1, edited\n").hexdigest()}


def test_bad_input_is_a_usage_error(study: Path) -> None:
    none_yet = cli(study, "diff")
    assert none_yet.returncode == 2 and "no run yet" in none_yet.stderr, none_yet.stderr
    run(study)
    one = cli(study, "diff")
    assert one.returncode == 2, one.stdout + one.stderr
    assert "only one run" in one.stderr and "Traceback" not in one.stderr
    unknown = cli(study, "diff", "20990101-nope", "latest")
    assert unknown.returncode == 2 and "no run '20990101-nope'" in unknown.stderr, unknown.stderr
    (only_run,) = (study / ".habitrun" / "runs").iterdir()
    same = cli(study, "diff", only_run.name[:17], "latest")
    assert same.returncode == 0 and "no difference" in same.stdout, same.stdout + same.stderr

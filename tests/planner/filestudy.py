"""A small imaging-like study on disk whose operators read the files the manifest names.

``normalise`` reads each subject's ``image`` (a file, or a folder of files)
and ``mask`` through ``study_ops.util``, which imports ``study_ops.deep.core``
(a helper two levels down); ``features`` reads a declared stage input
(``atlas/lung.txt``) and imports the package ``fakepkg`` installed (a fake
distribution) in ``site/``; ``table`` collects ``features``; ``demographics``
uses only the ``age`` column and pins ``code_version``. Every operator call
appends ``<stage> <subject>`` to ``calls.txt``, so a test sees exactly what ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RECIPE = """\
habitrun: 1
name: file-study
subjects:
  manifest: subjects.csv
  files: {image: required, mask: optional}
policy: {backend: serial, subject_timeout_sec: null}
stages:
  - {name: normalise, operator: "study_ops.measure:normalise", params: {bins: 32}}
  - {name: features, operator: "study_ops.features:features", needs: [normalise], inputs: [atlas/*.txt]}
  - {name: table, kind: collect, operator: "study_ops.summary:table", needs: [features]}
  - {name: demographics, operator: "study_ops.demo:age_group", fields: [age], code_version: "1"}
"""

CALLS = """\
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def called(stage, sid):
    with open(ROOT / "calls.txt", "a") as f:
        f.write(f"{stage} {sid}\\n")
"""

CORE = '''\
"""Core arithmetic."""


def weight(n):
    return n * 2
'''

UTIL = """\
from study_ops.deep.core import weight


def size(path):
    if path.is_dir():
        return sum(weight(len(p.read_bytes())) for p in sorted(path.rglob("*")) if p.is_file())
    return weight(len(path.read_bytes()))
"""

MEASURE = """\
from study_ops.calls import ROOT, called
from study_ops.util import size


def normalise(subject, bins):
    called("normalise", subject.id)
    total = size(ROOT / subject.fields["image"])
    for mask in filter(None, subject.fields.get("mask", "").split(";")):
        total += size(ROOT / mask)
    return total % bins + bins
"""

FEATURES = """\
import fakepkg

from study_ops.calls import ROOT, called


def features(subject):
    called("features", subject.id)
    return subject.inputs["normalise"] + len((ROOT / "atlas" / "lung.txt").read_text()) + fakepkg.ONE
"""

SUMMARY = """\
from study_ops.calls import called


def table(results):
    called("table", "*")
    return dict(sorted(results.items()))
"""

DEMO = """\
from study_ops.calls import called


def age_group(subject):
    called("demographics", subject.id)
    return int(subject.fields["age"]) // 10
"""

MANIFEST = "subject_id,image,mask,age\ns1,data/s1.txt,data/m1.txt,60\ns2,data/s2.txt,,61\ns3,data/s3,,62\n"
SUBJECTS = ["s1", "s2", "s3"]


def install_fakepkg(site: Path, version: str) -> None:
    """A fake installed distribution: the package and its dist-info (what importlib.metadata reads)."""
    for old in site.glob("fakepkg-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    (site / "fakepkg").mkdir(parents=True, exist_ok=True)
    (site / "fakepkg" / "__init__.py").write_text("ONE = 1\n")
    info = site / f"fakepkg-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakepkg\nVersion: {version}\n")
    (info / "top_level.txt").write_text("fakepkg\n")
    (info / "RECORD").write_text("")


def write_study(folder: Path) -> Path:
    ops = folder / "study_ops"
    (ops / "deep").mkdir(parents=True)
    for name, text in {"__init__.py": "", "calls.py": CALLS, "util.py": UTIL, "measure.py": MEASURE,
                       "features.py": FEATURES, "summary.py": SUMMARY, "demo.py": DEMO,
                       "deep/__init__.py": "", "deep/core.py": CORE}.items():
        (ops / name).write_text(text)
    (folder / "data" / "s3").mkdir(parents=True)
    (folder / "data" / "s1.txt").write_text("one")
    (folder / "data" / "m1.txt").write_text("mask")
    (folder / "data" / "s2.txt").write_text("two two")
    (folder / "data" / "s3" / "a.txt").write_text("a")
    (folder / "data" / "s3" / "b.txt").write_text("bb")
    (folder / "atlas").mkdir()
    (folder / "atlas" / "lung.txt").write_text("lung atlas v1")
    install_fakepkg(folder / "site", "1.0")
    (folder / "subjects.csv").write_text(MANIFEST)
    (folder / "recipe.yaml").write_text(RECIPE)
    return folder / "recipe.yaml"


def habitrun(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """The real CLI in a fresh process, with the study's fake site-packages on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder / "site"), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=folder, env=env)
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def plan_json(folder: Path, *overrides: str) -> dict:
    done = habitrun(folder, "plan", "recipe.yaml", *overrides, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def not_done(plan: dict) -> dict[str, dict[str, list[str]]]:
    """stage -> subject -> reasons, for every subject that is not done."""
    out: dict[str, dict[str, list[str]]] = {}
    for stage in plan["stages"]:
        for sid, info in stage["subjects"].items():
            if info["status"] != "done":
                out.setdefault(stage["name"], {})[sid] = info.get("reasons", [info["status"]])
    return out


def run_calls(folder: Path, *overrides: str) -> list[str]:
    """Run the study; the operator calls it made, sorted."""
    calls = folder / "calls.txt"
    calls.write_text("")
    done = habitrun(folder, "run", "recipe.yaml", *overrides)
    assert done.returncode == 0, done.stdout + done.stderr
    return sorted(calls.read_text().splitlines())

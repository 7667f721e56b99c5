"""The README's first command: `habitrun run recipes/demo/recipe.yaml` on a fresh copy of the demo.

The demo finds its 24 subjects from the NIfTI files in recipes/demo/data,
reads them with nibabel, extracts features per lesion, tabulates them and
trains a model over two ranks. The shipped files are the ones
study_ops/cohort.py writes, byte for byte.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launcher.conftest import needs_torch

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "recipes" / "demo"


def fresh_demo(tmp_path: Path) -> Path:
    """The demo as a fresh clone has it (no .habitrun, no caches)."""
    target = tmp_path / "demo"
    shutil.copytree(DEMO, target, ignore=shutil.ignore_patterns(".habitrun", "__pycache__"))
    return target


def habitrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=200)


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.torch
@needs_torch
@pytest.mark.timeout(240)
def test_the_readme_demo_runs_from_a_fresh_copy(tmp_path: Path):
    demo = fresh_demo(tmp_path)
    out = habitrun("run", "demo/recipe.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = (demo / ".habitrun/runs").iterdir()
    found = rows(run / "subjects.csv")
    assert [r["id"] for r in found] == [f"LUNG{i:03d}" for i in range(1, 25)]
    assert found[0]["ct"] == "data/LUNG001/ct.nii.gz" and found[0]["label"] == "1"  # relative: see below
    (table,) = (demo / ".habitrun/work/table/_stage").iterdir()  # one work folder per cache key
    features = rows(table / "features.csv")
    assert len(features) == 24 and {"volume_mm3", "sphericity", "entropy", "lesion_count"} <= set(features[0])
    lesions = rows(table / "lesions.csv")
    assert len(lesions) > 24 and {r["lesion"] for r in lesions} == {"1", "2"}  # satellites: per lesion
    published = demo / "results/table"  # publish: true: the table under a stable name in the study
    assert (published / "features.csv").read_bytes() == (table / "features.csv").read_bytes()
    assert sorted(json.loads((published / "index.json").read_text())["files"]) == ["features.csv", "lesions.csv"]
    (trained,) = (demo / ".habitrun/work/train/_stage").iterdir()
    metrics = json.loads((trained / "metrics.json").read_text())
    assert metrics["n_subjects"] == 24 and metrics["world_size"] == 2 and metrics["accuracy"] >= 0.75

    again = habitrun("run", "demo/recipe.yaml", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing to run: 26 subject-stage(s) already stored as done" in again.stdout

    # `cp -a` of the demo elsewhere (issue 31): its keys hold no absolute path, nothing to run there
    (tmp_path / "elsewhere").mkdir()
    subprocess.run(["cp", "-a", str(demo), str(tmp_path / "elsewhere" / "copy")], check=True, timeout=60)
    copied = habitrun("plan", "recipe.yaml", cwd=tmp_path / "elsewhere" / "copy")
    assert copied.returncode == 0 and "nothing to run: every stage is done" in copied.stdout, copied.stdout

    mask = demo / "data/LUNG007/mask.nii.gz"  # edit one subject's mask: its content enters the key
    mask.write_bytes((demo / "data/LUNG008/mask.nii.gz").read_bytes())
    plan = habitrun("plan", "demo/recipe.yaml", "--json", cwd=tmp_path)
    stale = {s["name"]: sorted(sid for sid, v in s["subjects"].items() if v["status"] != "done")
             for s in json.loads(plan.stdout)["stages"]}
    assert stale["features"] == ["LUNG007"], plan.stdout[-2000:]


def test_the_shipped_cohort_is_what_cohort_py_writes(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("demo_cohort", DEMO / "study_ops" / "cohort.py")
    assert spec is not None and spec.loader is not None
    cohort = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cohort)  # not as study_ops: other tests import their own study_ops
    write_cohort = cohort.write_cohort
    shutil.copy(DEMO / "clinical.csv", tmp_path / "clinical.csv")
    written = write_cohort(tmp_path)
    assert len(written) == 48
    for path in written:
        rel = path.relative_to(tmp_path)
        assert path.read_bytes() == (DEMO / rel).read_bytes(), f"{rel} differs from the shipped file"
    assert sum(p.stat().st_size for p in written) < 3_000_000

"""Real imaging tools as command stages: dcm2niix on DICOM series written with pydicom, MRtrix3 on its output.

These need the Debian packages dcm2niix and mrtrix3 (``.ci/run`` installs them);
without one a test is skipped, saying which.
"""

from __future__ import annotations

import filecmp
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.command.study import cli, output, results, write_study

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo"


def needs(tool: str, package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(shutil.which(tool) is None,
                              reason=f"{tool} is not installed (apt-get install -y {package}; .ci/run installs it)")


@pytest.fixture
def dicoms() -> Iterator[object]:
    """The demo's DICOM writer (study_ops/dicoms.py, with its cohort.py beside it importable)."""
    pytest.importorskip("pydicom", reason="pydicom writes the DICOM series (the dev extra installs it)")
    sys.path.insert(0, str(DEMO / "study_ops"))
    try:
        import dicoms as module

        yield module
    finally:
        sys.path.remove(str(DEMO / "study_ops"))


@needs("dcm2niix", "dcm2niix")
@pytest.mark.timeout(120)
def test_the_dicom_demo_runs_from_a_fresh_copy_on_the_files_it_ships(tmp_path: Path, dicoms: object) -> None:
    demo = tmp_path / "demo"
    shutil.copytree(DEMO, demo, ignore=shutil.ignore_patterns(".habitrun*", "__pycache__", "data"))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copy(DEMO / "clinical.csv", fresh)
    written = dicoms.write_dicom_cohort(fresh)  # type: ignore[attr-defined]
    for path in written:  # the shipped series are the ones the generator writes, byte for byte
        assert filecmp.cmp(path, demo / path.relative_to(fresh), shallow=False), path
    done = cli("run", str(demo / "dicom.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    (table,) = (demo / ".habitrun-dicom/work/table/_stage").iterdir()
    lines = (table / "features.csv").read_text().splitlines()
    assert len(lines) == 7 and "volume_mm3" in lines[0]
    plan = cli("plan", str(demo / "dicom.yaml"))
    assert plan.returncode == 0 and "nothing to run: every stage is done" in plan.stdout, plan.stdout


def _series(dicoms: object, folder: Path, sid: str, size: int) -> None:
    grid = np.indices((size, size, 8)).sum(axis=0).astype(np.int16)
    dicoms.write_series(folder / sid, sid, "ct", grid * 10 - 500)  # type: ignore[attr-defined]


@needs("dcm2niix", "dcm2niix")
@needs("mrconvert", "mrtrix3")
@pytest.mark.timeout(120)
def test_dcm2niix_then_mrtrix_and_a_corrupt_series_fails_only_its_subject(tmp_path: Path, dicoms: object) -> None:
    study = tmp_path / "study"
    for sid, size in (("good1", 16), ("good2", 24), ("broken", 16)):
        _series(dicoms, study / "dicom", sid, size)
    for path in (study / "dicom" / "broken").rglob("*.dcm"):  # a transfer cut short: every file truncated
        path.write_bytes(path.read_bytes()[:200])
    rows = [{"subject_id": sid, "dicom": f"dicom/{sid}"} for sid in ("good1", "good2", "broken")]
    recipe = write_study(study, [
        {"name": "convert", "command": ["dcm2niix", "-z", "y", "-f", "ct", "-o", "{workdir}", "{dicom}"],
         "version": ["dcm2niix", "-v"], "outputs": {"ct": "ct.nii.gz", "sidecar": "ct.json"}},
        {"name": "mif", "command": ["mrconvert", "-quiet", "{convert.ct}", "ct.mif"],
         "outputs": {"mif": "ct.mif"}, "needs": ["convert"]},
        {"name": "size", "shell": True, "command": ["mrinfo -size {mif.mif} > size.txt"],
         "outputs": {"size": "size.txt"}, "needs": ["mif"]},
    ], rows, files=["dicom"])
    done = cli("run", str(recipe))
    assert done.returncode == 1, done.stdout + done.stderr
    converted = results(recipe, "convert")
    assert converted["broken"]["status"] == "failed"
    assert "dcm2niix exited with code" in converted["broken"]["error"], converted["broken"]
    sizes = results(recipe, "size")
    assert output(recipe, sizes["good1"]["size"]).read_text().split() == ["16", "16", "8"]
    assert output(recipe, sizes["good2"]["size"]).read_text().split() == ["24", "24", "8"]
    assert sizes["broken"]["status"] != "done"
    plan = cli("plan", str(recipe), "--reason")
    assert "tool dcm2niix" not in plan.stdout  # nothing changed: no tool named

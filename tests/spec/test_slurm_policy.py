"""The slurm backend's settings in a recipe: what validate accepts, and what it refuses with the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from habitrun.spec.loader import load_recipe
from habitrun.spec.policy import slurm_time_sec
from tests.spec.conftest import BASE, make_study, run_cli

SLURM = BASE.replace("""policy:
  workers: 2
  subject_timeout_sec: 60
""", """policy:
  workers: 2
  subject_timeout_sec: 60
  backend: slurm
  slurm: {partition: cpu, time: "4:00:00", mem: 8G, setup: [module load python]}
""")


def test_a_stage_gives_its_own_resources_merged_over_the_policys(tmp_path: Path) -> None:
    text = SLURM.replace("""  - name: feat
    operator: ops:feat
""", """  - name: feat
    operator: ops:feat
    policy: {slurm: {partition: gpu, gres: "gpu:1"}}
""")
    assert text != SLURM
    loaded = load_recipe(make_study(tmp_path, text))
    feat, prep = loaded.stage_policy("feat").slurm, loaded.stage_policy("prep").slurm
    assert prep is not None and (prep.partition, prep.gres, prep.mem) == ("cpu", None, "8G")
    assert feat is not None and (feat.partition, feat.gres, feat.mem, feat.time) == ("gpu", "gpu:1", "8G", "4:00:00")
    assert feat.setup == ("module load python",)


@pytest.mark.parametrize("text", ["30", "30:00", "2:30:00", "1-12", "1-12:30", "1-12:30:00"])
def test_slurm_time_forms(text: str) -> None:
    assert slurm_time_sec(text) > 0
    assert slurm_time_sec("1-12:30:00") == 86400 + 12 * 3600 + 30 * 60
    assert slurm_time_sec("2:30:00") == 2 * 3600 + 30 * 60 and slurm_time_sec("30") == 1800


@pytest.mark.parametrize(("old", "new", "said"), [
    ('time: "4:00:00"', 'time: "four hours"', "is no SLURM time"),
    ("mem: 8G", "mem: 8G, extra: [--array=0-9]", "habitrun sets --array itself"),
    ("mem: 8G", "mem: 8G, extra: [constraint=avx2]", "give each as one sbatch option"),
    ('time: "4:00:00"', 'time: "1"', "is not longer than slurm.signal_sec"),
    ("backend: slurm", "backend: process", "the 'slurm' settings need backend 'slurm'"),
    ("mem: 8G", "mem: 8G, chunk_size: 0", "policy.slurm.chunk_size: expected an integer >= 1"),
    ("mem: 8G", "mem: 8G, partiton: gpu", "partiton"),
], ids=["time", "own-option", "not-an-option", "time-under-signal", "wrong-backend", "chunk-size", "typo"])
def test_bad_slurm_settings_are_refused_at_validate_with_exit_2(tmp_path: Path, old: str, new: str, said: str) -> None:
    text = SLURM.replace(old, new)
    assert text != SLURM
    done = run_cli("validate", str(make_study(tmp_path, text)))
    out = (done.stdout + done.stderr).replace("\n", " ")
    assert done.returncode == 2, out
    assert said in out and "Traceback" not in out, out
    assert "recipe.yaml" in out  # where it is

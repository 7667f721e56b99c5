"""``cap_workers_to_gpu_pool: true`` on a machine with no GPU warns instead of running silently (issue 32).

Through the CLI on the process backend; only the GPU's presence is faked, through ``CUDA_VISIBLE_DEVICES``
(the first thing the pool's detection reads), as the process backend's own tests do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

OPS = "import os\n\ndef gpu(subject):\n    return os.environ.get('CUDA_VISIBLE_DEVICES')\n"


def write_study(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "ops.py").write_text(OPS)
    (folder / "subjects.csv").write_text("subject_id\nS1\nS2\nS3\n")
    recipe = {"habitrun": 1, "name": "gpu", "subjects": {"manifest": "subjects.csv"},
              "policy": {"backend": "process", "workers": 2, "cap_workers_to_gpu_pool": True},
              "stages": [{"name": "a", "operator": "ops:gpu"}]}
    (folder / "recipe.yaml").write_text(json.dumps(recipe))
    return folder / "recipe.yaml"


def run(recipe: Path, visible: str, *args: str) -> str:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible, "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "run", str(recipe), *args],
                          capture_output=True, text=True, timeout=90, cwd=recipe.parent, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in out, out
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("quiet", [False, True])
def test_no_gpu_found_is_a_warning(tmp_path: Path, quiet: bool) -> None:
    out = run(write_study(tmp_path / "s"), "-1", *(("--quiet",) if quiet else ()))
    assert ("warning: cap_workers_to_gpu_pool is true but no GPU was detected (CUDA_VISIBLE_DEVICES='-1' names "
            "none): 2 worker(s) run uncapped, none pinned to a GPU") in out, out
    assert out.count("cap_workers_to_gpu_pool") == 1


@pytest.mark.timeout(120)
def test_a_gpu_found_says_nothing(tmp_path: Path) -> None:
    out = run(write_study(tmp_path / "s"), "0")
    assert "cap_workers_to_gpu_pool" not in out and "warning" not in out, out

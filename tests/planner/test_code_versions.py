"""The code fingerprint is the same on every supported Python (issue 31).

``ast.dump`` changed between 3.11 and 3.12/3.13, so a study planned by a colleague on
another Python saw every stage stale. A fixed study module (data/code_versions: classes,
async code, f-strings with nested format specs, match, walrus, lambdas, positional-only
and keyword-only arguments) is fingerprinted by each interpreter from 3.10 to 3.13 (the
CI matrix's venvs ``.ci-venv-3.X`` when present, else pyenv's), and they must agree.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from habitrun.planner.code import code_info

STUDY = Path(__file__).parent / "data" / "code_versions"
CHECKOUT = Path(__file__).resolve().parents[2]

# Runs under a bare interpreter: habitrun.planner's __init__ (the store, diskcache) is not
# imported, only the module that fingerprints code and what it imports.
CHILD = """
import json, sys, types
checkout, study = sys.argv[1], sys.argv[2]
sys.path.insert(0, checkout)
pkg = types.ModuleType("habitrun.planner")
pkg.__path__ = [checkout + "/habitrun/planner"]
sys.modules["habitrun.planner"] = pkg
from habitrun.planner.code import code_info
info = code_info("ops.main:op", [study])
print(json.dumps({"fingerprint": info.fingerprint, "modules": info.modules, "legacy": info.legacy}))
"""


def interpreter(version: str) -> str | None:
    """The matrix venv's python for ``version`` in this checkout, else pyenv's; None when absent."""
    venv = CHECKOUT / f".ci-venv-{version}" / "bin" / "python"
    if venv.exists():
        return str(venv)
    pyenv = shutil.which("pyenv")
    root = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30).stdout.strip() if pyenv else ""
    root = root or os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"))
    return found[-1] if found else shutil.which(f"python{version}")


def fingerprint_with(python: str) -> dict:
    done = subprocess.run([python, "-c", CHILD, str(CHECKOUT), str(STUDY)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13"])
def test_every_python_gives_the_fingerprint_of_this_one(version: str) -> None:
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} interpreter here (neither .ci-venv-{version} nor pyenv's)")
    here = code_info("ops.main:op", [str(STUDY)])
    there = fingerprint_with(python)
    assert there["fingerprint"] == here.fingerprint, f"Python {version} fingerprints the study differently"
    assert there["modules"] == here.modules
    assert here.fingerprint.startswith("tree:")


def test_the_old_dump_form_did_differ_between_versions() -> None:
    """What the fix is for: ``ast.dump`` (kept only to find stores written before issue 31)
    gives 3.11 and 3.13 different digests of this study."""
    old = {v: interpreter(v) for v in ("3.11", "3.13")}
    if None in old.values():
        pytest.skip("Python 3.11 or 3.13 is not here")
    legacy = {v: fingerprint_with(p)["legacy"] for v, p in old.items()}  # type: ignore[arg-type]
    assert legacy["3.11"] != legacy["3.13"]
    assert sys.version_info[:2] not in ((3, 11), (3, 13)) or code_info("ops.main:op", [str(STUDY)]).legacy in legacy.values()

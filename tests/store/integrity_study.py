"""A small study whose results name files in their work folders, for the store's end-to-end tests.

``feat`` (map) writes ``features.txt`` (its bins and a salt read from
``salt.txt``, which no key covers: changing it and forcing a rerun gives a
different result under the same key) and returns its path, plus a payload
large enough to be spilled to a file for subjects listed in ``big.txt``;
``table`` (collect) reads every subject's file; ``post`` (map) reads its
subject's file too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RECIPE = """\
habitrun: 1
name: integrity-study
subjects: {manifest: subjects.csv}
policy: {backend: serial, subject_timeout_sec: null}
stages:
  - {name: feat, operator: "study_ops:features", params: {bins: 32}}
  - {name: table, kind: collect, operator: "study_ops:table", needs: [feat]}
  - {name: post, operator: "study_ops:post", needs: [feat], params: {factor: 1}}
"""

OPS = '''\
from pathlib import Path

HERE = Path(__file__).parent


def features(subject, bins):
    salt = (HERE / "salt.txt").read_text().strip()
    out = subject.workdir / "features.txt"
    out.write_text(f"bins={bins} x={subject.fields['x']} salt={salt}")
    big = subject.id in (HERE / "big.txt").read_text().split()
    return {"file": str(out), "salt": salt, "payload": "p" * (50_000 if big else 10)}


def table(collection):
    return {sid: Path(r["file"]).read_text() for sid, r in collection.items()}


def post(subject, factor):
    feat = subject.inputs["feat"]
    return f"{factor}:" + Path(feat["file"]).read_text() + ":" + feat["salt"]
'''


def write_study(folder: Path, n: int = 3, big: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study_ops.py").write_text(OPS)
    (folder / "salt.txt").write_text("one\n")
    (folder / "big.txt").write_text(big + "\n")
    rows = "\n".join(f"s{i},{i}" for i in range(1, n + 1))
    (folder / "subjects.csv").write_text("subject_id,x\n" + rows + "\n")
    (folder / "recipe.yaml").write_text(RECIPE)
    return folder / "recipe.yaml"


def habitrun(*args: str, cwd: Path, code: int | None = 0) -> subprocess.CompletedProcess:
    """Run the CLI in a real process; no traceback ever, and the exit code asked for."""
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out
    if code is not None:
        assert done.returncode == code, out
    return done

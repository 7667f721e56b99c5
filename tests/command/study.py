"""A small study of command stages on disk, and the CLI run on it as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml


def write_study(root: Path, stages: list[dict[str, Any]], rows: list[dict[str, Any]], *,
                policy: dict[str, Any] | None = None, files: list[str] | None = None) -> Path:
    """A recipe and its manifest in ``root``; the recipe's path."""
    root.mkdir(parents=True, exist_ok=True)
    cols = list(rows[0])
    lines = [",".join(cols)] + [",".join(str(r[c]) for c in cols) for r in rows]
    (root / "subjects.csv").write_text("\n".join(lines) + "\n")
    subjects: dict[str, Any] = {"manifest": "subjects.csv"}
    if files:
        subjects["files"] = files
    recipe = {"habitrun": 1, "name": "tools", "subjects": subjects,
              "policy": {"backend": "process", "workers": 2, "subject_timeout_sec": 60,
                         "auto_retry_rounds": 0, **(policy or {})},
              "stages": stages}
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def script(folder: Path, name: str, body: str) -> Path:
    """An executable shell script ``folder/name``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body).lstrip())
    path.chmod(0o755)
    return path


def cli(*args: str, path_first: Path | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``habitrun ARGS`` as a user runs it (``path_first`` put first on PATH)."""
    env = dict(os.environ)
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=env, stdin=subprocess.DEVNULL)


def results(recipe: Path, stage: str, path_first: Path | None = None) -> dict[str, dict[str, Any]]:
    """``habitrun results STAGE --meta -o x.jsonl``: subject -> its row (result columns, status, error, costs)."""
    out = recipe.parent / f"{stage}-results.jsonl"
    done = cli("results", str(recipe), stage, "--meta", "-o", str(out), path_first=path_first)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {row["subject_id"]: row for row in rows}


def trace(recipe: Path, stage: str) -> dict[str, dict[str, Any]]:
    """The last trace row of each subject of ``stage``."""
    out = recipe.parent / f"{stage}-trace.jsonl"
    done = cli("trace", str(recipe), "--stage", stage, "-o", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {row["subject"]: row for row in rows}


def output(recipe: Path, shown: str) -> Path:
    """A path ``results`` shows (relative to the run folder root, ``.habitrun``, when under it)."""
    path = Path(shown)
    return path if path.is_absolute() else recipe.parent / ".habitrun" / path
